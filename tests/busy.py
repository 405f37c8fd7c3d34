"""The suite on a busy machine, in a shell that is not interactive.

* :func:`cpu_hogs`: one busy process per core while a block runs (real load, not a sleep).
* :func:`default_interrupts`: a ``preexec_fn`` giving a child SIGINT (and SIGTERM) at its default.
  A background job of a non-interactive shell (``nohup ... &``, some CI agents) starts with
  SIGINT ignored, its children inherit that, and Python then installs no KeyboardInterrupt
  handler: a test that sends SIGINT sets the disposition it relies on itself.
* :func:`sigint_raises`: the same for a test that sends SIGINT to its own process.
* :func:`carrying`: the live processes whose command line holds a token (to find what a test
  started, whoever its parent is now, without looking at anyone else's processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

#: a process that only burns CPU
_HOG = "while True:\n    pass\n"


@contextlib.contextmanager
def cpu_hogs(count: int | None = None) -> Iterator[list[int]]:
    """``count`` (default: one per core) busy processes while the block runs; killed after, by pid."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for _ in range(count or os.cpu_count() or 2)
    ]
    try:
        yield [h.pid for h in hogs]
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def default_interrupts() -> None:
    """``preexec_fn``: SIGINT and SIGTERM at their defaults in the child, whatever this process
    inherited (skippy, as Python does for SIGINT, keeps either ignored when it starts so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process (main thread) while the block runs."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def carrying(token: str) -> list[int]:
    """The pids of the live (not zombie) processes whose command line holds ``token``."""
    if Path("/proc/self/cmdline").exists():
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline and _state(entry.name) not in ("Z", "X"):
                found.append(int(entry.name))
        return found
    out = subprocess.run(["ps", "-axo", "pid=,stat=,command="], capture_output=True, text=True, check=True).stdout
    return [
        int(line.split()[0])
        for line in out.splitlines()
        if token in line and len(line.split()) > 1 and not line.split()[1].startswith("Z")
    ]
