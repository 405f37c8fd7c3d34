"""A compile the compiler cache's daemon still runs in a stopped build's dir (skippy.core.strays):
every process of it is stopped, those it starts while being stopped too."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from skippy.core.strays import stop_strays
from tests.busy import carrying


@pytest.mark.parametrize("on_term", ["dies", "ignores"])
def test_a_compile_that_keeps_starting_children_leaves_none_behind(tmp_path: Path, on_term: str) -> None:
    """The compile starts a child every few milliseconds, as a compiler driver starts its passes;
    one that ignores SIGTERM goes on starting them through the grace period and is then killed:
    before, the children it started after the last scan lost their parent to SIGKILL, were no longer
    the daemon's, and outlived the build."""
    token = f"skippy-strays-{os.getpid()}-{tmp_path.name}"
    build = tmp_path / "build"
    build.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    daemon = bindir / "sccache"  # named as the cache's server is: the daemon whose work is stopped
    shutil.copy("/bin/sh", daemon)
    child = bindir / token  # a sleep whose command line names the token
    shutil.copy(shutil.which("sleep") or "/bin/sleep", child)
    trap = "trap '' TERM; " if on_term == "ignores" else ""
    compile_ = f"cd {build} && {trap}while :; do {child} 1000 & sleep 0.01; done"
    # the daemon lives on (outside the build dir) after its compile was stopped
    started = subprocess.Popen(
        [str(daemon), "-c", f'sh -c "{compile_}" & while :; do sleep 1; done'], cwd=tmp_path, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while len(carrying(token)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(carrying(token)) >= 3, "the compile never started its children"
        stopped = stop_strays(build, daemon="sccache", grace=0.5)
        assert stopped, "the compile was not found"
        # nothing waits here: what stop_strays stopped is gone when it returns
        assert [p for p in carrying(token) if p != started.pid] == [], "a child the compile started outlived it"
        assert started.poll() is None, "the daemon itself is left alone"
    finally:
        os.killpg(started.pid, signal.SIGKILL)
        started.wait()
        while carrying(token):  # a compile that outlived the stop keeps starting children: until none is left
            subprocess.run(["pkill", "-9", "-f", token], check=False)


def test_a_pass_whose_compile_the_daemon_ended_is_stopped_too(tmp_path: Path) -> None:
    """The daemon (sccache's server ends the compile of a client that went away) killed the
    compile before skippy looked: its pass lost its parent and is the daemon's child no more, but
    it is still in the daemon's session, working in the build dir."""
    token = f"skippy-orphan-{os.getpid()}-{tmp_path.name}"
    build = tmp_path / "build"
    build.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    daemon = bindir / "sccache"
    shutil.copy("/bin/sh", daemon)
    child = bindir / token
    shutil.copy(shutil.which("sleep") or "/bin/sleep", child)
    ready = tmp_path / "ready"
    # the compile starts its pass and is gone at once: the pass's parent is then init (or a subreaper)
    compile_ = f"cd {build} && ({child} 1000 &) && touch {ready}"
    started = subprocess.Popen(
        [str(daemon), "-c", f'sh -c "{compile_}"; while :; do sleep 1; done'], cwd=tmp_path, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and carrying(token)) and time.monotonic() < deadline:
            time.sleep(0.01)
        (orphan,) = [p for p in carrying(token) if p != started.pid]
        assert int(Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[1]) != started.pid
        assert stop_strays(build, daemon="sccache", grace=0.5) == [orphan]
        assert [p for p in carrying(token) if p != started.pid] == [], "the orphaned pass outlived the stop"
        assert started.poll() is None, "the daemon itself is left alone"
    finally:
        os.killpg(started.pid, signal.SIGKILL)
        started.wait()
        while carrying(token):
            subprocess.run(["pkill", "-9", "-f", token], check=False)


def test_nothing_of_skippys_own_session_is_taken_for_the_daemons(tmp_path: Path) -> None:
    """A daemon of skippy's own session (not started as a daemon): its session is skippy's, whose
    processes in the build dir (a shell the user left there) are not the daemon's."""
    token = f"skippy-own-{os.getpid()}-{tmp_path.name}"
    build = tmp_path / "build"
    build.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    daemon = bindir / "sccache"
    shutil.copy("/bin/sh", daemon)
    child = bindir / token
    shutil.copy(shutil.which("sleep") or "/bin/sleep", child)
    theirs = subprocess.Popen([str(daemon), "-c", "while :; do sleep 1; done"], cwd=tmp_path)  # our session
    users = subprocess.Popen([str(child), "1000"], cwd=build)  # our session, in the build dir, no daemon's
    try:
        assert stop_strays(build, daemon="sccache", grace=0.5) == []
        assert users.poll() is None
    finally:
        for p in (theirs, users):
            p.kill()
            p.wait()
