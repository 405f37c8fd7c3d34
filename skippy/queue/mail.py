"""The ``Skippy-Patch`` trailer: which lane and patch file a commit of the workdir came from.

Every commit that prepare applies carries ``Skippy-Patch: <lane>/<file name>`` as the last
line of its message, so the workdir's history says by itself which commit belongs where:
``invoke regenerate`` needs no branch names, a ``git commit --fixup`` squashed in with
``git rebase -i --autosquash`` keeps its target's trailer, and a commit without one is
the maintainer's new work.  The trailer never reaches the queue: the lanes are exported
with it removed (:func:`untag`), byte for byte what the patch file held.

Both functions work on the mailbox text (``git format-patch`` output) as bytes, so a
patch in any encoding passes through unchanged.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from skippy.queue import workdir as wd
from skippy.queue.model import Patch

TRAILER: Final = "Skippy-Patch"
_TRAILER_LINE = re.compile(rb"^" + TRAILER.encode() + rb":[ \t]*(\S+)[ \t]*\r?$")
#: a ``Key: value`` line of a trailer block (git's own definition, without its exceptions)
_TRAILER_LIKE = re.compile(rb"^[A-Za-z0-9][A-Za-z0-9-]*:[ \t]")


def _split(data: bytes) -> tuple[list[bytes], int, int] | None:
    """``(lines, first body line, end of the message)`` of a mailbox patch: the message runs from
    after the header's blank line to the ``---`` line (or the first ``diff --git``)."""
    lines = data.split(b"\n")
    try:
        blank = next(i for i, line in enumerate(lines) if not line.strip(b"\r"))
    except StopIteration:
        return None
    for end in range(blank + 1, len(lines)):
        line = lines[end].rstrip(b"\r")
        if line == b"---" or line.startswith(b"diff --git "):
            return lines, blank + 1, end
    return None


def tag(data: bytes, label: str) -> bytes:
    """The mailbox patch with ``Skippy-Patch: <label>`` appended to its message (joining a trailer
    block that ends the message, else as a paragraph of its own)."""
    parts = _split(data)
    if parts is None:
        return data
    lines, start, end = parts
    body = list(lines[start:end])
    while body and not body[-1].strip(b"\r"):
        body.pop()
    eol = b"\r" if lines[end].endswith(b"\r") else b""
    trailer = f"{TRAILER}: {label}".encode() + eol
    paragraph: list[bytes] = []
    for line in reversed(body):
        if not line.strip(b"\r"):
            break
        paragraph.append(line)
    joins = bool(paragraph) and len(paragraph) < len(body) and all(_TRAILER_LIKE.match(x) for x in paragraph)
    if body and not joins:
        body.append(eol)
    body.append(trailer)
    return b"\n".join([*lines[:start], *body, *lines[end:]])


def untag(data: bytes) -> bytes:
    """``data`` without its ``Skippy-Patch`` line(s) (and the blank line :func:`tag` put before a
    trailer that stood alone): the inverse of :func:`tag` on ``git format-patch`` output."""
    parts = _split(data)
    if parts is None:
        return data
    lines, start, end = parts
    body = lines[start:end]
    kept: list[bytes] = []
    for i, line in enumerate(body):
        if _TRAILER_LINE.match(line):
            alone = i + 1 == len(body) or not body[i + 1].strip(b"\r")
            if alone and kept and not kept[-1].strip(b"\r"):
                kept.pop()
            continue
        kept.append(line)
    if len(kept) == len(body):
        return data
    return b"\n".join([*lines[:start], *kept, *lines[end:]])


def label_of(message: str) -> str | None:
    """The ``<lane>/<file>`` a commit message's ``Skippy-Patch`` trailer names, or None."""
    found = None
    for line in message.splitlines():
        match = _TRAILER_LINE.match(line.encode("utf-8", errors="replace"))
        if match:
            found = match.group(1).decode("utf-8", errors="replace")
    return found


def tagged_copies(patches: tuple[Patch, ...] | list[Patch], folder: Path) -> list[Path]:
    """Each patch written to ``folder`` with its trailer, in order (the files ``git am`` applies)."""
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for index, patch in enumerate(patches, start=1):
        path = folder / f"{index:04d}-{patch.name}"
        path.write_bytes(tag(patch.data, patch.label))
        out.append(path)
    return out


@contextlib.contextmanager
def tagged(git_dir: Path, patches: tuple[Patch, ...] | list[Patch]) -> Iterator[list[Path]]:
    """:func:`tagged_copies` in a scratch folder of ``git_dir`` removed afterwards."""
    root = wd.skippy_dir(git_dir)
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="mail-", dir=root))
    try:
        yield tagged_copies(patches, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
