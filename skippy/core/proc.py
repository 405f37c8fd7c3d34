"""The one gate every subprocess goes through (git, cmake, ninja, llama-server).

Commands are argument lists, never shell strings.  Output is captured (and
optionally streamed line by line for long builds); failures raise
:class:`~skippy.core.errors.CommandError` with the command, its exit code and the
tail of its output.  On timeout or Ctrl-C the child gets SIGTERM, then SIGKILL
after a grace period.

No child outlives the process that started it, even when that process is
SIGKILLed (nothing of its own runs then).  Two guards, both on by default
where they exist (:data:`GUARDS`):

* ``pdeathsig`` (Linux): every child asks the kernel for SIGTERM when its
  parent dies (``prctl(PR_SET_PDEATHSIG)`` between fork and exec, then a
  check that the parent did not die before that).  It reaches the child
  itself, at once.  SIGTERM, not SIGKILL: ninja runs each job in a process
  group of its own, which no group signal of ours reaches, and stops them
  only when it is asked to stop (a SIGKILLed ninja left its compilers
  writing into the build dir); a child that ignores SIGTERM gets SIGKILL
  from the pipe guard a second later.
* ``pipe`` (everywhere, the only one on macOS): one supervising process per
  parent holds the read end of a pipe only the parent writes to, and the
  process group of every running child; when the pipe closes (the parent
  exited or was killed) it sends SIGTERM, then SIGKILL a second later, to the
  groups still registered.  It also reaches what the child started in its
  group (ninja's compilers, a server's helpers).  The supervisor is started
  before the first child, and each child registers its own group from inside,
  between fork and exec (while it still holds the pipe): the supervisor cannot
  see the pipe close before it knows the group, however early the parent dies.
  A group is forgotten once its leader was reaped, never while it may run.

A child that leaves its process group (its own ``setsid``) escapes the pipe
guard.  The death signal belongs to the *thread* that forked: start
long-lived children (:func:`spawn`) from a thread that lives as long as they
should.

SIGTERM (``timeout``, CI cancelling a job, ``kill``) is handled as Ctrl-C is
inside :func:`sigterm_unwinds`: it raises :class:`Terminated` in the main
thread, so the command waiting on a child stops that child's whole process
group (SIGTERM, then SIGKILL after the grace period) on its way out, and the
entry point still reports (exit code 143, 128 + SIGTERM).

``sh`` starts and reaps every child, used through its documented contract (special keyword
arguments, ``RunningCommand``'s ``wait``, ``is_alive``, ``pid``, ``stdout``, ``exit_code`` and
its ``ErrorReturnCode``) and only here: :class:`Running` is what the rest of skippy sees.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, TypedDict

import sh

from skippy.core.errors import CommandError, ToolchainMissing

LineSink = Callable[[str], None]

TAIL_LINES = 40


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = TAIL_LINES) -> str:
        text = "\n".join(part.rstrip("\n") for part in (self.stdout, self.stderr) if part).rstrip()
        return "\n".join(text.splitlines()[-lines:])


def which(program: str, env: Mapping[str, str]) -> str | None:
    if os.sep in program:
        return program if os.access(program, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


# --- no orphans -----------------------------------------------------------------------

PR_SET_PDEATHSIG: Final = 1

#: how children are tied to this process (see the module docstring)
GUARDS: frozenset[str] = frozenset({"pdeathsig", "pipe"} if sys.platform.startswith("linux") else {"pipe"})


@functools.cache
def _load_prctl() -> Callable[..., int]:
    """libc's prctl, loaded in the parent (never between fork and exec)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


class Terminated(SystemExit):
    """SIGTERM arrived inside :func:`sigterm_unwinds`: unwinds like Ctrl-C (every ``finally``
    runs, a running child's group is stopped), then exits with 143 (128 + SIGTERM) if nothing
    reports it first."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


class Unwinding:
    """The state of one :func:`sigterm_unwinds` block."""

    def __init__(self) -> None:
        #: SIGTERM no longer raises: it did once, or the work is done (:meth:`finish`)
        self.settled = False
        #: a SIGTERM arrived
        self.terminated = False

    def handler(self, _signum: int, _frame: object) -> None:
        self.terminated = True
        if not self.settled:
            self.settled = True
            raise Terminated

    def finish(self) -> None:
        """The work is over (only its report is left): a SIGTERM from now on does not raise."""
        self.settled = True


_UNWINDING: list[Unwinding] = []


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[Unwinding]:
    """Inside, SIGTERM raises :class:`Terminated` in the main thread, once: a second SIGTERM
    while unwinding is ignored, so the cleanup (stopping a child's group within its grace
    period, the report) is not cut short.  The previous handler is put back after.  A block
    inside another shares the outer one's state; outside the main thread (where Python cannot
    set handlers) this does nothing, and so it does where SIGTERM is ignored on entry (whoever
    started this process wants it to run on, as Python keeps an inherited SIG_IGN for SIGINT)."""
    if _UNWINDING:
        yield _UNWINDING[-1]
        return
    state = Unwinding()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield state
        return
    previous = signal.signal(signal.SIGTERM, state.handler)
    _UNWINDING.append(state)
    try:
        yield state
    finally:
        _UNWINDING.remove(state)
        signal.signal(signal.SIGTERM, previous)


def _chain(hooks: Sequence[Callable[[], None]]) -> Callable[[], None]:
    def hook() -> None:
        for one in hooks:
            one()

    return hook


def _death_signal_hook() -> Callable[[], None]:
    """A preexec hook: SIGTERM this child when the parent dies (see the module's docstring);
    the parent may already be gone, and then the child, which has not run anything yet, goes."""
    prctl = _load_prctl()
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        # the parent died between fork and prctl: the signal will never come, so go now
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


_WATCHDOG_SOURCE: Final = r"""
import os, signal, sys, time
fd = int(sys.argv[1])
groups = set()
pending = b""
while True:
    try:
        data = os.read(fd, 4096)
    except InterruptedError:
        continue
    if not data:
        break
    pending += data
    *lines, pending = pending.split(b"\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    if sig == signal.SIGTERM and groups:
        time.sleep(1.0)
"""


class _Watchdog:
    """The supervising process of the "pipe" guard, started at the first child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._owner = 0

    def _ensure(self) -> int | None:
        if self._fd is not None:
            if self._owner == os.getpid():
                return self._fd
            # a forked copy of the parent: the pipe is the parent's (its supervisor must
            # see it close when the parent goes), this process gets a supervisor of its own
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        read_end, write_end = os.pipe()
        if write_end < 3:
            # a child dups its stdin/stdout/stderr onto 0-2 before it registers (see hook):
            # the write end must not be one of them (a parent started with those closed)
            moved = fcntl.fcntl(write_end, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(write_end)
            write_end = moved
        os.set_inheritable(read_end, True)
        try:
            # never waited for (it outlives us): _bg_exc=False, sh never raises its exit code
            with Path(os.devnull).open("wb") as sink:
                sh.Command(sys.executable)(
                    *("-c", _WATCHDOG_SOURCE, str(read_end)),
                    _pass_fds={read_end},
                    _out=sink,
                    _err=sink,
                    _bg=True,
                    _bg_exc=False,
                    _tty_out=False,
                    _new_session=True,
                )
        except Exception:  # no supervisor (sh's own errors too): the pdeathsig guard stays
            os.close(write_end)
            return None
        finally:
            os.close(read_end)
        self._fd, self._owner = write_end, os.getpid()
        return write_end

    def _send(self, line: str) -> None:
        with self._lock:
            fd = self._ensure()
            if fd is None:
                return
            with contextlib.suppress(OSError):
                os.write(fd, line.encode() + b"\n")

    def hook(self) -> Callable[[], None] | None:
        """A preexec hook: the child registers its own process group, between fork and exec.

        The supervisor is started first (here, in the parent).  The child still holds the
        pipe's write end when it writes, so the supervisor reads the group before it can see
        the pipe close, even when the parent dies at once (a registration sent by the parent
        after the start left a window where a killed parent orphaned its child).
        """
        with self._lock:
            fd = self._ensure()
        if fd is None:
            return None

        def hook() -> None:
            # in the child: it leads its own session, so its process group id is its pid
            line = b"+%d\n" % os.getpid()
            # a supervisor that is gone must not SIGPIPE the child before it runs (sh set SIG_DFL)
            previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            try:
                os.write(fd, line)
            except OSError:
                pass
            finally:
                signal.signal(signal.SIGPIPE, previous)

        return hook

    def release(self, pgid: int) -> None:
        if self._fd is not None and self._owner == os.getpid():
            self._send(f"-{pgid}")


_watchdog = _Watchdog()


#: the block size in which output no caller reads line by line is taken from the child: sh's
#: default reads it line by line, which took 0.6 s for 2.7 MB that a plain pipe reads in 0.01 s
_BLOCK: Final = 1 << 16


class Running:
    """A child :func:`spawn` started: sh's ``RunningCommand``, through its documented contract."""

    def __init__(self, command: sh.RunningCommand) -> None:
        self._command = command
        #: also its session and process group id: it leads its own session
        self.pid = command.pid

    def alive(self) -> bool:
        """It has not exited (sh reaps it once it has)."""
        return self._command.is_alive()

    def wait(self) -> int:
        """Wait until it has exited and its output was read whole; its exit code (-N: signal N)."""
        try:
            self._command.wait()
        except sh.ErrorReturnCode as failed:  # SignalException is one too; raised on the first wait only
            return failed.exit_code
        return self._command.exit_code

    def output(self) -> tuple[str, str]:
        """Its stdout and stderr once it has exited ("" where a file or a line sink took them)."""
        self.wait()
        out, err = self._command.stdout, self._command.stderr
        return out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")

    def signal_group(self, sig: int) -> None:
        """``sig`` to its process group, if any of it is left.

        By the group id, which is its pid: sh's own ``signal_group`` asks ``os.getpgid`` of the
        leader, which fails once the leader was reaped, while what it started may still run.
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def end(self, grace: float) -> bool:
        """SIGTERM to its group if it still runs, SIGKILL ``grace`` seconds later (to the group either
        way: what it started may outlive it); True when it outlived its grace.  Waits for nothing."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        outlived = self.alive()
        self.signal_group(signal.SIGKILL)
        return outlived

    def stop(self, grace: float) -> bool:
        """:meth:`end`, then wait for it; True when it outlived its grace."""
        outlived = self.end(grace)
        with contextlib.suppress(OSError):  # reaped already (ECHILD)
            self.wait()
        return outlived


def spawn(
    exe: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    stdin: str | None = None,
    log: IO[bytes] | None = None,
    lines: tuple[LineSink, LineSink] | None = None,
) -> Running:
    """Start ``exe`` in the background, in its own session, tied to this process.

    ``env`` is its whole environment.  Its stdout and stderr go to ``log`` (the child writes the
    file itself), or line by line to ``lines`` (stdout's sink, stderr's), or else are read in
    blocks for :meth:`Running.output`.  The caller waits for it, then calls :func:`release`.
    """
    hooks: list[Callable[[], None]] = []
    if "pipe" in GUARDS and (register := _watchdog.hook()) is not None:
        hooks.append(register)
    if "pdeathsig" in GUARDS:
        hooks.append(_death_signal_hook())
    command = sh.Command(exe)(
        *args,
        _env=dict(env),
        _cwd=str(cwd) if cwd is not None else None,
        _in=stdin,
        **_output(log, lines),
        _decode_errors="replace",
        _preexec_fn=_chain(hooks),
        _bg=True,
        # its exit code is read by Running.wait, never raised in a thread of sh's own
        _bg_exc=False,
        _tty_out=False,
        # own session and process group: timeouts and Ctrl-C stop the whole tree
        _new_session=True,
        _return_cmd=True,
    )
    return Running(command)


class _Output(TypedDict, total=False):
    """Where sh sends a child's output (sh refuses a setting that another one makes moot)."""

    _out: IO[bytes] | LineSink
    _err: LineSink
    _err_to_out: bool
    _out_bufsize: int
    _err_bufsize: int


def _output(log: IO[bytes] | None, lines: tuple[LineSink, LineSink] | None) -> _Output:
    if log is not None:
        return {"_out": log, "_err_to_out": True}
    if lines is not None:
        return {"_out": lines[0], "_err": lines[1]}
    return {"_out_bufsize": _BLOCK, "_err_bufsize": _BLOCK}


def release(pid: int) -> None:
    """The child ``pid`` was reaped: the supervisor forgets its process group (what it left
    running there on purpose, a compiler cache's server, may outlive this process)."""
    if "pipe" in GUARDS:
        _watchdog.release(pid)


#: where every command line goes when no caller asked for its own echo (``--verbose``: :func:`echoing`)
_ECHO: list[LineSink] = []


@contextlib.contextmanager
def echoing(sink: LineSink) -> Iterator[None]:
    """Every command :func:`run` starts meanwhile is told to ``sink`` (``--verbose``)."""
    _ECHO.append(sink)
    try:
        yield
    finally:
        _ECHO.remove(sink)


def run(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    check: bool = True,
    timeout: float | None = None,
    grace: float = 10.0,
    input: str | None = None,
    on_line: LineSink | None = None,
    echo: LineSink | None = None,
    what: str | None = None,
    next_step: str | None = None,
) -> Result:
    """Run ``argv`` and return its :class:`Result`.

    ``env`` is the complete environment of the child (callers build it from
    the environment they were given). ``on_line`` receives every output line
    as it arrives (stdout and stderr); ``echo`` receives the command line.
    """
    args = tuple(str(a) for a in argv)
    exe = _program(args, env)
    echo = echo if echo is not None else (_ECHO[-1] if _ECHO else None)
    if echo is not None:
        echo("$ " + " ".join(quote(a) for a in args))
    out: list[str] = []
    err: list[str] = []
    # line sinks cost sh a polling thread (~0.1 s a call): only for a caller who wants them
    lines = None if on_line is None else (_keep(out, on_line), _keep(err, on_line))
    started = time.monotonic()
    running = spawn(exe, args[1:], env=env, cwd=cwd, stdin=input, lines=lines)
    try:
        code, timed_out = _wait(running, timeout, grace)
    finally:
        # a child still running here (its stop cut short by a second Ctrl-C) stays registered:
        # the supervisor stops its group when this process ends
        if not running.alive():
            release(running.pid)
    stdout, stderr = running.output() if lines is None else ("".join(out), "".join(err))
    result = Result(args, code, stdout, stderr, time.monotonic() - started)
    if timed_out:
        message = f"{what or args[0]} timed out after {timeout:g} s"
    elif check and code != 0:
        message = f"{what or ' '.join(args[:2])} failed (exit code {code})"
    else:
        return result
    returncode = None if timed_out else code
    raise CommandError(message, argv=args, returncode=returncode, output_tail=result.tail(), next_step=next_step)


def _program(args: tuple[str, ...], env: Mapping[str, str]) -> str:
    """The program ``args`` runs, found on ``env``'s PATH."""
    if not args:
        raise ValueError("empty argv")
    exe = which(args[0], env)
    if exe is None:
        raise ToolchainMissing(
            f"`{args[0]}` was not found on PATH",
            untouched="everything: the command was not started",
            next_step=f"install {args[0]} or put it on PATH",
        )
    return exe


def _keep(store: list[str], on_line: LineSink) -> LineSink:
    def take(line: str) -> None:
        store.append(line)
        on_line(line.rstrip("\n"))

    return take


def _wait(running: Running, timeout: float | None, grace: float) -> tuple[int, bool]:
    """Wait for ``running``: its exit code, and whether it ran past ``timeout``.

    Past ``timeout`` a timer stops its group (:meth:`Running.end`) while this waits on, so the
    output is read whole (sh's own timed wait polls every 0.1 s, and returns before its threads
    have read the last output).  Interrupted (Ctrl-C, :class:`Terminated`), it stops the group.
    """
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        running.end(grace)

    timer = threading.Timer(timeout, expire) if timeout is not None else None
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        code = running.wait()
    except BaseException:
        if running.alive():
            running.stop(grace)
        raise
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
    return code, expired.is_set()


def quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "-_./=:+@%,^" for c in arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"
