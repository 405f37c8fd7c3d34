"""The queue tried on a commit in a temporary index: no work tree, no checkout.

Triage semantics: a patch that does not apply (``git apply --cached --3way``) is left out, the
index put back as it was before it, and the next patches are tried on top of the rest. The pin
move's bisection asks only which patches apply; the map by function also wants the tree before
and after each one.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.core.git import Repo
from skippy.queue.model import Patch


@dataclass(frozen=True)
class Step:
    """One patch tried: whether it applied, and (when trees were asked for) the trees around it."""

    applied: bool
    before: str | None = None
    after: str | None = None


class IndexApplier:
    """Tries patches on commits in one temporary index under ``scratch`` (named ``name``); the
    verdicts of a commit are kept, so a bisection asks each commit once."""

    def __init__(self, repo: Repo, scratch: Path, name: str = "queue") -> None:
        self.repo = repo
        self.index = scratch / f"{name}.index"
        self.backup = scratch / f"{name}.index.bak"
        self.env = {"GIT_INDEX_FILE": str(self.index)}
        self.cache: dict[str, tuple[bool, ...]] = {}

    def verdicts(self, commit: str, patches: Sequence[Patch]) -> tuple[bool, ...]:
        """Whether each patch applies on ``commit`` after the ones before it that did."""
        if commit not in self.cache:
            self.cache[commit] = tuple(step.applied for step in self.steps(commit, patches))
        return self.cache[commit]

    def steps(self, commit: str, patches: Sequence[Patch], *, trees: bool = False) -> list[Step]:
        """Each patch tried on ``commit`` in turn; with ``trees``, the tree before and after each
        patch that applied (one ``write-tree`` each)."""
        self.repo.git("read-tree", commit, env=self.env)
        tree = self.repo.git("write-tree", env=self.env).stdout.strip() if trees else None
        out: list[Step] = []
        for patch in patches:
            shutil.copyfile(self.index, self.backup)
            if not self.repo.git("apply", "--cached", "--3way", str(patch.path), env=self.env, check=False).ok:
                shutil.copyfile(self.backup, self.index)
                out.append(Step(False))
                continue
            after = self.repo.git("write-tree", env=self.env).stdout.strip() if trees else None
            out.append(Step(True, tree, after))
            tree = after
        return out
