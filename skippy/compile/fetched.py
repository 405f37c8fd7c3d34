"""Made once under the project cache: a toolkit a backend fetches (the CUDA toolkit from
wheels, Debian's newer Vulkan headers, the ROCm Debian root).

:func:`fetch_once` is the one pattern the three share.  Under a file lock beside ``home``
(another process may be making the same toolkit), a finished ``home`` is reused: its
``complete.json`` marker (written last) is read and the caller's ``done`` says whether it
is the toolkit asked for.  Otherwise the leftovers of an interrupted run (``home`` without a
marker, ``<home>.partial-*`` folders beside it) are removed, the caller's ``make`` fills a
fresh ``<home>.partial-*`` folder and returns what the marker records, the marker is written
there, and the folder is renamed into place.  A folder without the marker is never used.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from skippy.compile.rootfs import remove_tree
from skippy.core.errors import BuildError
from skippy.core.files import made_once

T = TypeVar("T")

#: the file that marks a finished toolkit, written last
MARKER: Final = "complete.json"
MARKER_SCHEMA: Final = 1


def read_marker(home: Path) -> dict[str, Any] | None:
    """What the marker of a finished ``home`` records (without its schema), or None (absent,
    unreadable, another schema)."""
    try:
        data = json.loads((home / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != MARKER_SCHEMA:
        return None
    return {key: value for key, value in data.items() if key != "schema"}


def write_marker(folder: Path, record: Mapping[str, Any]) -> None:
    text = json.dumps({"schema": MARKER_SCHEMA, **record}, indent=2, sort_keys=True) + "\n"
    (folder / MARKER).write_text(text, encoding="utf-8")


def fetch_once(
    home: Path,
    *,
    done: Callable[[Path, Mapping[str, Any]], T | None],
    make: Callable[[Path], Mapping[str, Any]],
    what: str,
    timeout: float,
    remove: Callable[[Path], None] = remove_tree,
    check: Callable[[], None] = lambda: None,
) -> tuple[T, bool]:
    """``(the toolkit at home, whether it was made now)``.

    ``done(home, record)`` is the toolkit a finished ``home`` holds when its marker's record
    is the one asked for, else None.  ``make(folder)`` fills ``folder`` (beside ``home``, made
    0755 so other users' runners can read it) and returns the record for the marker.
    ``remove`` deletes leftovers (never through a mount: :func:`skippy.compile.rootfs.remove_tree`);
    ``check`` raises when the toolkit cannot be made here, before anything is removed or made."""

    def finished() -> T | None:
        record = read_marker(home)
        return done(home, record) if record is not None else None

    made: list[bool] = []

    def make_locked() -> T:
        check()
        for stale in home.parent.glob(f"{home.name}.partial-*"):
            remove(stale)
        if home.exists():
            remove(home)
        partial = Path(tempfile.mkdtemp(prefix=f"{home.name}.partial-", dir=home.parent))
        partial.chmod(0o755)
        try:
            record = make(partial)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.rmdir()  # nothing made yet (a check failed first); else the next run removes it
            raise
        write_marker(partial, record)
        partial.rename(home)
        found = done(home, record)
        if found is None:
            raise BuildError(
                f"{what}: the finished folder {home} is not what its own marker records",
                untouched=f"{home} is kept for inspection",
                next_step=f"remove {home} and run the build again",
            )
        made.append(True)
        return found

    result = made_once(home, done=finished, make=make_locked, what=what, timeout=timeout)
    return result, bool(made)
