"""Upstream's own tests through CTest: list them, run a selection, read the verdicts.

The listing is ``ctest --show-only=json-v1`` (CTest's documented machine format: each
test's name, command and properties); the verdicts come from ``--output-junit``, whose
``status`` attribute says *run*, *fail* or *notrun* for every test CTest ran, including
the fixture set-ups it adds on its own (llama.cpp's model download is one).  While CTest
runs, each test it finishes is handed on as it is printed (:class:`Finished`), so that a
run of minutes shows its progress.
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from skippy.core import proc
from skippy.core.errors import CTestError

#: the label llama.cpp's own CI runs (``ctest -L main``)
MAIN_LABEL: Final = "main"
#: lines of a failing test's output kept in a report
OUTPUT_LINES: Final = 40
#: what a test prints when it could not reach the network (llama.cpp's vocab repo clone, model
#: downloads): such a failure says nothing about the tree, so the test counts as not run
NETWORK_SIGNS: Final = re.compile(
    r"Could not resolve host|Failed to connect to|Couldn't connect to server|Temporary failure in name resolution"
    r"|Network is unreachable|Connection timed out|Could not resolve proxy"
    # llama.cpp's own words when a download it tests cannot reach its server
    r"|cannot make GET request"
)

Verdict = Literal["passed", "failed", "not run"]

#: CTest's line for a test it finished: ``3/38 Test #7: test-tokenizer-0 .....***Failed    0.12 sec``
_FINISHED: Final = re.compile(
    r"^\s*(?P<done>\d+)/(?P<total>\d+) Test\s+#\d+: (?P<name>\S+) \.*\s*(?:\*{3})?(?P<said>\S.*?)"
    r"\s+(?P<seconds>\d+(?:\.\d+)?) sec\s*$"
)


@dataclass(frozen=True)
class Finished:
    """One test CTest has just finished, as its progress line says it (not the verdict: see
    :func:`parse_junit`): ``said`` is CTest's word (Passed, Failed, Not Run, Timeout ...)."""

    done: int
    total: int
    name: str
    said: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.said == "Passed"

    def render(self) -> str:
        """``  3/38 ✗ test-tokenizer-0: failed (0.1 s)``"""
        mark = "✓" if self.passed else "✗" if self.said.startswith(("Failed", "Timeout", "Exception")) else "·"
        return f"  {self.done}/{self.total} {mark} {self.name}: {self.said.lower()} ({self.seconds:.1f} s)"


def finished(line: str) -> Finished | None:
    """The test a line of CTest's output says it finished, or None (any other line)."""
    match = _FINISHED.match(line)
    if match is None:
        return None
    return Finished(
        int(match["done"]), int(match["total"]), match["name"], match["said"].strip(), float(match["seconds"])
    )


@dataclass(frozen=True)
class Case:
    """One test as CTest declares it."""

    name: str
    #: the executable's file name (the Ninja target that builds it), "" for a script or cmake -P
    target: str
    labels: tuple[str, ...] = ()
    fixtures_required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Result:
    name: str
    verdict: Verdict
    seconds: float
    #: the last lines of what the test printed (for a failure), or why it did not run
    output: str = ""
    #: a fixture set-up CTest added by itself (e.g. a model download), not a selected test
    setup: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 3),
            "output": self.output,
            "setup": self.setup,
        }


@dataclass(frozen=True)
class Run:
    results: tuple[Result, ...]
    seconds: float

    def by_name(self) -> dict[str, Result]:
        return {r.name: r for r in self.results}


def _properties(test: Mapping[str, Any]) -> dict[str, Any]:
    return {str(p.get("name")): p.get("value") for p in test.get("properties", []) if isinstance(p, dict)}


def _as_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return (str(value),) if value else ()


def _built_here(command: Sequence[object], build_dir: Path) -> str:
    """The target that builds the test's program: its file name when the build dir holds it."""
    if not command:
        return ""
    program = Path(str(command[0]))
    try:
        program.relative_to(build_dir)
    except ValueError:
        # a script of the source tree, cmake -P, a shell: built by no target
        return ""
    return program.name


def parse_listing(text: str, build_dir: Path) -> tuple[Case, ...]:
    """``ctest --show-only=json-v1`` output -> the cases (raises ValueError on anything else)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"ctest's test list is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list):
        raise ValueError("ctest's test list has no 'tests' array")
    cases: list[Case] = []
    for test in data["tests"]:
        props = _properties(test)
        cases.append(
            Case(
                name=str(test["name"]),
                target=_built_here(test.get("command") or [], build_dir),
                labels=_as_tuple(props.get("LABELS")),
                fixtures_required=_as_tuple(props.get("FIXTURES_REQUIRED")),
            )
        )
    return tuple(cases)


def _cmake_arg(name: str) -> str:
    """A CMake argument as CTestTestfile.cmake writes a test's name and program: quoted (CMake 4)
    or bracketed, ``[=[name]=]`` (CMake 3.x); its value in group ``name`` or ``name_b``."""
    return rf'(?:"(?P<{name}>(?:[^"\\]|\\.)*)"|\[(?P<{name}_eq>=*)\[(?P<{name}_b>.*?)\](?P={name}_eq)\])'


_ADD_TEST = re.compile(rf"^add_test\({_cmake_arg('test')} {_cmake_arg('program')}", re.MULTILINE)


def declared_programs(build_dir: Path) -> dict[str, str]:
    """{test: program} from the CTestTestfile.cmake files CMake wrote at configure time.

    CTest's JSON listing leaves out the command of a test whose program is not built yet;
    these files name it from the start."""
    found: dict[str, str] = {}
    for path in sorted(build_dir.rglob("CTestTestfile.cmake")):
        for match in _ADD_TEST.finditer(path.read_text(encoding="utf-8", errors="replace")):
            test, program = (match.group(g) or match.group(f"{g}_b") or "" for g in ("test", "program"))
            found[test] = program
    return found


def list_cases(ctest: str, build_dir: Path, env: Mapping[str, str], runner: Sequence[str] = ()) -> tuple[Case, ...]:
    """Every test of a configured build dir, with the target that builds its program."""
    result = proc.run([*runner, ctest, "--show-only=json-v1"], cwd=build_dir, env=env, check=True)
    try:
        cases = parse_listing(result.stdout, build_dir)
    except ValueError as exc:
        raise CTestError(
            f"could not read the tests of {build_dir}: {exc}",
            untouched=f"{build_dir} and the source tree",
            next_step=f"run `ctest --show-only -N` in {build_dir} to see what CTest reports",
        ) from None
    programs = declared_programs(build_dir)
    return tuple(
        c if c.target or c.name not in programs else replace(c, target=_built_here([programs[c.name]], build_dir))
        for c in cases
    )


def select(cases: Iterable[Case], *, label: str = MAIN_LABEL, own_targets: Iterable[str] = ()) -> tuple[Case, ...]:
    """The cases with ``label``, plus every case built from one of ``own_targets`` (the queue's own tests)."""
    own = set(own_targets)
    return tuple(c for c in cases if label in c.labels or (c.target and c.target in own))


def _tail(text: str, lines: int = OUTPUT_LINES) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(kept)


def parse_junit(text: str, selected: Iterable[str]) -> tuple[Result, ...]:
    """CTest's JUnit file -> one result per test it ran (set-ups it added marked ``setup``)."""
    wanted = set(selected)
    root = ET.fromstring(text)  # noqa: S314 - the file our own ctest run just wrote
    results: list[Result] = []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        status = case.get("status", "")
        out = case.findtext("system-out") or ""
        skipped = case.find("skipped")
        verdict: Verdict
        network = NETWORK_SIGNS.search(out)
        if status == "run" and case.find("failure") is None:
            verdict = "passed"
        elif (status == "fail" or case.find("failure") is not None) and network:
            verdict = "not run"
            out = f"needs the network ({network.group(0)}): {_tail(out, 3)}"
        elif status == "fail" or case.find("failure") is not None:
            verdict = "failed"
        else:
            verdict = "not run"
            reason = skipped.get("message", "") if skipped is not None else status
            out = f"{reason}: {out.strip()}" if out.strip() else reason
        results.append(
            Result(
                name=name,
                verdict=verdict,
                seconds=float(case.get("time") or 0),
                output=_tail(out) if verdict != "passed" else "",
                setup=name not in wanted,
            )
        )
    return tuple(results)


def name_regex(names: Iterable[str]) -> str:
    return "^(" + "|".join(re.escape(n) for n in sorted(names)) + ")$"


def run_cases(
    ctest: str,
    build_dir: Path,
    names: Sequence[str],
    env: Mapping[str, str],
    *,
    jobs: int = 1,
    timeout: float = 600.0,
    runner: Sequence[str] = (),
    echo: Any = None,
    progress: Callable[[Finished], None] | None = None,
) -> Run:
    """Run exactly ``names`` (plus the fixture set-ups they need) and read every verdict;
    ``progress`` is told of each test as CTest finishes it."""
    junit = build_dir / "skippy-ctest.xml"
    junit.unlink(missing_ok=True)
    argv = (
        *runner,
        ctest,
        "--output-junit",
        str(junit),
        "-R",
        name_regex(names),
        "-j",
        str(max(1, jobs)),
        "--timeout",
        str(int(timeout)),
        "--no-tests=error",
    )
    start = time.monotonic()
    # CTest exits 8 when a test fails: the verdicts are in the JUnit file, read below
    on_line = None
    if progress is not None:

        def on_line(line: str) -> None:
            done = finished(line)
            if done is not None:
                progress(done)

    proc.run(argv, cwd=build_dir, env=env, check=False, echo=echo, on_line=on_line)
    seconds = time.monotonic() - start
    if not junit.is_file():
        raise CTestError(
            f"ctest wrote no results in {build_dir} (ran: {' '.join(argv)})",
            untouched=f"{build_dir} and the source tree",
            next_step=f"run `ctest -R '{name_regex(names)}'` in {build_dir} to see why",
        )
    results = parse_junit(junit.read_text(encoding="utf-8", errors="replace"), names)
    missing = sorted(set(names) - {r.name for r in results})
    if missing:
        raise CTestError(
            f"ctest ran no test named {', '.join(missing)} in {build_dir}",
            untouched=f"{build_dir} and the source tree",
            next_step=f"run `ctest -N` in {build_dir} to list the tests this tree declares",
        )
    return Run(results=results, seconds=seconds)
