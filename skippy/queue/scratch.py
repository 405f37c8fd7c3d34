"""Scratch folders owned by a live run: created under a held ``flock``, swept when their run is gone."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from skippy.core.ui import Console

#: a scratch folder with no lock file beside it (left by a run older than the locks) is removed
#: once it is this old (seconds): no import runs that long
STALE_UNLOCKED_AGE: Final = 3600.0
LOCK_SUFFIX: Final = ".lock"


@contextlib.contextmanager
def owned_scratch(root: Path, prefix: str, *, console: Console | None = None) -> Iterator[Path]:
    """A new folder ``root/<prefix><random>`` for this run, removed afterwards.

    ``<folder>.lock`` beside it is held with ``flock`` while the folder exists; the kernel releases
    it when the process dies, even on SIGKILL.  Before creating its own, the run removes the folders
    (and locks) of ``prefix`` that dead runs left behind; a folder whose lock is held belongs to a
    live run and is never touched.
    """
    root.mkdir(parents=True, exist_ok=True)
    if console is not None:
        report_swept(sweep_stale(root, prefix), root, console)
    else:
        sweep_stale(root, prefix)
    while True:
        path = root / f"{prefix}{uuid.uuid4().hex[:12]}"
        lock_path = path.with_name(path.name + LOCK_SUFFIX)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(fd, lock_path):
            break
        os.close(fd)  # a sweeper took the lock file between open and flock: take another name
    try:
        path.mkdir()
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
        os.close(fd)


def report_swept(removed: list[Path], root: Path, console: Console) -> None:
    if removed:
        console.info(f"removed {len(removed)} scratch folder(s) that interrupted runs left in {root}")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def sweep_stale(root: Path, prefix: str, *, now: float | None = None) -> list[Path]:
    """Remove the scratch folders of ``prefix`` under ``root`` whose run is gone; the removed ones."""
    if not root.is_dir():
        return []
    removed = _sweep_unlocked(root, prefix, time.time() if now is None else now)
    for lock_path in sorted(root.glob(f"{prefix}*{LOCK_SUFFIX}")):
        folder = _sweep_locked(lock_path)
        if folder is not None:
            removed.append(folder)
    return removed


def _sweep_unlocked(root: Path, prefix: str, now: float) -> list[Path]:
    """Folders with no lock file beside them (left by a run older than the locks), once they are old."""
    removed: list[Path] = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        if not name.startswith(prefix) or name.endswith(LOCK_SUFFIX):
            continue
        if entry.with_name(name + LOCK_SUFFIX).exists():
            continue  # handled by _sweep_locked, under its lock
        with contextlib.suppress(FileNotFoundError):
            if now - entry.lstat().st_mtime > STALE_UNLOCKED_AGE:
                _remove(entry)
                removed.append(entry)
    return removed


def _sweep_locked(lock_path: Path) -> Path | None:
    """The folder of ``lock_path``, removed with its lock when no live run holds the lock."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None  # a live run holds it
            raise
        if not _same_file(fd, lock_path):
            return None
        folder = lock_path.with_name(lock_path.name[: -len(LOCK_SUFFIX)])
        gone: Path | None = None
        if folder.exists() or folder.is_symlink():
            _remove(folder)
            gone = folder
        lock_path.unlink()
        return gone
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
