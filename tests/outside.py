"""What a command wrote where it must not: every entry under some folders (bytes, link target,
mode, mtime), taken before and after, the allowed folders (workdir, cache, patch dir) left out."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

Entry = tuple[str, int, int]


def tree_state(tops: Iterable[Path], allowed: Iterable[Path]) -> dict[str, Entry]:
    """``{path: (content or link target, mode, mtime_ns)}`` of everything under ``tops``
    except what lies under an ``allowed`` folder."""
    skip = {Path(p).absolute() for p in allowed}
    out: dict[str, Entry] = {}
    for top in tops:
        for dirpath, dirs, files in os.walk(top):
            here = Path(dirpath)
            dirs[:] = [d for d in dirs if here / d not in skip]
            for name in [*dirs, *files]:
                path = here / name
                if path in skip:
                    continue
                info = path.lstat()
                if path.is_symlink():
                    content = "-> " + str(path.readlink())
                elif path.is_file():
                    content = path.read_bytes().hex()
                else:
                    content = "dir"
                # a folder's mtime changes when an entry is made in it: a new file is seen by name
                out[str(path)] = (content, info.st_mode, 0 if content == "dir" else info.st_mtime_ns)
    return out


def written_outside(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """The paths that appeared, went or changed between two :func:`tree_state` calls."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
