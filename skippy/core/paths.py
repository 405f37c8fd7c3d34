"""What a path is (for messages that refuse it), and small files read with a bound."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

#: st_mode file type -> how messages name it
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def path_kind(path: Path) -> str:
    """``path`` as messages name it: "a directory", "a character device", "a broken symbolic
    link to X", "missing" ... (links are followed, and said so when they lead somewhere odd)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return f"a broken symbolic link to {path.readlink()}"
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or type(exc).__name__})"
    kind = next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")
    if path.is_symlink():
        return f"a symbolic link to {os.path.realpath(path)}, {kind}"
    return kind


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


class NotSmallFile(Exception):
    """``path`` is not a regular file of at most ``limit`` bytes; ``why`` says what it is."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def read_small_text(path: Path, limit: int) -> str:
    """The text of ``path``, a regular file of at most ``limit`` bytes.

    The kind is checked with ``stat`` before anything is opened (a FIFO would block, a
    device never end); the read itself stops after ``limit + 1`` bytes, so a file that grows
    in between is refused too.  FileNotFoundError when it is missing; NotSmallFile when it
    is not a regular file or is too big; UnicodeDecodeError when it is not UTF-8.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise NotSmallFile(path, path_kind(path)) from None
        raise
    if not stat.S_ISREG(info.st_mode):
        raise NotSmallFile(path, f"{path_kind(path)}, not a regular file")
    too_big = f"over the {limit}-byte limit of the small text files skippy reads"
    if info.st_size > limit:
        raise NotSmallFile(path, f"{info.st_size} bytes, {too_big}")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise NotSmallFile(path, f"a file that grew {too_big}")
    return data.decode("utf-8")
