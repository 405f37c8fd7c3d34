"""Dropping patches from the queue (``invoke pin-bump --drop LABEL``): the patch file goes, and
its line in its lane's ``series`` (comments, blank lines and the other entries stay).

The core patches after a dropped one are renumbered (their numbers run 0001.. without gaps).
A dropped patch is not lost: it is a file of the project's own git history (``git checkout --
<file>`` brings it back); the caller says so.  The generated lane is not dropped from: it is
rewritten whole by ``invoke generate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import SettingsError
from skippy.core.files import write_bytes_atomic, write_text_atomic
from skippy.queue.model import NUMBERED, Lane, Patch, Queue


def find_patches(queue: Queue, labels: Sequence[str], *, flag: str) -> tuple[Patch, ...]:
    """The patches ``labels`` name (``core/0003-x.patch``, or a file name the queue holds once),
    or an error naming ``flag`` and every label it does not know."""
    by_label = {p.label: p for p in queue.patches}
    by_name: dict[str, list[Patch]] = {}
    for p in queue.patches:
        by_name.setdefault(p.name, []).append(p)
    found: list[Patch] = []
    unknown: list[str] = []
    for label in labels:
        patch = by_label.get(label)
        if patch is None and len(by_name.get(label, [])) == 1:
            patch = by_name[label][0]
        if patch is None:
            unknown.append(label)
        elif patch not in found:
            found.append(patch)
    if unknown:
        raise SettingsError(
            f"{flag} {', '.join(unknown)}: no such patch in the queue (give a label as reports show it, "
            f"e.g. {queue.patches[0].label if queue.patches else 'core/0001-x.patch'})",
            untouched="everything: the pin and the queue",
            next_step="list the queue's patches with `invoke status`, then re-run with one of them",
        )
    return tuple(found)


@dataclass(frozen=True)
class Dropped:
    """Patches taken out of the queue, with what :meth:`restore` needs to put them back."""

    patches: tuple[Patch, ...]
    #: each rewritten series file, with its bytes before
    series: tuple[tuple[Path, bytes], ...] = ()
    #: the core patches renumbered after the dropped ones (numbers run without gaps): (from, to)
    renamed: tuple[tuple[Path, Path], ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.patches)

    def restore(self) -> None:
        """Every dropped patch file, series line and core number back, byte for byte."""
        for before, after in reversed(self.renamed):
            after.rename(before)
        for path, data in self.series:
            write_bytes_atomic(path, data)
        for patch in self.patches:
            write_bytes_atomic(patch.path, patch.data)


def drop_patches(patches: Sequence[Patch]) -> Dropped:
    """Remove ``patches`` from the queue (patch files removed, series lines taken out)."""
    generated = [p.label for p in patches if p.lane is Lane.GENERATED]
    if generated:
        raise SettingsError(
            f"--drop {', '.join(generated)}: the generated lane is not edited by hand",
            untouched="everything: the pin and the queue",
            next_step="remove the family from generated/families.toml, run `invoke generate`, then re-run the bump",
        )
    saved: list[tuple[Path, bytes]] = []
    listed = [p for p in patches if p.lane is Lane.MODEL_SUPPORT]
    if listed:
        series = listed[0].path.parent / "series"
        names = {p.name for p in listed}
        before = series.read_bytes()
        lines = before.decode("utf-8").splitlines(keepends=True)
        write_text_atomic(series, "".join(line for line in lines if line.strip() not in names))
        saved.append((series, before))
    for patch in patches:
        patch.path.unlink()
    core = [p for p in patches if p.lane is Lane.CORE]
    renamed = _renumber(core[0].path.parent) if core else ()
    return Dropped(tuple(patches), tuple(saved), renamed)


def _renumber(folder: Path) -> tuple[tuple[Path, Path], ...]:
    """Core patch numbers run 0001.. without gaps: the ones after a dropped patch move down."""
    numbered = sorted(p for p in folder.iterdir() if p.is_file() and NUMBERED.match(p.name))
    renamed: list[tuple[Path, Path]] = []
    for number, path in enumerate(numbered, start=1):
        match = NUMBERED.match(path.name)
        assert match is not None
        if int(match["num"]) != number:
            target = path.with_name(f"{number:04d}-{match['slug']}.patch")
            path.rename(target)
            renamed.append((path, target))
    return tuple(renamed)
