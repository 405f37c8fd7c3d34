"""The generated lane's files: as the generator makes them, on disk, and the drift between the two.

A file of the lane on disk is read only when it is a regular file inside the project (a link
out of it is never read, and differs from anything); writing the lane replaces links by regular
files, never writing through them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.files import write_bytes_atomic
from skippy.core.paths import NotSmallFile, enclosing_project, read_small_bytes
from skippy.maintain.genmanifest import manifest_lines
from skippy.maintain.genspec import Family
from skippy.queue.model import PATCH_LIMIT

INPUTS_NAME = "inputs.sha256"
SERIES_NAME = "series"


#: the largest spec, inputs manifest or series of the lane read (a patch: the queue's own limit)
LANE_FILE_LIMIT = 1024 * 1024


@dataclass(frozen=True)
class GeneratedLane:
    """The lane's files (name -> bytes) as the generator makes them, and the inputs manifest."""

    files: Mapping[str, bytes]
    manifest: str
    families: tuple[Family, ...] = ()
    #: patch file name -> family name
    owners: Mapping[str, str] = field(default_factory=dict)
    #: family name -> the tree files its patch changes
    shard_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def read_lane_file(path: Path, inside: Path | None) -> bytes | None:
    """The bytes of one file of the generated lane, or None when it is not a regular file
    inside the project (never read: a link out of the project counts as a file that differs)."""
    container = inside or enclosing_project(path.parent) or path.parent.resolve()
    limit = LANE_FILE_LIMIT if not path.name.endswith(".patch") else PATCH_LIMIT
    try:
        return read_small_bytes(path, limit, inside=container)
    except (NotSmallFile, FileNotFoundError):
        return None


def lane_files_on_disk(folder: Path, *, inside: Path | None = None) -> dict[str, bytes | None]:
    """The lane's patches and series on disk: name -> bytes (None for one that is not a regular
    file inside the project ``inside``: it is never read, and differs from anything)."""
    if not folder.is_dir():
        return {}
    return {
        p.name: read_lane_file(p, inside)
        for p in sorted(folder.iterdir())
        if p.is_file() and (p.name.endswith(".patch") or p.name == SERIES_NAME)
    }


def write_lane(folder: Path, lane: GeneratedLane) -> list[str]:
    """Replace the lane's patches, series and inputs manifest (the spec stays); the names of the
    files that were symlinks (each replaced by a regular file, never written through: its target,
    wherever it is, is left as it was)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {*lane.files, INPUTS_NAME}
    links = sorted(name for name in written if (folder / name).is_symlink())
    # stale patches go, and the links among the names (a dangling one is not is_file(): the write
    # would create its target)
    dangling = {p.name for p in folder.iterdir() if p.is_symlink() and _lane_file(p.name)}
    for name in {*lane_files_on_disk(folder), *dangling, *links}:
        (folder / name).unlink()
    for name, data in lane.files.items():
        write_bytes_atomic(folder / name, data)
    write_bytes_atomic(folder / INPUTS_NAME, lane.manifest.encode("utf-8"))
    return links


def _lane_file(name: str) -> bool:
    return name.endswith(".patch") or name == SERIES_NAME


@dataclass(frozen=True)
class Drift:
    drifted: tuple[str, ...]  # family names whose patch differs or is missing
    extra: tuple[str, ...]  # checked-in patch files no family makes
    series: bool
    inputs: tuple[str, ...]  # manifest inputs that changed (or "missing")
    #: family name -> the tree files its patch changes (as the generator makes it now)
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.drifted or self.extra or self.series or self.inputs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "drifted_families": list(self.drifted),
            "drifted_files": {name: list(self.files.get(name, ())) for name in self.drifted},
            "extra_patches": list(self.extra),
            "series_differs": self.series,
            "changed_inputs": list(self.inputs),
        }

    def render(self) -> str:
        if self.ok:
            return "generated lane: up to date"
        lines = ["generated lane: DRIFTED"]
        if self.drifted:
            lines.append(f"  families whose patch differs: {', '.join(self.drifted)}")
        if self.extra:
            lines.append(f"  patches no family makes: {', '.join(self.extra)}")
        if self.series:
            lines.append("  series differs")
        if self.inputs:
            lines.append(f"  inputs changed since the last `invoke generate`: {', '.join(self.inputs)}")
        return "\n".join(lines)


def compare_lane(folder: Path, lane: GeneratedLane, *, inside: Path | None = None) -> Drift:
    """What differs between the lane on disk (files inside the project ``inside`` only) and ``lane``."""
    on_disk = lane_files_on_disk(folder, inside=inside)
    drifted = [lane.owners[n] for n in lane.owners if on_disk.get(n) != lane.files[n]]
    extra = sorted(n for n in on_disk if n.endswith(".patch") and n not in lane.files)
    series = on_disk.get(SERIES_NAME, b"") != lane.files.get(SERIES_NAME, b"")
    recorded_path = folder / INPUTS_NAME
    data = read_lane_file(recorded_path, inside) if os.path.lexists(recorded_path) else None
    recorded = manifest_lines(data.decode("utf-8", errors="replace")) if data is not None else None
    if recorded is None:
        missing = not os.path.lexists(recorded_path)
        inputs = [f"{INPUTS_NAME} {'missing' if missing else 'not a regular file of the project (not read)'}"]
    else:
        wanted = manifest_lines(lane.manifest)
        inputs = [k for k in wanted if k != "sha256" and not k.startswith("shard ") and recorded.get(k) != wanted[k]]
        inputs += [f"{k} (no longer read)" for k in recorded if k not in wanted and not k.startswith("shard ")]
        # a shard whose recorded digest is not the checked-in patch's: the patch was edited by hand
        for name, family in lane.owners.items():
            got = on_disk.get(name)
            key = f"shard {name}"
            edited = got is not None and key in recorded and recorded[key] != hashlib.sha256(got).hexdigest()
            if edited and family not in drifted:
                drifted.append(family)
    return Drift(tuple(drifted), tuple(extra), series, tuple(inputs), dict(lane.shard_files))
