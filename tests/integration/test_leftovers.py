"""What a killed run leaves is told and swept by the next command; a backups folder holding a
link is no reason for a regenerate to fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.cli.entries import regenerate_main, status_main
from skippy.core.ui import Console
from skippy.queue.leftovers import marker_path
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)

#: a regenerate whose verify is killed by a real SIGKILL once its temporary worktree exists
KILLED = """
import os, signal, sys
from pathlib import Path
import skippy.maintain.regenerate as regen
from skippy.cli.entries import regenerate_main

def verify(settings, store, ms, *, console):
    aside = settings.workdir / ".git" / "skippy" / "aside" / "verify-killed"
    store.repo.git("worktree", "add", "--detach", "--quiet", str(aside), store.base)
    os.kill(os.getpid(), signal.SIGKILL)

regen._verify = verify
sys.exit(regenerate_main(os.environ, root=Path(sys.argv[1])))
"""


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_killed_regenerate_is_told_by_the_next_command_and_its_worktree_swept(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    before = files(settings.patch_dir)
    child = subprocess.run(
        [sys.executable, "-c", KILLED, str(queued_project.root)],
        env={**os.environ, **queued_project.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    aside = queued_project.workdir / ".git" / "skippy" / "aside"
    assert any(aside.iterdir()), "the killed run left its worktree"
    assert files(settings.patch_dir) != before, "the unverified lanes were written"
    assert marker_path(settings).is_file()
    # the next command, whatever it is, says so and sweeps the worktree
    assert status_main(queued_project.env, root=queued_project.root) == 0
    err = capsys.readouterr().err
    assert "a killed `invoke regenerate` left an UNVERIFIED queue in queue/patches" in err
    assert "run `invoke regenerate` again" in err and "cp -a .deps/cache/backups/patches-" in err
    assert "removed" in err and "temporary worktrees a killed run left in .deps/llama.cpp/.git/skippy/aside" in err
    assert not aside.exists() or not any(aside.iterdir())
    worktrees = subprocess.run(
        ["git", "-C", str(queued_project.workdir), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert worktrees.count("\n") == 1
    # a regenerate that ends clears it
    assert regenerate_main(queued_project.env, root=queued_project.root) == 0
    capsys.readouterr()
    assert not marker_path(settings).exists()
    assert status_main(queued_project.env, root=queued_project.root) == 0
    assert "UNVERIFIED" not in capsys.readouterr().err


def test_a_link_among_the_queue_backups_is_left_alone(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    elsewhere = tmp_path / "not-a-backup"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine\n")
    backups = settings.cache_dir / "backups"
    backups.mkdir(parents=True, exist_ok=True)
    (backups / "patches-00000000T000000Z-evil").symlink_to(elsewhere)
    for _ in range(11):  # past the number of backups kept, so pruning runs
        assert regenerate_main(queued_project.env, root=queued_project.root, json=True) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] is True
    assert (backups / "patches-00000000T000000Z-evil").is_symlink()
    assert (elsewhere / "keep.txt").read_text() == "mine\n"
    assert len([p for p in backups.iterdir() if not p.is_symlink()]) == 10
