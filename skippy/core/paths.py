"""What a path is (for messages that refuse it), and small files read with a bound.

:func:`read_small_bytes` is the one reader of the files skippy takes from the project (the
queue's series and patches, the parity allowlist, the generated lane's spec, the pin, the
settings): the file must be a regular file, inside the project once every link is followed,
and the read itself stops after the limit (a ``/proc`` file reports size 0 and has more).
"""

from __future__ import annotations

import errno
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
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (following its links never ends)"
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


def is_link_loop(path: Path) -> bool:
    """True when following the links of ``path`` (or of a folder on its way) never ends."""
    try:
        path.stat()
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def is_inside(path: Path, folder: Path) -> bool:
    """``path`` is ``folder`` or under it, both with every link followed."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real == top or top in real.parents


def outside_why(path: Path, folder: Path, label: str = "the project") -> str | None:
    """Why ``path`` is not inside ``folder`` once its links are followed (for messages), or None."""
    if is_inside(path, folder):
        return None
    real = os.path.realpath(path)
    where = f"outside {label} ({os.path.realpath(folder)})"
    if path.is_symlink():
        return f"a symbolic link to {real}, {where}"
    if real != os.path.normpath(path.absolute()):
        return f"{real} once its links are followed, {where}"
    return where


def read_small_bytes(path: Path, limit: int, *, inside: Path | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (inside ``inside``).

    The kind is checked with ``stat`` before anything is opened (a FIFO would block, a
    device never end); with ``inside``, the file must lie in that folder once every link
    is followed, and the resolved path is opened without following a last link (one put
    there meanwhile is refused).  The *opened* file is checked again with ``fstat``, and
    the read stops after ``limit + 1`` bytes whatever size the file reports (``/proc``
    files report 0).  FileNotFoundError when it is missing; NotSmallFile when it is not a
    regular file, a link loop, outside ``inside`` or too big.
    """
    target = _checked_before_open(path, limit, inside)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(target, flags | (os.O_NOFOLLOW if inside is not None else 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last part became a link after the check
            raise NotSmallFile(path, "a symbolic link put in place while it was read") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotSmallFile(path, "not a regular file once opened (it was replaced while it was read)")
        data = _read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotSmallFile(path, f"a file that holds more than it reports, {_too_big(limit)}")
    return data


def _too_big(limit: int) -> str:
    return f"over the {limit}-byte limit of the small text files skippy reads"


def _checked_before_open(path: Path, limit: int, inside: Path | None) -> Path:
    """The path to open for :func:`read_small_bytes` (resolved when it must stay ``inside``),
    after the ``stat`` checks: a regular file, inside, at most ``limit`` bytes by its size."""
    try:
        info = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise NotSmallFile(path, path_kind(path)) from None
        raise
    except OSError as exc:
        raise NotSmallFile(path, path_kind(path)) from exc
    if not stat.S_ISREG(info.st_mode):
        raise NotSmallFile(path, f"{path_kind(path)}, not a regular file")
    if info.st_size > limit:
        raise NotSmallFile(path, f"{info.st_size} bytes, {_too_big(limit)}")
    if inside is None:
        return path
    why = outside_why(path, inside)
    if why is not None:
        raise NotSmallFile(path, why)
    return Path(os.path.realpath(path))


def _read_at_most(fd: int, most: int) -> bytes:
    """Up to ``most`` bytes from ``fd`` (short reads are read on; the end of the file stops it)."""
    chunks: list[bytes] = []
    size = 0
    while size < most:
        chunk = os.read(fd, most - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_small_text(path: Path, limit: int, *, inside: Path | None = None) -> str:
    """:func:`read_small_bytes` decoded as UTF-8 (UnicodeDecodeError when it is not)."""
    return read_small_bytes(path, limit, inside=inside).decode("utf-8")


def enclosing_project(path: Path) -> Path | None:
    """The nearest folder at or above ``path`` (as written, links not followed) holding a
    ``pyproject.toml``: the project a queue belongs to, for the containment of its files."""
    here = path.absolute()
    for candidate in (here, *here.parents):
        if os.path.lexists(candidate / "pyproject.toml"):
            return candidate
    return None
