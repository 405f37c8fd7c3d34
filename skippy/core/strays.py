"""What a compiler cache's daemon (sccache) still runs in a build dir after the build was stopped.

The daemon leads a session of its own, outside every process group :mod:`skippy.core.proc`
stops: the compiles it runs for a stopped build go on, writing into the build dir, unless
they are found by their current directory (Linux, /proc) and stopped one by one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Final


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
