"""The one gate every subprocess goes through (git, cmake, ninja, llama-server).

Commands are argument lists, never shell strings.  Output is captured (and
optionally streamed line by line for long builds); failures raise
:class:`~skippy.core.errors.CommandError` with the command, its exit code and the
tail of its output.  On timeout or Ctrl-C the child gets SIGTERM, then SIGKILL
after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    command = sh.Command(exe)
    # Line callbacks cost sh a polling thread (~0.1 s a call): use them only
    # when the caller wants output as it arrives.
    streaming: dict[str, Any] = {}
    if on_line is not None:
        streaming = {"_out": sink(out), "_err": sink(err)}
    running = command(
        *args[1:],
        _cwd=str(cwd) if cwd is not None else None,
        _env=dict(env),
        _in=input,
        **streaming,
        _bg=True,
        _bg_exc=False,
        _tty_out=False,
        # own process group: timeouts and Ctrl-C stop the whole tree
        _new_session=True,
        _ok_code=_ALL_CODES,
        _decode_errors="replace",
        _return_cmd=True,
    )
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
