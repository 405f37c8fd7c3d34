"""A server process for the spot check (llama-server, the RPC server, or a stand-in):
started through :func:`skippy.core.proc.spawn` (own session, dies with this process),
its log in a file, always stopped (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Final

from skippy.core import proc
from skippy.core.errors import SpotCheckFailed

HOST: Final = "127.0.0.1"
LOG_TAIL: Final = 30


class ServerFailure(Exception):
    """One model's check failed for ``reason`` (internal: becomes a ModelResult)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = HOST) -> bool:
    """No process listens on ``port`` (connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def own_log(path: Path) -> tuple[BinaryIO, Path]:
    """A log file for one server, written by it alone: ``path``, or ``<stem>-2<suffix>`` (the
    next free) while the server of another run still writes ``path`` (two spot checks of the
    same model in the same build dir at once: opening it afresh emptied the other's log, which
    then showed a server that exited saying nothing).  The file is locked (``flock``) while any
    process holds it open: this one until :meth:`Server.stop`, the server until it exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        return os.fdopen(fd, "wb"), candidate
    raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends


class Server:
    """A background llama-server (or stand-in) with its log in a file.

    Started like every other subprocess (argument list, complete env, own
    process group, no tty, tied to this process so that it dies with it) by
    :func:`skippy.core.proc.spawn`, but left running: :func:`skippy.core.proc.run`
    waits for its command to finish.
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> None:
        self.argv = tuple(argv)
        exe = proc.which(self.argv[0], env)
        if exe is None:
            raise SpotCheckFailed(
                f"server binary {self.argv[0]} is missing or not executable",
                untouched="everything: no server was started",
                next_step="nox -s build-cpu",
            )
        # the log is this server's alone (see own_log): another run's server may still write log_path
        self._log, self.log_path = own_log(log_path)
        self.started = time.monotonic()
        # own session, tied to this process: it dies with us even when we are SIGKILLed.  Its
        # stdout and stderr are the log file itself (the child writes it; no thread of ours
        # copies them), so the log is whole once the server has exited
        try:
            self._running = proc.spawn(exe, self.argv[1:], env=env, log=self._log)
        except BaseException:
            self._log.close()  # never left open (a server that could not start is never stopped)
            raise
        #: also its process group id (it leads its own session)
        self.pid = self._running.pid
        self.exit_code: int | None = None
        #: it outlived the grace :meth:`stop` gave it after SIGTERM
        self.killed = False

    def alive(self) -> bool:
        return self._running.alive()

    def poll(self) -> int | None:
        if self.alive():
            return None
        return self._finish()

    def _finish(self) -> int:
        self.exit_code = self._running.wait()
        with contextlib.suppress(OSError, ValueError):
            self._log.flush()
        return self.exit_code

    def stop(self, grace: float) -> int:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds (to the group either way:
        the leader may be gone while children linger); returns the exit code."""
        self.killed |= self._running.stop(grace)
        code = self._finish()
        proc.release(self.pid)
        with contextlib.suppress(OSError):
            self._log.close()
        return code

    def log_lines(self) -> list[str]:
        with contextlib.suppress(OSError, ValueError):
            self._log.flush()
        try:
            text = self.log_path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return []
        return text.splitlines()

    def tail(self, n: int = LOG_TAIL) -> list[str]:
        return self.log_lines()[-n:]


@contextlib.contextmanager
def running_server(argv: Sequence[str], *, env: Mapping[str, str], log_path: Path, grace: float) -> Iterator[Server]:
    server = Server(argv, env=env, log_path=log_path)
    try:
        yield server
    finally:
        server.stop(grace)


def http_status(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback http only
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def describe_exit(code: int) -> str:
    """``exited with code 3`` or ``was killed by SIGSEGV (exit code -11)``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


#: a log line that says why a server stopped (llama.cpp's own words for it)
_SAYS_WHY: Final = re.compile(
    r"error|fail|invalid|unexpected|abort|assert|exception|terminate|fatal|cannot|can't|couldn't|unable|"
    r"not found|no such|exiting|denied|killed",
    re.IGNORECASE,
)


def exited_early(server: Server, code: int, before: str) -> ServerFailure:
    """The server exited on its own ``before`` (it was ready, it listened).

    Its log is whole at this point: the server writes the log file itself (its stdout and
    stderr are that file, no thread of ours copies them), and it has exited.  When no line
    of it says why, the reason says so, and how to see why: llama.cpp writes its log from a
    thread it never waits for when it exits (``common_log_main``'s logger is leaked on
    purpose), so the lines that say why can be lost, and are, on a busy machine.
    """
    reason = f"{Path(server.argv[0]).name} {describe_exit(code)} {before}"
    if code > 0 and not any(_SAYS_WHY.search(line) for line in server.log_lines()):
        command = " ".join(proc.quote(arg) for arg in server.argv)
        reason += (
            f"; its log ({server.log_path}) says nothing of why: llama.cpp writes its log from a thread "
            "it does not wait for when it exits, and the last lines, which say why, can be lost on a "
            f"busy machine; run it alone to see them: {command}"
        )
    return ServerFailure(reason)


def wait_for_port(server: Server, port: int, timeout: float, host: str = HOST) -> float:
    """Wait until ``port`` accepts a connection (a server without /health, like the RPC server)."""
    deadline = server.started + timeout
    while time.monotonic() < deadline:
        code = server.poll()
        if code is not None:
            raise exited_early(server, code, "before listening")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return time.monotonic() - server.started
        time.sleep(0.05)
    raise ServerFailure(f"{Path(server.argv[0]).name} did not listen on {host}:{port} within {timeout:g} s")
