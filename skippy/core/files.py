"""Files written so that a reader never sees half of them, and cache entries made once."""

from __future__ import annotations

import contextlib
import hashlib
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
    """:func:`write_bytes_atomic` of ``text`` in UTF-8 (newlines as given)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path``, fsync it, then rename it into place.

    A regular file keeps its mode (a new one gets the umask's, as ``open`` would), not mkstemp's
    0600.  A symlink at ``path`` is replaced by the new file (the rename replaces the link itself),
    never written through, and the mode of what it points to is not taken either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = path.lstat()
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISREG(info.st_mode):
        mode = stat.S_IMODE(info.st_mode)
    else:
        mask = os.umask(0o022)
        os.umask(mask)
        mode = 0o666 & ~mask
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise


def same_folder(a: Path, b: Path) -> bool:
    """The two folders hold the same names, links and bytes (folder links followed)."""
    left, right = sorted(a.iterdir()), sorted(b.iterdir())
    if [p.name for p in left] != [p.name for p in right]:
        return False
    for x, y in zip(left, right, strict=True):
        if x.is_dir() and y.is_dir():  # a linked folder is compared through its link
            if not same_folder(x, y):
                return False
        elif x.is_symlink() or y.is_symlink():
            if not (x.is_symlink() and y.is_symlink() and x.readlink() == y.readlink()):
                return False
        elif x.is_dir() or y.is_dir() or x.read_bytes() != y.read_bytes():
            return False
    return True


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


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes (read in blocks: a model or a wheel is never held whole)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
