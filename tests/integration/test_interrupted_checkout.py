"""A switch cut short by a real SIGKILL while real git writes a file (no stand-in): the next
prepare saves the half-written file under a backup ref and finishes the switch, saying so."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)
SIZE = 48 << 20  # git streams a blob this size to disk in small writes (core.bigFileThreshold below)
RUN = (
    "import os, sys\nfrom pathlib import Path\nfrom skippy.cli.entries import prepare_main\n"
    "sys.exit(prepare_main(os.environ, root=Path(sys.argv[1]), sha=sys.argv[2]))\n"
)


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def journaled(project: Project) -> bool:
    """The run has recorded its switch (the journal is written before git starts it)."""
    journal = wd.read_journal(project.workdir / ".git")
    return journal is not None and journal.op == "switch"


def kill_mid_write(project: Project, target: str, path: Path, old_inode: int) -> bool:
    """Run `invoke prepare --sha target` in a child; SIGKILL it once git has replaced ``path`` by a
    file it has not finished writing.  False when the switch finished before that was seen."""
    child = subprocess.Popen(
        [sys.executable, "-c", RUN, str(project.root), target],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # the run (and the git it starts) at the lowest priority: on busy cores the watcher still
        # sees the file half-written before git finishes it
        preexec_fn=lambda: os.nice(19),  # noqa: PLW1509 - nice only, before exec, no threads started
    )
    deadline = time.monotonic() + 120
    try:
        while child.poll() is None and time.monotonic() < deadline:
            try:
                st = path.stat()
            except FileNotFoundError:
                if journaled(project):  # git unlinked the old version and has not made the new one
                    child.send_signal(signal.SIGKILL)
                    child.wait()
                    return True
                continue
            if st.st_ino != old_inode and st.st_size < SIZE:
                child.send_signal(signal.SIGKILL)
                child.wait()
                return True
        return False
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_file_cut_short_by_a_killed_checkout_is_saved_and_the_switch_finished(project: Project) -> None:
    up = project.upstream
    rng = random.Random(7)  # noqa: S311 - test data, not a secret
    old_data, new_data = rng.randbytes(SIZE), rng.randbytes(SIZE)
    pin = up.commit("data: a big table", {"data/big.csv": old_data.hex()[:SIZE]})
    new = up.commit("data: the table changes", {"data/big.csv": new_data.hex()[:SIZE]})
    project.pin(pin)
    settings = project.settings()
    wdir = project.workdir
    target = wdir / "data" / "big.csv"
    for _attempt in range(12):
        prepare(settings, Target.pinned(), console=QUIET)
        run_git(wdir, "config", "core.bigFileThreshold", "64k")
        if kill_mid_write(project, new, target, target.stat().st_ino):
            break
    else:
        pytest.fail("twelve runs finished their switch before the kill could land mid-write")
    journal = wd.read_journal(wdir / ".git")
    assert journal is not None and journal.op == "switch" and journal.to_commit is not None
    existed = target.exists()
    half = target.read_bytes() if existed else b""
    assert len(half) < SIZE, "git had not finished the file (or had removed the old one only)"

    report = prepare(settings, Target.at(new), console=QUIET)
    said = next(n for n in report.notes if "held neither version" in n)
    assert "data/big.csv" in said and report.backup_ref is not None and report.backup_ref in said
    saved = subprocess.run(
        ["git", "-C", str(wdir), "cat-file", "-s", f"{report.backup_ref}:data/big.csv"],
        capture_output=True,
        text=True,
        check=False,
    )
    if existed:
        assert int(saved.stdout.strip()) == len(half), "the half-written file is what the backup holds"
    else:
        assert saved.returncode != 0, "the backup holds the tree as it was: without the file git had removed"
    assert target.read_text() == up.read("data/big.csv", new), "the switch was finished"
    assert run_git(wdir, "status", "--porcelain") == ""
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.upstream_sha == new and wd.read_journal(wdir / ".git") is None
