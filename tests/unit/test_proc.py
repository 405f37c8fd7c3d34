"""The subprocess gate: argv lists, captured output, errors with the tail, SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from skippy.core import proc
from skippy.core.errors import CommandError, ToolchainMissing

ENV = {"PATH": os.environ.get("PATH", os.defpath)}


def test_captures_output_and_exit_code() -> None:
    result = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], env=ENV, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.tail() == "out\nerr"


def test_failure_raises_with_command_and_tail() -> None:
    with pytest.raises(CommandError) as info:
        proc.run(["sh", "-c", "echo boom >&2; exit 2"], env=ENV, what="the probe")
    err = info.value
    assert err.returncode == 2
    assert err.argv == ("sh", "-c", "echo boom >&2; exit 2")
    assert "boom" in err.render() and "exit code: 2" in err.render()


def test_arguments_are_never_a_shell_string(tmp_path: Path) -> None:
    tricky = "a b; rm -rf / $(echo no) 'q'"
    result = proc.run(["printf", "%s", tricky], env=ENV)
    assert result.stdout == tricky


def test_missing_program() -> None:
    with pytest.raises(ToolchainMissing, match="`no-such-program-skippy` was not found"):
        proc.run(["no-such-program-skippy"], env=ENV)


def test_streaming_lines_and_echo() -> None:
    lines: list[str] = []
    echoed: list[str] = []
    proc.run(["sh", "-c", "echo one; echo two"], env=ENV, on_line=lines.append, echo=echoed.append)
    assert lines == ["one", "two"]
    assert echoed == ["$ sh -c 'echo one; echo two'"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_timeout_terms_then_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"trap '' TERM; sleep 60 & echo $! > {pidfile}; wait"
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"timed out after 0\.5 s"):
        proc.run(["sh", "-c", script], env=ENV, timeout=0.5, grace=0.5)
    assert time.monotonic() - started < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the grandchild must not outlive the timeout"


def test_sigterm_inside_raises_once_and_not_while_unwinding() -> None:
    """A real SIGTERM to this process: Terminated (exit code 143) once; a second one while the
    block unwinds (stopping a child, printing the report) is ignored; the handler is put back."""
    before = signal.getsignal(signal.SIGTERM)
    unwound = False
    with pytest.raises(proc.Terminated) as info, proc.sigterm_unwinds() as unwinding:
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            signal.raise_signal(signal.SIGTERM)  # ignored: the first one is being handled
            unwound = True
    assert unwound and unwinding.terminated
    assert info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_block_inside_another_shares_it_and_finish_stops_raising() -> None:
    with proc.sigterm_unwinds() as outer:
        with proc.sigterm_unwinds() as inner:
            assert inner is outer
        outer.finish()  # the work is done: only the report is left
        signal.raise_signal(signal.SIGTERM)
        assert outer.terminated


def test_an_ignored_sigterm_stays_ignored() -> None:
    """Started with SIGTERM ignored (its starter wants it to run on): skippy keeps it so."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with proc.sigterm_unwinds() as unwinding:
            signal.raise_signal(signal.SIGTERM)
        assert not unwinding.terminated
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_output_larger_than_a_block_comes_back_whole(timeout: float | None) -> None:
    """Output is read in blocks, not lines: several blocks' worth, with multi-byte characters across
    the blocks' edges and a long line without a newline, comes back byte for byte.  With a timeout
    too (sh's own timed wait returned before its threads had read the last of it)."""
    code = "import sys; sys.stdout.write('é' * 100_000 + '\\n' + 'x' * 70_000 + 'ü' * 3)"
    result = proc.run(["python3", "-c", code], env=ENV, timeout=timeout)
    assert result.stdout == "é" * 100_000 + "\n" + "x" * 70_000 + "ü" * 3
    assert len(result.stdout.encode()) > 3 * proc._BLOCK


def test_a_child_killed_by_a_signal_has_that_signal_as_its_exit_code() -> None:
    """sh's exceptions are left on: its SignalException becomes the exit code (-N), like any other."""
    assert proc.run(["sh", "-c", "kill -9 $$"], env=ENV, check=False).returncode == -signal.SIGKILL
    with pytest.raises(CommandError, match=r"exit code -9") as info:
        proc.run(["sh", "-c", "echo last words; kill -9 $$"], env=ENV)
    assert info.value.returncode == -signal.SIGKILL
    assert "last words" in info.value.render()


def _read_pid(path: Path) -> int:
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text(encoding="utf-8").strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return int(path.read_text(encoding="utf-8"))


def test_a_spawned_child_writes_its_log_and_its_group_is_stopped(tmp_path: Path) -> None:
    """:func:`proc.spawn`'s child writes its stdout and stderr into the log itself; ``stop`` gives
    the group SIGTERM, then SIGKILL after the grace (said: it outlived it), the helper it started too."""
    pidfile, log_path = tmp_path / "helper.pid", tmp_path / "server.log"
    script = f"echo out; echo err >&2; trap '' TERM; sleep 60 & echo $! > {pidfile}; wait"
    with log_path.open("wb") as log:
        running = proc.spawn("/bin/sh", ["-c", script], env=ENV, log=log)
        helper = _read_pid(pidfile)
        assert running.alive()
        assert running.stop(grace=0.3) is True
    proc.release(running.pid)
    assert not running.alive()
    assert running.wait() == running.wait() == -signal.SIGKILL
    assert log_path.read_text(encoding="utf-8").splitlines() == ["out", "err"]
    deadline = time.monotonic() + 5
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(helper), "the helper in the child's group must go with it"


def test_a_child_that_stops_on_sigterm_is_not_killed(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    running = proc.spawn("/bin/sh", ["-c", f"echo started; echo $$ > {ready}; exec sleep 60"], env=ENV)
    _read_pid(ready)
    assert running.stop(grace=10) is False
    proc.release(running.pid)
    assert running.wait() == -signal.SIGTERM
    assert running.output() == ("started\n", "")
    done = proc.spawn("/bin/sh", ["-c", "echo no >&2; exit 3"], env=ENV)
    assert done.wait() == done.wait() == 3  # sh raises its ErrorReturnCode on the first wait only
    proc.release(done.pid)
    assert done.output() == ("", "no\n")
