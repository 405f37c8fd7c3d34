"""A maintainer's week on the real pinned tree, each step the README's own command, none with --force.

A copy of this project (its pyproject, tasks, noxfile and queue, in a git repository of its own
under ``.deps/e2e/week``) whose upstream is a local mirror (``git clone --mirror``: no network)
of the real llama.cpp test-bed, pinned to the tree llama-cpp-python 0.3.35 vendors (the
project's own pin's tree), with one more upstream commit on top that reworks a line.

1. ``invoke prepare``; amend a core patch with ``git commit --fixup`` + ``git rebase -i
   --autosquash`` (on the line the upstream commit reworks); ``nox -s build-cpu --
   --workdir-as-is``; ``invoke regenerate`` (no branch names); ``invoke prepare`` takes the
   workdir as prepared; ``invoke check``;
2. a conflict rehearsal against that upstream commit: ``invoke prepare --sha X`` stops; resolve,
   ``git add``, ``invoke prepare --continue``; ``nox -s build-cpu`` refuses and the resolution
   survives; the commands the run printed next (``invoke regenerate``, ``invoke pin-bump --sha
   X``) are run as printed, and the pin move recompiles what moved, not the library;
3. ``git status`` of the project shows exactly the changed patches, the pin and the reference;
4. one more upstream commit that changes only the README: the pin move compiles at most 2 objects.

(The copy keeps its queue in ``queue/`` rather than ``skippy/llama_cpp``: a folder named ``skippy``
beside its noxfile would shadow the installed package.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.queue import workdir as wd
from tooling.testbed import LlamaTestbed

ROOT = Path(__file__).resolve().parents[2]
WEEK = ROOT / ".deps" / "e2e" / "week"
NOTE = "skippy week: a downstream note"
UPSTREAM_NOTE = "upstream: reworked"
#: a C++ file no patch of the queue touches, and the first line of it the week edits
FILE = "src/llama-sampler.cpp"


def user_env() -> dict[str, str]:
    """The maintainer's shell: not CI (a conflict stops for them), a git identity of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_", "NOX_"))}
    env.pop("CI", None)
    env.pop("GITHUB_ACTIONS", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", os.defpath)
    env.update(
        {
            "GIT_AUTHOR_NAME": "Week Maintainer",
            "GIT_AUTHOR_EMAIL": "week@example.invalid",
            "GIT_COMMITTER_NAME": "Week Maintainer",
            "GIT_COMMITTER_EMAIL": "week@example.invalid",
            "GIT_CONFIG_NOSYSTEM": "1",
        }
    )
    return env


def git(cwd: Path, *args: str) -> str:
    argv = ["git", "-C", str(cwd), *args]
    return subprocess.run(argv, env=user_env(), capture_output=True, text=True, check=True).stdout


def run(command: str, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """A command as the README (or skippy's own output) writes it, run in the project."""
    words = shlex.split(command)
    assert words[0] in ("invoke", "nox"), command
    argv = [sys.executable, "-m", words[0], *words[1:]]
    result = subprocess.run(argv, cwd=WEEK, env=user_env(), capture_output=True, text=True, timeout=3000, check=False)
    if ok:
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result


def printed_commands(text: str) -> list[str]:
    """The commands in backticks on skippy's `next:` lines and notes, as printed."""
    return [c for c in re.findall(r"`([^`]+)`", text) if c.startswith(("invoke ", "nox "))]


def stamp(workdir: Path) -> wd.Stamp:
    found = wd.read_stamp(workdir / ".git")
    assert found is not None
    return found


def edited_line(text: str) -> int:
    """The first line of ``text`` a comment can be appended to (a statement's end, no comment yet)."""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.rstrip()
        if stripped.endswith(";") and "//" not in stripped and '"' not in stripped and "\\" not in stripped:
            return number
    raise AssertionError(f"no line to edit in {FILE}")


def append_to_line(path: Path, number: int, comment: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[number - 1] = lines[number - 1].rstrip("\n") + f" // {comment}\n"
    path.write_text("".join(lines), encoding="utf-8")


def make_upstream(bed: LlamaTestbed) -> tuple[str, str, int]:
    """A local mirror of the test-bed plus one upstream commit on 0.3.35 that reworks a line of
    FILE: (the pin, that commit, the line)."""
    mirror = WEEK / "upstream.git"
    shutil.rmtree(mirror, ignore_errors=True)
    git(WEEK, "clone", "--quiet", "--mirror", str(bed.path), str(mirror))
    pin = bed.commits["0.3.35"]
    work = WEEK / "upstream-work"
    shutil.rmtree(work, ignore_errors=True)
    git(WEEK, "clone", "--quiet", "--no-checkout", str(mirror), str(work))
    git(work, "checkout", "--quiet", "-B", "master", pin)
    number = edited_line((work / FILE).read_text(encoding="utf-8"))
    append_to_line(work / FILE, number, UPSTREAM_NOTE)
    git(work, "commit", "--quiet", "-am", "sampling: rework a line")
    target = git(work, "rev-parse", "HEAD").strip()
    (work / "README.md").write_text((work / "README.md").read_text(encoding="utf-8") + "\nA line.\n")
    git(work, "commit", "--quiet", "-am", "README: a line")
    git(work, "push", "--quiet", "--force", "origin", "master")
    shutil.rmtree(work)
    return pin, target, number


def make_project(bed: LlamaTestbed) -> tuple[str, str, int]:
    """The project copy (a fresh git repository each run; its .deps kept for the build dirs),
    pinned to the test-bed's 0.3.35 with the generated lane made for that pin; (pin, target, line)."""
    WEEK.mkdir(parents=True, exist_ok=True)
    for name in (".git", "queue", "pyproject.toml", "tasks.py", "noxfile.py", ".gitignore"):
        path = WEEK / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    shutil.rmtree(WEEK / ".deps" / "llama.cpp", ignore_errors=True)
    pin, target, number = make_upstream(bed)
    for name in ("tasks.py", "noxfile.py", ".gitignore"):
        shutil.copy2(ROOT / name, WEEK / name)
    shutil.copytree(ROOT / "skippy" / "llama_cpp", WEEK / "queue")
    (WEEK / ".gitignore").write_text((ROOT / ".gitignore").read_text() + "/upstream.git/\n")
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    mirror = (WEEK / "upstream.git").as_uri()
    replacements = {
        'upstream_url = "https://github.com/ggml-org/llama.cpp.git"': f'upstream_url = "{mirror}"\n'
        f'cache_dir = "{ROOT / ".deps" / "cache"}"',
        'pin_file = "skippy/llama_cpp/upstream.txt"': 'pin_file = "queue/upstream.txt"',
        'patch_dir = "skippy/llama_cpp/patches"': 'patch_dir = "queue/patches"',
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    (WEEK / "pyproject.toml").write_text(text, encoding="utf-8")
    (WEEK / "queue" / "upstream.txt").write_text(pin + "\n", encoding="utf-8")
    run("invoke generate")  # the generated lane records its pin
    git(WEEK, "init", "--quiet")
    git(WEEK, "add", "-A")
    git(WEEK, "commit", "--quiet", "-m", "the project before the week")
    return pin, target, number


def resolve_keeping_upstream(path: Path) -> None:
    """Resolve each conflict block by keeping the upstream side (drops the downstream note)."""
    text = path.read_text(encoding="utf-8")
    resolved = re.sub(r"<<<<<<< [^\n]*\n(.*?)=======\n.*?>>>>>>> [^\n]*\n", r"\1", text, flags=re.DOTALL)
    assert "<<<<<<<" not in resolved
    path.write_text(resolved, encoding="utf-8")


def compiled(output: str) -> int:
    """How many compiles a build really ran: the compiler cache's misses (a step it served is a hit)."""
    found = re.search(r"sccache \([^)]*\): (\d+) hits?, (\d+) miss", output)
    assert found, output
    return int(found[2])


@pytest.mark.timeout(5400)
def test_a_maintainers_week(testbed: LlamaTestbed) -> None:
    _pin, target, number = make_project(testbed)
    workdir = WEEK / ".deps" / "llama.cpp"
    core_patch = amend_build_regenerate_prepare(workdir, number)
    conflict_rehearsal(workdir, target)
    # --- 3. the project holds exactly the changed queue, the pin and the reference
    assert (WEEK / "queue" / "upstream.txt").read_text(encoding="utf-8") == target + "\n"
    changed = {line[3:] for line in git(WEEK, "status", "--porcelain", "--untracked-files=all").splitlines()}
    assert "queue/upstream.txt" in changed, changed
    strays = [p for p in changed if not p.startswith(("queue/patches/", "queue/reference/"))]
    assert strays == ["queue/upstream.txt"], changed
    # the resolution kept upstream's line: the core patch is what it was before the week
    assert core_patch not in changed or NOTE not in (WEEK / core_patch).read_text(encoding="utf-8")
    # --- 4. a pin move whose upstream commit changed only the README compiles the commit string's
    # unit alone (build-info.cpp; ggml.c's string is kept as given since core 0003 and 0004)
    readme_only = git(WEEK / "upstream.git", "rev-parse", "master").strip()
    moved = run(f"invoke pin-bump --sha {readme_only}")
    assert compiled(moved.stderr) <= 2, moved.stderr


def amend_build_regenerate_prepare(workdir: Path, number: int) -> str:
    """Step 1; the core patch file the amendment went into."""
    run("invoke prepare")
    base = stamp(workdir).base_commit
    assert FILE not in git(workdir, "diff", "--name-only", base, "HEAD").split(), "the queue leaves FILE alone"
    core = git(workdir, "log", "--format=%H", "--grep=^Skippy-Patch: core/0001-", base + "..HEAD").split()
    assert len(core) == 1, "the trailer names the core patch's commit"
    commits = len(git(workdir, "log", "--format=%H", base + "..HEAD").split())
    append_to_line(workdir / FILE, number, NOTE)
    git(workdir, "commit", "--quiet", "-a", f"--fixup={core[0]}")
    subprocess.run(
        ["git", "-C", str(workdir), "rebase", "--quiet", "-i", "--autosquash", base],
        env={**user_env(), "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
        capture_output=True,
    )
    assert len(git(workdir, "log", "--format=%H", base + "..HEAD").split()) == commits, "squashed into its patch"
    built = run("nox -s build-cpu -- --workdir-as-is")
    assert "AS IT STANDS" in built.stderr, built.stderr

    regenerated = run("invoke regenerate")
    assert f"read from the workdir's history: {commits} commit(s)" in regenerated.stdout, regenerated.stdout
    changed = set(git(WEEK, "diff", "--name-only").split())
    core_patch = next(p for p in changed if re.match(r"queue/patches/0001-", p))
    text = (WEEK / core_patch).read_text(encoding="utf-8")
    assert NOTE in text and "Skippy-Patch" not in text
    assert changed <= {core_patch, "queue/patches/generated/inputs.sha256"}, changed
    head_before = git(workdir, "rev-parse", "HEAD").strip()
    mtime = (workdir / FILE).stat().st_mtime_ns
    adopted = run("invoke prepare --json")
    assert json.loads(adopted.stdout)["action"] == "adopted", adopted.stdout + adopted.stderr
    assert (workdir / FILE).stat().st_mtime_ns == mtime, "no file rewritten"
    assert git(workdir, "rev-parse", "HEAD^{tree}") == git(workdir, "rev-parse", f"{head_before}^{{tree}}")
    assert json.loads(run("invoke prepare --json").stdout)["action"] == "noop"
    run("invoke check")
    git(WEEK, "commit", "--quiet", "-am", "queue: a note on a sampling line")
    return core_patch


def conflict_rehearsal(workdir: Path, target: str) -> None:
    """Step 2: stop, resolve, continue, the build refuses, the printed commands carry it and move the pin."""
    stopped = run(f"invoke prepare --sha {target}", ok=False)
    assert stopped.returncode != 0 and "invoke prepare --continue" in stopped.stderr, stopped.stderr
    assert f"conflicts in {FILE}" in stopped.stderr, stopped.stderr
    conflicted = git(workdir, "diff", "--name-only", "--diff-filter=U").split()
    assert conflicted == [FILE]
    resolve_keeping_upstream(workdir / FILE)
    git(workdir, "add", FILE)
    resumed = run("invoke prepare --continue")
    printed = printed_commands(resumed.stderr)
    carry = list(dict.fromkeys(c for c in printed if c == "invoke regenerate" or c.startswith("invoke pin-bump")))
    assert carry == ["invoke regenerate", f"invoke pin-bump --sha {target}"], resumed.stderr
    resolved_head = git(workdir, "rev-parse", "HEAD").strip()
    resolved_text = (workdir / FILE).read_text(encoding="utf-8")
    assert NOTE not in resolved_text and UPSTREAM_NOTE in resolved_text
    status = run("invoke status").stdout
    assert "not in the queue" in status, status

    refused = run("nox -s build-cpu", ok=False)
    assert refused.returncode != 0
    assert "not in the queue" in refused.stderr and "nox -s build-cpu -- --workdir-as-is" in refused.stderr
    assert git(workdir, "rev-parse", "HEAD").strip() == resolved_head, "the resolution survives"
    assert (workdir / FILE).read_text(encoding="utf-8") == resolved_text

    run(carry[0])  # invoke regenerate
    moved = run(carry[1])  # invoke pin-bump --sha X, as printed
    assert stamp(workdir).upstream_sha == target
    # the upstream commit changed one line of one file: that object and the commit strings'
    # (build-info.cpp, ggml.c) are all a pin move compiles, not the 190 objects that named the commit
    assert compiled(moved.stderr) <= 3, moved.stderr
