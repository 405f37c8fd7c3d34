"""A skippy run SIGKILLed while `git worktree add` makes its temporary worktree leaves git's entry
of it locked ("initializing"), which `git worktree prune` never prunes: they piled up, one per
kill. The next command's sweep removes skippy's own entries, locked or not, and never touches a
worktree of the user's (locked, or locked with its folder gone)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skippy.cli.entries import prepare_main, status_main
from skippy.queue import workdir as wd
from skippy.queue.leftovers import in_use
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration

#: `invoke triage` (it makes a temporary worktree of the pin), as a user runs it
TRIAGE = """
import os, sys
from pathlib import Path
from skippy.cli.entries import triage_main
sys.exit(triage_main(os.environ, root=Path(sys.argv[1])))
"""

#: files in the pinned tree (the worktree skippy makes checks them all out)
MANY_FILES = 300


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def big_pin(project: Project) -> str:
    """An upstream commit with many files, pinned, and a queue of one patch on it."""
    up = project.upstream
    for d in range(MANY_FILES // 100):
        folder = up.path / "ggml" / f"d{d:02d}"
        folder.mkdir(parents=True)
        for f in range(100):
            (folder / f"f{f:03d}.c").write_text(f"// {d} {f}\n" * 20)
    git(up.path, "add", "--", "ggml", env=up.env)
    git(up.path, "commit", "--quiet", "-m", "many files", env=up.env)
    pin = git(up.path, "rev-parse", "HEAD", env=up.env).strip()
    project.pin(pin)
    project.add_patch("core", "0001-core-a.patch", project.patch(pin, "core: a", {"src/a.h": "a\n"}))
    return pin


def entries(wdir: Path) -> dict[str, str]:
    """git's linked worktree entries: path -> lock line ('' when not locked)."""
    out: dict[str, str] = {}
    path = ""
    for line in run_git(wdir, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            path = line.removeprefix("worktree ")
            out[path] = ""
        elif line.startswith("locked"):
            out[path] = line
    out.pop(str(wdir), None)
    return out


#: a `git` first on the run's PATH: its `worktree add` is the real one, left locked "initializing"
#: as a kill inside it leaves it; then it says so and waits (the run is SIGKILLed right there)
GIT_WRAPPER = """#!/bin/sh
prev=""; hit=""
for a in "$@"; do
    shift
    if [ "$prev" = worktree ] && [ "$a" = add ]; then
        set -- "$@" add --lock --reason initializing; hit=1
    else
        set -- "$@" "$a"
    fi
    prev="$a"
done
[ -n "$hit" ] || exec {real} "$@"
{real} "$@" || exit $?
touch {ready}
exec sleep 600
"""


def kill_during_worktree_add(project: Project, tmp_path: Path) -> None:
    """Run `invoke triage` and SIGKILL it inside its `git worktree add`: the real git makes the
    entry, a wrapper keeps it locked as a kill midway leaves it and holds the run there."""
    real = shutil.which("git")
    assert real is not None
    bindir, ready = tmp_path / "wrapped-bin", tmp_path / "worktree-add-reached"
    bindir.mkdir()
    wrapper = bindir / "git"
    wrapper.write_text(GIT_WRAPPER.format(real=real, ready=ready), encoding="utf-8")
    wrapper.chmod(0o755)
    env = {**os.environ, **project.env, "PATH": f"{bindir}{os.pathsep}{project.env['PATH']}"}
    child = subprocess.Popen(
        [sys.executable, "-c", TRIAGE, str(project.root)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while not ready.exists():
        assert child.poll() is None, f"the run ended ({child.returncode}) before its git worktree add"
        time.sleep(0.01)  # polling a condition, not waiting for a signal to land
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=120) == -signal.SIGKILL
    # the wrapper dies with the run (skippy's children do): nothing of it works in the folders after
    aside = wd.skippy_dir(project.workdir / ".git") / "aside"
    deadline = time.monotonic() + 60
    while in_use([*aside.glob("*"), *(project.workdir / ".git" / "worktrees").glob("*")]):
        assert time.monotonic() < deadline, "a git of the killed run kept working"
        time.sleep(0.05)


def test_a_run_killed_in_git_worktree_add_leaves_a_locked_entry_the_next_command_removes(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big_pin(project)
    assert prepare_main(project.env, root=project.root) == 0
    wdir = project.workdir
    aside = wd.skippy_dir(wdir / ".git") / "aside"
    # the user's own worktrees: one locked, one locked whose folder is gone (an unmounted disk)
    mine, away = tmp_path / "mine", tmp_path / "away"
    run_git(wdir, "worktree", "add", "--quiet", "--detach", "--lock", "--reason", "mine", str(mine))
    run_git(wdir, "worktree", "add", "--quiet", "--detach", "--lock", "--reason", "on a usb disk", str(away))
    away.rename(tmp_path / "away-unmounted")
    users = {str(mine): "locked mine", str(away): "locked on a usb disk"}
    capsys.readouterr()

    kill_during_worktree_add(project, tmp_path)
    left = entries(wdir)
    ours = {path: lock for path, lock in left.items() if Path(path).parent == aside}
    assert ours and all(lock == "locked initializing" for lock in ours.values()), left
    assert {path: lock for path, lock in left.items() if path not in ours} == users

    # the next command, whatever it is, sweeps them (and says so); the user's stay as they were
    assert status_main(project.env, root=project.root, json=True) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["workdir"] == ".deps/llama.cpp"
    assert "temporary worktrees" in captured.err and "removed" in captured.err, captured.err
    assert entries(wdir) == users
    assert not aside.exists() or not any(aside.iterdir())
    assert (mine / "README.md").is_file(), "the user's worktree is intact"
    assert not away.exists() and (tmp_path / "away-unmounted" / "README.md").is_file()
    # nothing is left for a later command to find
    assert status_main(project.env, root=project.root) == 0
    assert "temporary worktrees" not in capsys.readouterr().err
