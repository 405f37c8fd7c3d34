"""A write the file system refused, as skippy tells the user about it: the OS's words in a
command's output or an exception, and the file system that holds the path (its mount point,
size and free space).

:func:`disk_problem` reads git's and the OS's lines (``...: No space left on device``, git's own
``write error. Out of diskspace``) and not a line that only mentions them (a patch subject);
:func:`oserror_problem` reads Python's exception; :func:`file_system_of` says where the space
ran out. :mod:`skippy.queue.guard` turns them into the error the user sees.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: what the OS says when a write cannot happen, as git and Python print it (C locale)
DISK_CAUSES: tuple[str, ...] = (
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Permission denied",
)


_DISK_LINE = re.compile(r":\s*(" + "|".join(map(re.escape, DISK_CAUSES)) + r")\s*$")


@dataclass(frozen=True)
class DiskProblem:
    """A write the file system refused: the cause as the OS names it, and the path when known."""

    cause: str
    path: str | None
    line: str

    @property
    def full(self) -> bool:
        return self.cause in ("No space left on device", "Disk quota exceeded")


#: git's own words for a full disk where it writes a file (``sha1 file '<path>' write error. Out
#: of diskspace``: a checkout that filled the disk says only this, and ``unable to write file``)
_GIT_FULL_LINE = re.compile(r"write error\. Out of diskspace\s*$")


def disk_problem(output: str) -> DiskProblem | None:
    """The first line of a command's output that says a local write was refused, if any.

    git ends such a line with the OS's words (``...: No space left on device``), or with its own
    ``write error. Out of diskspace``; a line that only mentions them (a patch subject, ssh's
    ``Permission denied (publickey).``) is not one.
    """
    for line in output.splitlines():
        match = _DISK_LINE.search(line)
        cause = match.group(1) if match else "No space left on device" if _GIT_FULL_LINE.search(line) else None
        if cause:
            quoted = re.search(r"'([^']+)'", line)
            return DiskProblem(cause, quoted.group(1) if quoted else None, line.strip())
    return None


@dataclass(frozen=True)
class FileSystem:
    """The file system that holds a path: where it is mounted, its size and what is free."""

    mount_point: Path
    size: int
    free: int

    def describe(self) -> str:
        return f"{_size(self.free)} free of {_size(self.size)}"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def file_system_of(path: Path) -> FileSystem | None:
    """The file system of ``path`` (or of its nearest existing parent: the path may be gone, a
    scratch folder removed after the failure): its mount point (the top folder on the same
    device), size and free space; None when nothing of the path can be read."""
    here = path.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        device = here.stat().st_dev
        while here != here.parent and here.parent.stat().st_dev == device:
            here = here.parent
        info = os.statvfs(here)
    except OSError:
        return None
    return FileSystem(here, info.f_blocks * info.f_frsize, info.f_bavail * info.f_frsize)


def oserror_problem(exc: OSError) -> DiskProblem:
    path = exc.filename if isinstance(exc.filename, str) else None
    cause = exc.strerror or type(exc).__name__
    return DiskProblem(cause, path, str(exc))
