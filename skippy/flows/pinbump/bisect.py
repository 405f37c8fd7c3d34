"""``invoke bisect``: the newest upstream commit between the pin and a target on which the whole
queue still applies, and for each patch that fails at the target the first upstream commit that
breaks it.

Commits are tested in a temporary index (``git apply --cached --3way``): nothing is checked out.
The report also names the drop candidates, patches the target already carries
(:mod:`skippy.maintain.carried`), and turns its findings into annotations on the patch files.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.annotations import Annotation, patch_line
from skippy.core.errors import ConflictError, SettingsError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump.sides import repo_for, target_of, upstream_pin
from skippy.maintain.carried import Carried, carried_patches
from skippy.queue.indexapply import IndexApplier
from skippy.queue.model import Patch, Queue, load_queue
from skippy.queue.prepare import resolve_target
from skippy.queue.scratch import owned_scratch


@dataclass(frozen=True)
class Breaker:
    patch: str
    subject: str
    commit: str | None  # first upstream commit after the pin where the patch no longer applies
    commit_subject: str | None


@dataclass(frozen=True)
class BisectReport:
    pin: str
    target: str
    tested: int
    candidates: int
    newest_compatible: str
    newest_compatible_subject: str
    breakers: tuple[Breaker, ...] = field(default=())
    #: patches the target already carries, all or some of their hunks (drop candidates)
    carried: tuple[Carried, ...] = field(default=())

    @property
    def target_applies(self) -> bool:
        return self.newest_compatible == self.target

    def as_dict(self) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "target": self.target,
            "commits_between": self.candidates,
            "commits_tested": self.tested,
            "newest_compatible": self.newest_compatible,
            "newest_compatible_subject": self.newest_compatible_subject,
            "target_applies": self.target_applies,
            "breakers": [
                {"patch": b.patch, "subject": b.subject, "commit": b.commit, "commit_subject": b.commit_subject}
                for b in self.breakers
            ],
            "drop_candidates": [c.as_dict() for c in self.carried],
        }

    def render(self) -> str:
        lines = [
            f"bisect {self.pin[:12]}..{self.target[:12]}: {self.candidates} upstream commit(s), {self.tested} tested",
            f"newest upstream commit the whole queue applies to: {self.newest_compatible[:12]} "
            f"{self.newest_compatible_subject}" + (" (the target itself)" if self.target_applies else ""),
        ]
        for b in self.breakers:
            where = f"{b.commit[:12]} {b.commit_subject}" if b.commit else "(no single commit found)"
            lines.append(f"  {b.patch} first breaks at {where}")
        if self.carried:
            lines.append(f"drop candidates (upstream already carries them, at {self.target[:12]}):")
            lines += [f"  {c.describe()}" for c in self.carried]
        return "\n".join(lines)

    def annotations(self, patches: Sequence[Patch], relative: Callable[[Path], str]) -> list[Annotation]:
        """The breakers (errors) and the drop candidates (warnings), on their patch files."""
        by_label = {p.label: p for p in patches}
        out: list[Annotation] = []
        for b in self.breakers:
            if b.patch in by_label:
                where = f"{b.commit[:12]} {b.commit_subject}" if b.commit else "the target"
                out.append(
                    _on_patch(by_label[b.patch], relative, "does not apply", f"first breaks at {where}", "error")
                )
        out += [carried_annotation(c, by_label.get(c.patch), relative) for c in self.carried]
        return out


def _on_patch(patch: Patch, relative: Callable[[Path], str], title: str, message: str, level: str) -> Annotation:
    """An annotation on ``patch``'s first file diff."""
    first = re.search(rb"^diff --git a/.* b/(.*)$", patch.data, re.M)
    path = first.group(1).decode("utf-8", "replace") if first else ""
    return Annotation(relative(patch.path), patch_line(patch.data, path) if first else None, title, message, level)


def carried_annotation(carried: Carried, patch: Patch | None, relative: Callable[[Path], str]) -> Annotation:
    title = "drop candidate: upstream already carries it"
    if patch is None:
        return Annotation(relative(carried.path), None, title, carried.describe())
    return _on_patch(patch, relative, title, carried.describe(), "warning")


def _first_parent_range(repo: Repo, pin: str, target: str) -> list[str]:
    out = repo.git("rev-list", "--first-parent", "--reverse", f"{pin}..{target}").stdout
    return [line for line in out.splitlines() if line]


def _subject(repo: Repo, sha: str) -> str:
    return repo.git("log", "-1", "--format=%s", sha).stdout.strip()


def _last_holding(good: int, bad: int, holds: Callable[[int], bool]) -> int:
    """The last index in ``good..bad`` where ``holds`` is true, given it holds at ``good`` and not at
    ``bad`` and never again once it stops (the bisection invariant)."""
    while bad - good > 1:
        mid = (good + bad) // 2
        if holds(mid):
            good = mid
        else:
            bad = mid
    return good


def bisect_queue(repo: Repo, queue: Queue, pin: str, target: str, *, scratch: Path) -> BisectReport:
    """Binary searches over the first-parent line ``pin..target`` (local commits).

    Assumes, as git bisect does, that once a patch stops applying it stays broken.
    """
    if not repo.is_ancestor(pin, target):
        raise SettingsError(
            f"{target[:12]} does not descend from the pin {pin[:12]}: there is no line of commits to bisect",
            untouched="everything",
            next_step="bisect towards a descendant of the pin (`invoke bisect --to <ref>`)",
        )
    applier = IndexApplier(repo, scratch, "bisect")
    patches = queue.patches
    line = [pin, *_first_parent_range(repo, pin, target)]
    at_pin = applier.verdicts(pin, patches)
    if not all(at_pin):
        failing = [p.label for p, ok in zip(patches, at_pin, strict=True) if not ok]
        raise ConflictError(
            f"the queue does not apply to the pin itself ({', '.join(failing)})",
            untouched="everything",
            next_step="fix the queue against the pin first (`invoke prepare --triage`)",
        )

    def whole(i: int) -> bool:
        return all(applier.verdicts(line[i], patches))

    def applies(index: int, i: int) -> bool:
        return applier.verdicts(line[i], patches)[index]

    last = len(line) - 1
    lo = last if whole(last) else _last_holding(0, last, whole)
    (scratch / "carried").mkdir(exist_ok=True)
    carried = carried_patches(repo, queue, pin, target, scratch=scratch / "carried")
    breakers: list[Breaker] = []
    at_target = applier.verdicts(line[-1], patches)
    for index, (patch, ok) in enumerate(zip(patches, at_target, strict=True)):
        if ok:
            continue
        commit = line[_last_holding(0, last, functools.partial(applies, index)) + 1]
        breakers.append(Breaker(patch.label, patch.subject, commit, _subject(repo, commit)))
    return BisectReport(
        pin=pin,
        target=target,
        tested=len(applier.cache),
        candidates=len(line) - 1,
        newest_compatible=line[lo],
        newest_compatible_subject=_subject(repo, line[lo]),
        breakers=tuple(breakers),
        carried=carried,
    )


def run_bisect(settings: Settings, *, to: str | None, console: Console) -> BisectReport:
    """``invoke bisect``: the queue bisected from the pin to ``to`` (default: upstream master)."""
    repo = repo_for(settings, console)
    _pin, pin_base = upstream_pin(settings, repo, console)
    _up, target, _src = resolve_target(settings, repo, target_of(to), console=console)
    queue = load_queue(settings.patch_dir)
    with owned_scratch(settings.cache_dir / "tmp", "bisect-") as tmp:
        return bisect_queue(repo, queue, pin_base, target, scratch=tmp)
