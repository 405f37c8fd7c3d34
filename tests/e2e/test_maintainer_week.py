"""A maintainer's week on the real pinned tree, each step the README's own command, none with --force.

A copy of this project (its pyproject, tasks, noxfile and queue, in a git repository of its own
under ``.deps/e2e/week``) whose upstream does not answer: the pin and the next upstream commit
(the tree llama-cpp-python 0.3.36 vendors) come from their source archives, offline.

1. ``invoke prepare``; amend a core patch with ``git commit --fixup`` + ``git rebase -i
   --autosquash``; ``nox -s build-cpu -- --workdir-as-is``; ``invoke regenerate`` (no branch
   names); ``invoke prepare`` takes the workdir as prepared; ``invoke check``;
2. a conflict rehearsal against 0.3.36: the amended line is one upstream changed, so
   ``invoke prepare --sha X --offline`` stops; resolve, ``git add``, ``invoke prepare --continue``;
   ``nox -s build-cpu`` refuses and the resolution survives; the commands the run printed next
   (``invoke regenerate``, ``invoke pin-bump --sha X``) are run as printed;
3. ``git status`` of the project shows exactly the changed patches, the pin and the reference.

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

from skippy.core import proc
from skippy.core.git import hermetic_env
from skippy.queue import workdir as wd
from skippy.queue.testbed import LLAMA_CPP_PYTHON, LlamaTestbed

ROOT = Path(__file__).resolve().parents[2]
WEEK = ROOT / ".deps" / "e2e" / "week"
RESOLVED_MARK = "skippy week: a downstream note"
ARCHIVE = """
[tool.skippy.archives."{sha}"]
url = "pypi-sdist:llama-cpp-python=={version}"
sha256 = "{sha256}"
folder = "{folder}"
"""


def make_project(bed: LlamaTestbed) -> Path:
    """The project copy (a fresh git repository each run; its .deps kept for the build dirs)."""
    WEEK.mkdir(parents=True, exist_ok=True)
    for name in (".git", "queue", "pyproject.toml", "tasks.py", "noxfile.py", ".gitignore"):
        path = WEEK / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    shutil.rmtree(WEEK / ".deps" / "llama.cpp", ignore_errors=True)
    for name in ("tasks.py", "noxfile.py", ".gitignore"):
        shutil.copy2(ROOT / name, WEEK / name)
    # the queue beside the project, not under a folder named skippy (that would shadow the package)
    shutil.copytree(ROOT / "skippy" / "llama_cpp", WEEK / "queue")
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    # an upstream that does not answer (no network here): archives stand in; one attempt, no backoff
    text = text.replace(
        'upstream_url = "https://github.com/ggml-org/llama.cpp.git"',
        f'upstream_url = "{(WEEK / "no-upstream.git").as_uri()}"\n'
        f'cache_dir = "{ROOT / ".deps" / "cache"}"\nnetwork_attempts = 1',
    )
    text = text.replace('pin_file = "skippy/llama_cpp/upstream.txt"', 'pin_file = "queue/upstream.txt"')
    text = text.replace('patch_dir = "skippy/llama_cpp/patches"', 'patch_dir = "queue/patches"')
    assert 'pin_file = "queue/upstream.txt"' in text and 'patch_dir = "queue/patches"' in text
    later = LLAMA_CPP_PYTHON[2]
    upstream = bed.upstream["0.3.36"]
    assert upstream is not None, "the 0.3.36 sdist names its upstream commit"
    text += ARCHIVE.format(sha=upstream, version=later.version, sha256=later.sha256, folder=later.folder)
    (WEEK / "pyproject.toml").write_text(text, encoding="utf-8")
    git(WEEK, "init", "--quiet")
    git(WEEK, "add", "-A")
    git(WEEK, "commit", "--quiet", "-m", "the project before the week")
    return WEEK


def user_env() -> dict[str, str]:
    """The maintainer's shell: not CI (a conflict stops for them), a git identity of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_", "NOX_"))}
    env.pop("CI", None)
    env.pop("GITHUB_ACTIONS", None)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", os.defpath)
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
    return subprocess.run(
        ["git", "-C", str(cwd), *args], env=user_env(), capture_output=True, text=True, check=True
    ).stdout


def run(command: str, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """A command as the README (or skippy's own output) writes it, run in the project."""
    words = shlex.split(command)
    assert words[0] in ("invoke", "nox", "git"), command
    argv = [sys.executable, "-m", words[0], *words[1:]] if words[0] != "git" else words
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


def safe_changed_line(bed: LlamaTestbed, queue_files: set[str]) -> tuple[str, int]:
    """A line of a C++ file the queue does not touch that upstream changed from 0.3.35 to 0.3.36
    (appending a comment to it keeps it compiling)."""
    env = hermetic_env({"PATH": os.environ.get("PATH", os.defpath)}, bed.path.parent)
    old, new = bed.commits["0.3.35"], bed.commits["0.3.36"]
    names = proc.run(
        ["git", "-C", str(bed.path), "diff", "--name-only", old, new, "--", "src/*.cpp"], env=env
    ).stdout.split()
    for name in names:
        if name in queue_files:
            continue
        diff = proc.run(["git", "-C", str(bed.path), "diff", "-U0", old, new, "--", name], env=env).stdout
        text = proc.run(["git", "-C", str(bed.path), "show", f"{old}:{name}"], env=env).stdout.splitlines()
        for hunk in re.finditer(r"^@@ -(\d+)(?:,(\d+))? ", diff, flags=re.MULTILINE):
            if hunk[2] == "0":
                continue
            line = int(hunk[1])
            content = text[line - 1].rstrip()
            if content.endswith((";", "{", "}")) and "//" not in content and '"' not in content:
                return name, line
    raise AssertionError("no changed C++ line between 0.3.35 and 0.3.36 outside the queue")


def resolve_keeping_upstream(path: Path) -> None:
    """Resolve each conflict block by keeping the upstream side (drops the downstream note)."""
    text = path.read_text(encoding="utf-8")
    resolved = re.sub(r"<<<<<<< [^\n]*\n(.*?)=======\n.*?>>>>>>> [^\n]*\n", r"\1", text, flags=re.DOTALL)
    assert "<<<<<<<" not in resolved
    path.write_text(resolved, encoding="utf-8")


@pytest.mark.timeout(5400)
def test_a_maintainers_week(testbed: LlamaTestbed) -> None:
    root = make_project(testbed)
    workdir = root / ".deps" / "llama.cpp"
    path, core_patch = amend_build_regenerate_prepare(testbed, root, workdir)
    target = testbed.upstream["0.3.36"]
    assert target is not None
    conflict_rehearsal(workdir, path, target)
    # --- 3. the project holds exactly the changed queue, the pin and the reference
    assert (root / "queue" / "upstream.txt").read_text(encoding="utf-8") == target + "\n"
    changed = {line[3:] for line in git(root, "status", "--porcelain", "--untracked-files=all").splitlines()}
    assert "queue/upstream.txt" in changed and core_patch in changed
    strays = [p for p in changed if not p.startswith(("queue/patches/", "queue/reference/"))]
    assert strays == ["queue/upstream.txt"], changed
    assert RESOLVED_MARK not in (root / core_patch).read_text(encoding="utf-8")


def amend_build_regenerate_prepare(testbed: LlamaTestbed, root: Path, workdir: Path) -> tuple[str, str]:
    """Step 1; the amended file and the core patch file it went into."""
    run("invoke prepare")
    base = stamp(workdir).base_commit
    queue_files = set(git(workdir, "diff", "--name-only", base, "HEAD").split())
    path, line = safe_changed_line(testbed, queue_files)
    core = git(workdir, "log", "--format=%H", "--grep=^Skippy-Patch: core/0001-", base + "..HEAD").split()
    assert len(core) == 1, "the trailer names the core patch's commit"
    lines = (workdir / path).read_text(encoding="utf-8").splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].rstrip("\n") + f" // {RESOLVED_MARK}\n"
    (workdir / path).write_text("".join(lines), encoding="utf-8")
    git(workdir, "commit", "--quiet", "-a", f"--fixup={core[0]}")
    subprocess.run(
        ["git", "-C", str(workdir), "rebase", "--quiet", "-i", "--autosquash", base],
        env={**user_env(), "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
        capture_output=True,
    )
    assert len(git(workdir, "log", "--format=%H", base + "..HEAD").split()) == 7, "squashed into its patch"
    built = run("nox -s build-cpu -- --workdir-as-is")
    assert "the workdir as it stands" in built.stderr

    regenerated = run("invoke regenerate")
    assert "read from the workdir's history: 7 commit(s)" in regenerated.stdout, regenerated.stdout
    changed = set(git(root, "diff", "--name-only").split())
    core_patch = next(p for p in changed if re.match(r"queue/patches/0001-", p))
    assert RESOLVED_MARK in (root / core_patch).read_text(encoding="utf-8")
    assert "Skippy-Patch" not in (root / core_patch).read_text(encoding="utf-8")
    assert changed <= {core_patch, "queue/patches/generated/inputs.sha256"}, changed
    head_before = git(workdir, "rev-parse", "HEAD").strip()
    mtime = (workdir / path).stat().st_mtime_ns
    adopted = run("invoke prepare --json")
    assert json.loads(adopted.stdout)["action"] == "adopted", adopted.stdout + adopted.stderr
    assert (workdir / path).stat().st_mtime_ns == mtime, "no file rewritten"
    assert git(workdir, "rev-parse", "HEAD^{tree}") == git(workdir, "rev-parse", f"{head_before}^{{tree}}")
    assert json.loads(run("invoke prepare --json").stdout)["action"] == "noop"
    run("invoke check")
    return path, core_patch


def conflict_rehearsal(workdir: Path, path: str, target: str) -> None:
    """Step 2: stop, resolve, continue, the build refuses, the printed commands carry it and move the pin."""
    stopped = run(f"invoke prepare --sha {target} --offline", ok=False)
    assert stopped.returncode != 0 and "invoke prepare --continue" in stopped.stderr, stopped.stderr
    for _patch in range(20):  # resolve every stop (the amended line, and whatever else 0.3.36 moved)
        conflicted = git(workdir, "diff", "--name-only", "--diff-filter=U").split()
        assert conflicted, f"a stop without conflict markers:\n{run('invoke status', ok=False).stdout}"
        for name in conflicted:
            resolve_keeping_upstream(workdir / name)
        git(workdir, "add", *conflicted)
        resumed = run("invoke prepare --continue", ok=False)
        if resumed.returncode == 0:
            break
    else:
        pytest.fail("the session never finished")
    printed = printed_commands(resumed.stderr)
    carry = list(dict.fromkeys(c for c in printed if c == "invoke regenerate" or c.startswith("invoke pin-bump")))
    # both commits come from source archives: no history here shows the target descends from the pin
    assert carry[:2] == ["invoke regenerate", f"invoke pin-bump --sha {target} --allow-non-descendant"], resumed.stderr
    resolved_head = git(workdir, "rev-parse", "HEAD").strip()
    resolved_text = (workdir / path).read_text(encoding="utf-8")
    assert RESOLVED_MARK not in resolved_text
    status = run("invoke status").stdout
    assert "not in the queue" in status, status

    refused = run("nox -s build-cpu", ok=False)
    assert refused.returncode != 0
    assert "not in the queue" in refused.stderr and "nox -s build-cpu -- --workdir-as-is" in refused.stderr
    assert git(workdir, "rev-parse", "HEAD").strip() == resolved_head, "the resolution survives"
    assert (workdir / path).read_text(encoding="utf-8") == resolved_text

    for command in carry[:2]:  # invoke regenerate; invoke pin-bump --sha X ..., as printed
        run(command)
    assert stamp(workdir).upstream_sha == target
