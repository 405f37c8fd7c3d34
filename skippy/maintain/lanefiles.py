"""The core and model_support lanes as files of the patch dir, for ``invoke regenerate``.

The queue's patches are read as the range-diff's old side, valid or not (a file that is not a
regular file inside the project is left out, never read); the exported lanes are written over
the old ones, a file already holding the export's bytes left as it is and a link at a patch's
place replaced by a regular file, never written through.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from skippy.core.files import write_bytes_atomic
from skippy.maintain import rangediff
from skippy.queue.model import SERIES_LIMIT, queue_file_bytes


def loose_items(patch_dir: Path) -> list[rangediff.Item]:
    """The queue's patches as files, valid or not (the range-diff's old side); one that is not a
    regular file inside the project (a link to /etc/shadow) is left out, never read."""
    files = [("core", p.name, p) for p in sorted(patch_dir.glob("*.patch"))] if patch_dir.is_dir() else []
    for lane in ("model_support", "generated"):
        folder = patch_dir / lane
        if not folder.is_dir():
            continue
        series = folder / "series"
        listed = queue_file_bytes(series, SERIES_LIMIT) if series.is_file() else None
        names = (
            [
                n.strip()
                for n in listed.decode("utf-8", errors="replace").splitlines()
                if n.strip() and not n.startswith("#")
            ]
            if listed is not None
            else sorted(p.name for p in folder.glob("*.patch"))
        )
        files += [(lane, n, folder / n) for n in names]
    found = [(lane, name, queue_file_bytes(path) if path.is_file() else None) for lane, name, path in files]
    return [rangediff.Item(lane, name, data) for lane, name, data in found if data is not None]


def write_lanes(patch_dir: Path, core: list[Path], model_support: list[Path]) -> None:
    """Replace the core and model_support lanes with the exported files (other files stay).

    A file that already holds the export's bytes is not written at all (its mode and time stay); a
    changed one is rewritten in place, keeping its mode; a new one gets the umask's mode, as ``open``
    gives it.  A link at a patch's place is replaced by a regular file, never written through."""
    patch_dir.mkdir(parents=True, exist_ok=True)
    _write_lane(patch_dir, core)
    folder = patch_dir / "model_support"
    if model_support:
        folder.mkdir(exist_ok=True)
    if folder.is_dir():
        _write_lane(folder, model_support)
        series = folder / "series"
        if model_support:
            names = sorted(p.name for p in model_support)
            _put(series, "".join(n + "\n" for n in names).encode("utf-8"))
        else:
            with contextlib.suppress(FileNotFoundError):
                series.unlink()


def _write_lane(folder: Path, files: list[Path]) -> None:
    """``folder``'s ``*.patch`` files become exactly ``files`` (by name), each through :func:`_put`."""
    wanted = {path.name: path for path in files}
    for old in folder.glob("*.patch"):
        if old.name not in wanted:
            old.unlink()
    for name, path in wanted.items():
        _put(folder / name, path.read_bytes())


def _put(path: Path, data: bytes) -> None:
    """``path`` holds ``data``: untouched when it already does, else written by
    :func:`write_bytes_atomic` (a regular file keeps its mode, a new one gets the umask's, a link
    is replaced, never written through)."""
    if not path.is_symlink() and path.is_file() and path.read_bytes() == data:
        return
    write_bytes_atomic(path, data)
