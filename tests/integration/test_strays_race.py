"""A compile the compiler cache's daemon still runs in a stopped build's dir (skippy.core.strays):
every process of it is stopped, those it starts while being stopped too."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from skippy.core.strays import stop_strays
from tests.busy import carrying


@dataclass(frozen=True)
class Rig:
    """A build dir, a stand-in daemon named as the cache's server is (``sccache``: the daemon whose
    work is stopped), and a sleep whose command line names ``token``."""

    token: str
    build: Path
    daemon: Path
    child: Path


def rig(tmp_path: Path, kind: str) -> Rig:
    token = f"skippy-{kind}-{os.getpid()}-{tmp_path.name}"
    build = tmp_path / "build"
    build.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy("/bin/sh", bindir / "sccache")
    shutil.copy(shutil.which("sleep") or "/bin/sleep", bindir / token)
    return Rig(token, build, bindir / "sccache", bindir / token)


@contextlib.contextmanager
def daemon_running(r: Rig, compile_: str, *, then: str) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon runs ``compile_`` (``then``: ``&`` beside it, ``;`` before it goes on) and lives on,
    outside the build dir, after its compile was stopped."""
    started = subprocess.Popen(
        [str(r.daemon), "-c", f'sh -c "{compile_}" {then} while :; do sleep 1; done'],
        cwd=r.build.parent,
        start_new_session=True,
    )
    try:
        yield started
    finally:
        os.killpg(started.pid, signal.SIGKILL)
        started.wait()
        gone(r.token)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return b""


def gone(token: str) -> None:
    """Whatever still carries ``token`` (a test that failed left it starting children) is killed."""
    while carrying(token):
        subprocess.run(["pkill", "-9", "-f", token], check=False)


@pytest.mark.parametrize("on_term", ["dies", "ignores"])
def test_a_compile_that_keeps_starting_children_leaves_none_behind(tmp_path: Path, on_term: str) -> None:
    """The compile starts a child every few milliseconds, as a compiler driver starts its passes;
    one that ignores SIGTERM goes on starting them through the grace period and is then killed:
    before, the children it started after the last scan lost their parent to SIGKILL, were no longer
    the daemon's, and outlived the build."""
    r = rig(tmp_path, "strays")
    token, build, child = r.token, r.build, r.child
    trap = "trap '' TERM; " if on_term == "ignores" else ""
    compile_ = f"cd {build} && {trap}while :; do {child} 1000 & sleep 0.01; done"
    with daemon_running(r, compile_, then="&") as started:
        deadline = time.monotonic() + 30
        while len(carrying(token)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(carrying(token)) >= 3, "the compile never started its children"
        stopped = stop_strays(build, daemon="sccache", grace=0.5)
        assert stopped, "the compile was not found"
        # nothing waits here: what stop_strays stopped is gone when it returns
        assert [p for p in carrying(token) if p != started.pid] == [], "a child the compile started outlived it"
        assert started.poll() is None, "the daemon itself is left alone"


def test_a_pass_whose_compile_the_daemon_ended_is_stopped_too(tmp_path: Path) -> None:
    """The daemon (sccache's server ends the compile of a client that went away) killed the
    compile before skippy looked: its pass lost its parent and is the daemon's child no more, but
    it is still in the daemon's session, working in the build dir."""
    r = rig(tmp_path, "orphan")
    token, build, child = r.token, r.build, r.child
    ready = tmp_path / "ready"
    # the compile starts its pass and is gone at once: the pass's parent is then init (or a subreaper)
    compile_ = f"cd {build} && ({child} 1000 &) && touch {ready}"
    with daemon_running(r, compile_, then=";") as started:

        def passes() -> list[int]:  # the sleeps, not the shell that started them (it names the token too)
            return [p for p in carrying(token) if _cmdline(p).startswith(bytes(child))]

        deadline = time.monotonic() + 30
        while not (ready.exists() and passes() and len(carrying(token)) == 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        (orphan,) = passes()
        assert int(Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[1]) != started.pid
        assert stop_strays(build, daemon="sccache", grace=0.5) == [orphan]
        assert [p for p in carrying(token) if p != started.pid] == [], "the orphaned pass outlived the stop"
        assert started.poll() is None, "the daemon itself is left alone"


def test_nothing_of_skippys_own_session_is_taken_for_the_daemons(tmp_path: Path) -> None:
    """A daemon of skippy's own session (not started as a daemon): its session is skippy's, whose
    processes in the build dir (a shell the user left there) are not the daemon's."""
    r = rig(tmp_path, "own")
    build, daemon, child = r.build, r.daemon, r.child
    theirs = subprocess.Popen([str(daemon), "-c", "while :; do sleep 1; done"], cwd=tmp_path)  # our session
    users = subprocess.Popen([str(child), "1000"], cwd=build)  # our session, in the build dir, no daemon's
    try:
        assert stop_strays(build, daemon="sccache", grace=0.5) == []
        assert users.poll() is None
    finally:
        for p in (theirs, users):
            p.kill()
            p.wait()
