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
from typing import Any, Final

import sh

from skippy.core.errors import CommandError, ToolchainMissing

LineSink = Callable[[str], None]

#: exit codes sh must never raise on: we check them ourselves
_ALL_CODES = list(range(-64, 256))
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
def _load_prctl() -> Any:
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
            with Path(os.devnull).open("wb") as sink:
                sh.Command(sys.executable)(
                    "-c",
                    _WATCHDOG_SOURCE,
                    str(read_end),
                    _pass_fds={read_end},
                    _bg=True,
                    _bg_exc=False,
                    _tty_out=False,
                    _new_session=True,
                    _out=sink,
                    _err=sink,
                    _ok_code=_ALL_CODES,
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


def spawn(exe: str, args: Sequence[str], **options: Any) -> Any:
    """Start ``exe`` in the background through ``sh``, in its own session, tied to this process.

    ``options`` are ``sh`` special keyword arguments (``_env``, ``_out`` ...).  The
    caller waits for the returned running command and then calls :func:`release`
    with its pid.  The child's session (and process group) id is its pid.
    """
    hooks: list[Callable[[], None]] = []
    if "pipe" in GUARDS and (register := _watchdog.hook()) is not None:
        hooks.append(register)
    if "pdeathsig" in GUARDS:
        hooks.append(_death_signal_hook())
    guard: dict[str, Any] = {"_preexec_fn": _chain(hooks)} if hooks else {}
    running = sh.Command(exe)(
        *args,
        **options,
        **guard,
        _bg=True,
        _bg_exc=False,
        _tty_out=False,
        # own session and process group: timeouts and Ctrl-C stop the whole tree
        _new_session=True,
        _ok_code=_ALL_CODES,
        _return_cmd=True,
    )
    return running


def release(pid: int) -> None:
    """The child ``pid`` was reaped: the supervisor forgets its process group (what it left
    running there on purpose, a compiler cache's server, may outlive this process)."""
    if "pipe" in GUARDS:
        _watchdog.release(pid)


def _processes() -> dict[int, tuple[int, str]]:
    """Linux: every process's (parent pid, name), from /proc; {} where there is none."""
    table: dict[int, tuple[int, str]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            name, _, rest = stat.partition(" (")[2].rpartition(") ")
            fields = rest.split()
            if len(fields) > 1 and fields[0] not in ("Z", "X"):
                table[int(entry.name)] = (int(fields[1]), name)
    return table


def _works_in(pid: int, folder: Path) -> bool:
    try:
        cwd = Path(f"/proc/{pid}/cwd").readlink()
    except OSError:
        return False
    return cwd == folder or folder in cwd.parents


def _strays(folder: Path, daemon: str) -> list[int]:
    """The descendants of the processes named ``daemon`` whose current directory is in ``folder``."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _name) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = [pid for pid, (_ppid, name) in table.items() if name == daemon]
    while frontier:
        for child in children.get(frontier.pop(), []):
            frontier.append(child)
            if _works_in(child, folder):
                found.append(child)
    return found


#: a daemon is done with a folder once this many scans in a row (0.1 s apart, 2 s) find nothing
#: of it there: sccache runs a compile after its preprocessing was stopped, late on busy cores
_QUIET_SCANS: Final = 20


def stop_strays(folder: Path, *, daemon: str, grace: float) -> list[int]:
    """Stop what a daemon of ``daemon``'s name still runs in ``folder`` (Linux; elsewhere nothing).

    A compiler cache's server (sccache) is a daemon of its own session, outside every process
    group of ours: the compiles it runs for a build go on after the build was stopped, writing
    into the build dir.  Its descendants working in ``folder`` (their current directory inside
    it: ninja runs every compile there) get SIGTERM, then SIGKILL after ``grace`` seconds; the
    daemon itself and its other work are left alone.  The daemon may still start work it was
    handed (a compile after its preprocessing was stopped): the folder is scanned again until
    it stays quiet.  Returns the pids signalled.
    """
    folder = folder.resolve()
    signalled: list[int] = []
    quiet = 0
    deadline = time.monotonic() + 4 * grace + 1
    while quiet < _QUIET_SCANS and time.monotonic() < deadline:
        found = _strays(folder, daemon)
        if not found:
            quiet += 1
            time.sleep(0.1)
            continue
        quiet = 0
        signalled += found
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            until = time.monotonic() + (grace if sig == signal.SIGTERM else 0)
            while time.monotonic() < until and set(found) & _processes().keys():
                time.sleep(0.05)
    return signalled


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


#: the block size in which output no caller reads line by line is taken from the child
_BLOCK: Final = 1 << 16


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
    if not args:
        raise ValueError("empty argv")
    exe = which(args[0], env)
    if exe is None:
        raise ToolchainMissing(
            f"`{args[0]}` was not found on PATH",
            untouched="everything: the command was not started",
            next_step=f"install {args[0]} or put it on PATH",
        )
    echo = echo if echo is not None else (_ECHO[-1] if _ECHO else None)
    if echo is not None:
        echo("$ " + " ".join(quote(a) for a in args))
    out: list[str] = []
    err: list[str] = []

    def sink(store: list[str]) -> Callable[[str], None]:
        def take(line: str) -> None:
            store.append(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))

        return take

    started = time.monotonic()
    # Line callbacks cost sh a polling thread (~0.1 s a call): use them only
    # when the caller wants output as it arrives.
    # Without them, output is read in blocks: sh's default reads it line by line, which took
    # 0.6 s for 2.7 MB of output that a plain pipe reads in 0.01 s.
    streaming: dict[str, Any] = {"_out_bufsize": _BLOCK, "_err_bufsize": _BLOCK}
    if on_line is not None:
        streaming = {"_out": sink(out), "_err": sink(err)}
    running = spawn(
        exe,
        args[1:],
        _cwd=str(cwd) if cwd is not None else None,
        _env=dict(env),
        _in=input,
        **streaming,
        _decode_errors="replace",
    )
    try:
        return _wait(
            running,
            args=args,
            check=check,
            timeout=timeout,
            grace=grace,
            on_line=on_line,
            out=out,
            err=err,
            started=started,
            what=what,
            next_step=next_step,
        )
    finally:
        # a child still running here (its stop cut short by a second Ctrl-C) stays registered:
        # the supervisor stops its group when this process ends
        if running.process.exit_code is not None:
            release(int(running.pid))


def _wait(
    running: Any,
    *,
    args: tuple[str, ...],
    check: bool,
    timeout: float | None,
    grace: float,
    on_line: LineSink | None,
    out: list[str],
    err: list[str],
    started: float,
    what: str | None,
    next_step: str | None,
) -> Result:
    try:
        if timeout is None:
            running.wait()
        else:
            try:
                running.wait(timeout=timeout)
                # sh's timed wait only polls the pid: join its output threads
                # too, or the tail of stdout/stderr can be lost
                running.process.wait()
            except sh.TimeoutException:
                _stop(running, grace)
                if on_line is None:
                    out.append(_text(running.stdout))
                    err.append(_text(running.stderr))
                result = Result(args, -15, "".join(out), "".join(err), time.monotonic() - started)
                raise CommandError(
                    f"{what or args[0]} timed out after {timeout:g} s",
                    argv=args,
                    returncode=None,
                    output_tail=result.tail(),
                    next_step=next_step,
                ) from None
    except BaseException:
        if running.process.is_alive()[0]:
            _stop(running, grace)
        raise
    code = int(running.exit_code if running.exit_code is not None else -1)
    if on_line is None:
        out.append(_text(running.stdout))
        err.append(_text(running.stderr))
    result = Result(args, code, "".join(out), "".join(err), time.monotonic() - started)
    if check and code != 0:
        raise CommandError(
            f"{what or ' '.join(args[:2])} failed (exit code {code})",
            argv=args,
            returncode=code,
            output_tail=result.tail(),
            next_step=next_step,
        )
    return result


def _stop(running: sh.RunningCommand, grace: float) -> None:
    """SIGTERM to the process group, wait ``grace`` seconds, then SIGKILL.

    The child leads its own session, so its group id is its pid: signalling the
    group by pid still reaches what it started after the leader was reaped.
    """
    pgid = running.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while running.process.is_alive()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(OSError, sh.ErrorReturnCode, sh.SignalException):
        running.wait()


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data


def quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "-_./=:+@%,^" for c in arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"
