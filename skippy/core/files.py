"""Files written so that a reader never sees half of them, and cache entries made once."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import filelock

from skippy.core.errors import ToolchainMissing

T = TypeVar("T")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, fsync it, then rename it into place.

    The file keeps its mode (a new one gets the umask's, as ``open`` would), not mkstemp's 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mask = os.umask(0o022)
        os.umask(mask)
        mode = 0o666 & ~mask
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise


def made_once(home: Path, *, done: Callable[[], T | None], make: Callable[[], T], what: str, timeout: float) -> T:
    """What ``done`` finds at ``home``, else ``make`` it under ``home``'s file lock (checked again
    once the lock is held: another process may just have made it).  A lock held longer than
    ``timeout`` is ToolchainMissing naming ``what`` (e.g. "assembling the CUDA toolkit")."""
    found = done()
    if found is not None:
        return found
    home.parent.mkdir(parents=True, exist_ok=True)
    try:
        with filelock.FileLock(str(home) + ".lock", timeout=timeout):
            found = done()
            return found if found is not None else make()
    except filelock.Timeout as exc:
        raise ToolchainMissing(
            f"another process is {what} (lock {exc.lock_file})",
            untouched="everything: nothing was built",
            next_step="wait for it to finish and run the build again",
        ) from None
