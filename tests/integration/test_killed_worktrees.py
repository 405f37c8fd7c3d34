"""A skippy run SIGKILLed while `git worktree add` makes its temporary worktree leaves git's entry
of it locked ("initializing"), which `git worktree prune` never prunes: they piled up, one per
kill. The next command's sweep removes skippy's own entries, locked or not, and never touches a
worktree of the user's (locked, or locked with its folder gone)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skippy.cli.app import prepare_main, status_main
from skippy.queue import workdir as wd
from skippy.queue.leftovers import in_use
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration

#: `invoke triage` (it makes a temporary worktree of the pin), as a user runs it
TRIAGE = """
import os, sys
from pathlib import Path
from skippy.cli.app import triage_main
sys.exit(triage_main(os.environ, root=Path(sys.argv[1])))
"""

#: files in the pinned tree: enough that `git worktree add` takes a while to check them out
MANY_FILES = 3000


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


def locked_aside_entry(git_dir: Path, aside: Path) -> Path | None:
    """An entry git is making under ``aside``: its admin folder holds ``locked`` and ``gitdir``."""
    for admin in (git_dir / "worktrees").glob("*"):
        try:
            home = Path((admin / "gitdir").read_text(encoding="utf-8").strip())
        except OSError:
            continue
        if (admin / "locked").is_file() and home.parent.parent == aside:
            return admin
    return None


def kill_during_worktree_add(project: Project, aside: Path) -> None:
    """Run `invoke triage` and SIGKILL it once its `git worktree add` has locked the new entry;
    again until a kill lands inside that window (a run that outruns the poll is not counted)."""
    git_dir = project.workdir / ".git"
    for _attempt in range(20):
        child = subprocess.Popen(
            [sys.executable, "-c", TRIAGE, str(project.root)],
            env={**os.environ, **project.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while child.poll() is None:
            if locked_aside_entry(git_dir, aside) is not None:
                os.kill(child.pid, signal.SIGKILL)
                break
        assert child.wait(timeout=120) in (0, 1, -signal.SIGKILL)
        # the checkout `git worktree add` started may outlive the kill for a moment: wait for it
        deadline = time.monotonic() + 60
        while in_use([*aside.glob("*"), *(git_dir / "worktrees").glob("*")]):
            assert time.monotonic() < deadline, "a git of the killed run kept working"
        if child.returncode == -signal.SIGKILL and any(
            e.endswith("initializing") for e in entries(project.workdir).values()
        ):
            return
    pytest.fail("no kill landed while `git worktree add` held its entry locked")


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

    kill_during_worktree_add(project, aside)
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
