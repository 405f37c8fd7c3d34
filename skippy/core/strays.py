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
from dataclasses import dataclass
from pathlib import Path
from typing import Final


@dataclass(frozen=True)
class _Process:
    parent: int
    name: str
    session: int


def _processes() -> dict[int, _Process]:
    """Linux: every live process's parent, name and session, from /proc; {} where there is none."""
    table: dict[int, _Process] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            name, _, rest = stat.partition(" (")[2].rpartition(") ")
            fields = rest.split()  # state, parent, process group, session, ...
            if len(fields) > 3 and fields[0] not in ("Z", "X"):
                table[int(entry.name)] = _Process(int(fields[1]), name, int(fields[3]))
    return table


def _works_in(pid: int, folder: Path) -> bool:
    try:
        cwd = Path(f"/proc/{pid}/cwd").readlink()
    except OSError:
        return False
    return cwd == folder or folder in cwd.parents


def _strays(folder: Path, daemon: str) -> list[int]:
    """What the processes named ``daemon`` run in ``folder`` (their current directory inside it):
    their descendants, and the processes of a daemon's own session there, which its descendants
    stay in when the daemon stops a compile and its passes lose their parent (but never of the
    session skippy runs in: a daemon started there is no session of its own)."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.parent, []).append(pid)
    daemons = {pid for pid, proc in table.items() if proc.name == daemon}
    sessions = {table[pid].session for pid in daemons} - {os.getsid(0)}
    found = {pid for pid, proc in table.items() if proc.session in sessions}
    descendants: set[int] = set()
    frontier = list(daemons)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in descendants:
                descendants.add(child)
                frontier.append(child)
    return sorted(pid for pid in (found | descendants) - daemons if _works_in(pid, folder))


#: a daemon is done with a folder once this many scans in a row (0.1 s apart, 2 s) find nothing
#: of it there: sccache runs a compile after its preprocessing was stopped, late on busy cores
_QUIET_SCANS: Final = 20


def _frozen(folder: Path, daemon: str) -> list[int]:
    """SIGSTOP everything ``daemon`` runs in ``folder`` (:func:`_strays`), scanning again until no new one
    appears: a stopped process starts nothing, and what one started before it stopped is still its
    child, so found by the next scan (once its parent is gone, it would be the daemon's no more)."""
    frozen: list[int] = []
    while new := [pid for pid in _strays(folder, daemon) if pid not in frozen]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        frozen += new
    return frozen


def _send(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stop_tree(folder: Path, daemon: str, grace: float) -> list[int]:
    """Stop what the daemon runs in ``folder`` now: SIGTERM (each process may clean up, as a compiler
    removes its temporary files), again to whatever it starts meanwhile, then, after ``grace``
    seconds, SIGKILL to what is left, frozen whole first so that nothing escapes by being started
    while it is killed.  Returns the pids signalled."""
    signalled: list[int] = []
    until = time.monotonic() + grace
    while True:
        found = _frozen(folder, daemon)
        _send([pid for pid in found if pid not in signalled], signal.SIGTERM)
        signalled += [pid for pid in found if pid not in signalled]
        _send(found, signal.SIGCONT)  # a stopped process acts on SIGTERM once it runs again
        if not found or time.monotonic() >= until:
            break
        time.sleep(0.05)
    left = _frozen(folder, daemon)
    _send(left, signal.SIGKILL)
    signalled += [pid for pid in left if pid not in signalled]
    return signalled


def stop_strays(folder: Path, *, daemon: str, grace: float) -> list[int]:
    """Stop what a daemon of ``daemon``'s name still runs in ``folder`` (Linux; elsewhere nothing).

    A compiler cache's server (sccache) is a daemon of its own session, outside every process
    group of ours: the compiles it runs for a build go on after the build was stopped, writing
    into the build dir.  Its descendants working in ``folder`` (their current directory inside
    it: ninja runs every compile there) get SIGTERM, then SIGKILL after ``grace`` seconds; the
    daemon itself and its other work are left alone.  Each round freezes them first (SIGSTOP),
    so a compile cannot start a pass that escapes by losing its parent.  The daemon may still
    start work it was handed (a compile after its preprocessing was stopped): the folder is
    scanned again until it stays quiet.  Returns the pids signalled.
    """
    folder = folder.resolve()
    signalled: list[int] = []
    quiet = 0
    deadline = time.monotonic() + 4 * grace + 1
    while quiet < _QUIET_SCANS and time.monotonic() < deadline:
        if not _strays(folder, daemon):
            quiet += 1
            time.sleep(0.1)
            continue
        quiet = 0
        signalled += [pid for pid in _stop_tree(folder, daemon, grace) if pid not in signalled]
    return signalled
