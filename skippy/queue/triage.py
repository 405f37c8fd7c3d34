"""Conflict triage: try every patch of every lane against a target, report each one.

Runs in a temporary worktree that shares the workdir's object store; nothing
is left half-applied anywhere.  Classes:

* ``clean``: applies as it is;
* ``3way``: applies with the 3-way fallback (context moved);
* ``conflict``: 3-way merge leaves conflicts (paths and blamed upstream commits listed);
* ``preimage-missing``: the blobs the patch was made against are not in the
  repository ("could not build fake ancestor"), so no 3-way merge is possible;
* ``already-applied``: the patch's change is already in the target (drop candidate).

A patch that does not apply is skipped and the next ones are tried on top of
the ones that did, so one broken patch does not hide the rest of the picture.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.core.git import AM_ARGS, AM_ENV, Repo
from skippy.queue import workdir as wd
from skippy.queue.am_output import failed_paths, unmerged_paths
from skippy.queue.apply import add_sparse_worktree
from skippy.queue.imports import shown_sha, upstream_of
from skippy.queue.model import Patch, Queue

CLASSES = ("clean", "3way", "conflict", "preimage-missing", "already-applied")


@dataclass(frozen=True)
class Blame:
    sha: str
    subject: str


@dataclass(frozen=True)
class PatchVerdict:
    patch: str  # lane/name
    subject: str
    verdict: str
    paths: tuple[str, ...] = ()
    blamed: tuple[Blame, ...] = ()
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("clean", "3way")

    def as_dict(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "subject": self.subject,
            "verdict": self.verdict,
            "paths": list(self.paths),
            "blamed": [{"sha": b.sha, "subject": b.subject} for b in self.blamed],
            "detail": self.detail,
        }


@dataclass(frozen=True)
class TriageReport:
    target: str
    since: str | None
    verdicts: tuple[PatchVerdict, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def counts(self) -> dict[str, int]:
        return {c: sum(1 for v in self.verdicts if v.verdict == c) for c in CLASSES}

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "since": self.since,
            "ok": self.ok,
            "counts": self.counts(),
            "patches": [v.as_dict() for v in self.verdicts],
        }

    def render(self) -> str:
        width = max((len(v.patch) for v in self.verdicts), default=5)
        lines = [f"triage against {self.target[:12]}" + (f" (since {self.since[:12]})" if self.since else "")]
        lines.append(f"{'patch'.ljust(width)}  verdict")
        for v in self.verdicts:
            lines.append(f"{v.patch.ljust(width)}  {v.verdict}")
            if v.paths:
                lines.append(f"{'':{width}}    paths: {', '.join(v.paths)}")
            for blame in v.blamed:
                lines.append(f"{'':{width}}    upstream {blame.sha} {blame.subject}")
            if v.detail and not v.ok:
                lines.append(f"{'':{width}}    {v.detail}")
        counts = ", ".join(f"{n} {c}" for c, n in self.counts().items() if n)
        lines.append(f"summary: {counts or 'empty queue'}")
        return "\n".join(lines)


@contextlib.contextmanager
def aside_worktree(
    repo: Repo, git_dir: Path | None, commit: str, *, path: Path | None = None, only: Collection[str] | None = None
) -> Iterator[Repo]:
    """A temporary detached worktree at ``commit`` (at ``path``, else under the workdir's skippy
    folder in ``git_dir``), removed afterwards whatever happens. With ``only``, just those paths
    (files or folders) are written; the rest of the tree stays in the index, marked
    skip-worktree, so a commit made there still holds it (:func:`add_sparse_worktree`)."""
    if path is None:
        assert git_dir is not None, "an aside worktree needs a place: git_dir or path"
        root = wd.skippy_dir(git_dir) / "aside"
        root.mkdir(parents=True, exist_ok=True)
        path = root / uuid.uuid4().hex[:8]
    aside = Repo(path, repo.env, echo=repo.echo)
    if only is None:
        repo.git("worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        if only is not None:  # added here: a failed sparse checkout is removed with the rest
            add_sparse_worktree(repo, aside, commit, set(only))
        yield aside
    finally:
        repo.git("worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)
        repo.git("worktree", "prune", check=False)


def touched_paths(patch: Patch) -> tuple[str, ...]:
    paths: list[str] = []
    for line in patch.data.decode("utf-8", errors="replace").splitlines():
        if line.startswith("diff --git a/"):
            rest = line[len("diff --git a/") :]
            a, _, _b = rest.partition(" b/")
            if a not in paths:
                paths.append(a)
    return tuple(paths)


def try_patch(aside: Repo, patch: Patch) -> PatchVerdict:
    """Classify one patch against the aside worktree's HEAD; commit it when it applies."""
    forward = aside.git("apply", "--check", str(patch.path), check=False)
    if forward.ok:
        aside.git(*AM_ARGS, str(patch.path), env=AM_ENV)
        return PatchVerdict(patch.label, patch.subject, "clean")
    reverse = aside.git("apply", "--check", "--reverse", str(patch.path), check=False)
    if reverse.ok:
        return PatchVerdict(
            patch.label,
            patch.subject,
            "already-applied",
            paths=touched_paths(patch),
            detail="its change is already in the target: drop it from the queue",
        )
    result = aside.git(*AM_ARGS, str(patch.path), env=AM_ENV, check=False)
    if result.ok:
        return PatchVerdict(patch.label, patch.subject, "3way", paths=touched_paths(patch))
    output = result.stdout + result.stderr
    conflicts = unmerged_paths(aside)
    aside.git("am", "--abort", check=False)
    # without conflict markers, the paths git's errors name (whole), never every path the patch touches
    failed = failed_paths(output) or failed_paths(forward.stdout + forward.stderr) or touched_paths(patch)
    if "could not build fake ancestor" in output or "sha1 information is lacking" in output:
        return PatchVerdict(
            patch.label,
            patch.subject,
            "preimage-missing",
            paths=failed,
            detail="the blobs it was made against are unknown here: re-export it from a branch on this upstream",
        )
    return PatchVerdict(patch.label, patch.subject, "conflict", paths=conflicts or failed)


#: the detail of a conflict on a target known only from its source archive
NO_HISTORY: Final = (
    "no upstream history here (the target comes from its source archive): the upstream commits that touched "
    "these paths cannot be named"
)


def blame(repo: Repo, since: str | None, target: str, paths: tuple[str, ...], limit: int = 10) -> tuple[Blame, ...]:
    """Upstream commits between ``since`` and ``target`` that touched ``paths`` (none when
    ``target`` is the import of a source archive: it has no upstream history)."""
    if not paths or upstream_of(repo, target) is not None:
        return ()
    rev = target
    if since and repo.has_commit(since) and repo.is_ancestor(since, target):
        rev = f"{since}..{target}"
    out = repo.git(
        "log", f"--max-count={limit}", "--no-merges", "--format=%h%x00%s", rev, "--", *paths, check=False
    ).stdout
    blamed: list[Blame] = []
    for line in out.splitlines():
        sha, _, subject = line.partition("\0")
        if sha:
            blamed.append(Blame(sha, subject))
    return tuple(blamed)


def triage(repo: Repo, git_dir: Path, queue: Queue, target: str, since: str | None) -> TriageReport:
    """Try every patch of ``queue`` on ``target`` (a local commit) in a temporary worktree.

    The work uses the local commits; the report names the upstream SHAs they stand for (an
    archive import's ``Upstream-Commit``), which is what a user can look up."""
    verdicts: list[PatchVerdict] = []
    no_history = upstream_of(repo, target) is not None
    with aside_worktree(repo, git_dir, target) as aside:
        for patch in queue.patches:
            verdict = try_patch(aside, patch)
            if verdict.verdict == "conflict":
                verdict = PatchVerdict(
                    verdict.patch,
                    verdict.subject,
                    verdict.verdict,
                    paths=verdict.paths,
                    blamed=blame(repo, since, target, verdict.paths),
                    detail=NO_HISTORY if no_history else verdict.detail,
                )
            verdicts.append(verdict)
    return TriageReport(
        target=shown_sha(repo, target),
        since=shown_sha(repo, since) if since else None,
        verdicts=tuple(verdicts),
    )
