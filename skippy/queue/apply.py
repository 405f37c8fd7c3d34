"""Steps that apply the queue and move the workdir: ``git am --3way`` lane by lane, in a
temporary worktree or a fresh checkout; the switch to the patched commit; the stamp."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path

from skippy.core.annotations import Annotation, patch_line
from skippy.core.errors import ConflictError
from skippy.core.git import AM_ARGS, AM_ENV, Repo
from skippy.queue import workdir as wd
from skippy.queue.am_output import failed_paths, unmerged_paths, without_am_hints
from skippy.queue.imports import shown_sha
from skippy.queue.mail import tagged
from skippy.queue.model import LANES, Lane, Patch, Queue
from skippy.queue.run import Run
from skippy.queue.upstream import Resolved


def apply_lanes(run: Run, queue: Queue, repo: Repo, git_dir: Path, where: str) -> str:
    """Apply the lanes in order on ``repo``'s HEAD; the patched commit.  Raises ConflictError
    (the ``git am`` aborted: ``repo`` is back at its HEAD)."""
    for lane in LANES:
        patches = queue.lane(lane)
        if not patches:
            continue
        with (
            run.console.step(
                f"git am --3way: {lane.value} lane ({len(patches)} patch{'es' if len(patches) != 1 else ''}) in {where}"
            ),
            tagged(git_dir, patches) as mails,
        ):
            result = repo.git(*AM_ARGS, *map(str, mails), env=AM_ENV, check=False)
        if not result.ok:
            raise failed_lane(run, repo, git_dir, lane=lane, patches=patches, output=result.tail())
    head = repo.head()
    assert head is not None
    return head


def failed_lane(
    run: Run, repo: Repo, git_dir: Path, *, lane: Lane, patches: tuple[Patch, ...], output: str
) -> ConflictError:
    """The error of a lane whose ``git am`` stopped, naming the patch and its paths; aborts the am."""
    failed: Patch | None = None
    with contextlib.suppress(OSError, ValueError):
        index = int((git_dir / "rebase-apply" / "next").read_text().strip())
        failed = patches[index - 1]
    conflicts = unmerged_paths(repo)
    failed_here = () if conflicts else failed_paths(output)
    repo.git("am", "--abort", check=False)
    name = failed.label if failed else f"a patch of the {lane.value} lane"
    where = ""
    if conflicts:
        where = f" (conflicts in {', '.join(conflicts)})"
    elif failed_here:
        where = f" (git could not apply it to {', '.join(failed_here)}; no conflict markers)"
    error = ConflictError(
        f"{name} does not apply" + (f": {failed.subject}" if failed and failed.subject else "") + where,
        details=without_am_hints(output),
        untouched=f"{run.rel(run.workdir)} was left as it was before this run; no stamp was written",
        next_step="refresh that patch against the new upstream (edit it, or carry the fix on a branch and "
        "run `invoke regenerate`), then re-run `invoke prepare`",
    )
    if failed is not None:
        files = conflicts or failed_here
        line = patch_line(failed.data, files[0]) if files else None
        error.annotations = (Annotation(run.rel(failed.path), line, "does not apply", error.what, level="error"),)
    return error


def apply_aside(run: Run, queue: Queue, repo: Repo, git_dir: Path, base: str) -> str:
    """The patched commit of ``queue`` on ``base``, built in a temporary worktree sharing the
    object store; ``repo``'s own checkout is not touched."""
    aside_root = wd.skippy_dir(git_dir) / "aside"
    aside_root.mkdir(parents=True, exist_ok=True)
    aside = aside_root / uuid.uuid4().hex[:8]
    with run.console.step(f"check out {shown_sha(repo, base)[:12]} in a temporary worktree"):
        repo.git("worktree", "add", "--detach", "--quiet", str(aside), base)
    try:
        aside_repo = run.repo(aside)
        aside_git = Path(aside_repo.out("rev-parse", "--absolute-git-dir"))
        return apply_lanes(run, queue, aside_repo, aside_git, "a temporary worktree")
    finally:
        repo.git("worktree", "remove", "--force", str(aside), check=False)
        shutil.rmtree(aside, ignore_errors=True)
        repo.git("worktree", "prune", check=False)


def changed_paths(repo: Repo, old: str, new: str) -> list[str]:
    out = repo.git("diff", "--name-only", "--no-renames", "-z", old, new).stdout
    return [p for p in out.split("\0") if p]


def switch(
    run: Run, queue: Queue, repo: Repo, git_dir: Path, *, head: str | None, patched: str, at: Resolved
) -> int | None:
    """Move the workdir to ``patched``; git rewrites only files whose content differs.

    The journal records everything the stamp needs, so an interrupted switch is finished
    and stamped by the next run.  The number of files that differ (None without a HEAD)."""
    changed = changed_paths(repo, head, patched) if head else None
    entry = wd.Journal(
        "switch", head, patched, at.upstream_sha, base=at.base, queue_digest=queue.digest, source=at.source
    )
    said = [f"{len(changed)} file(s) differ"] if changed is not None else []
    if run.reverted:
        said.append(f"--force reverted {len(run.reverted)} file(s) before")
    with (
        wd.journal(git_dir, entry),
        run.console.step(f"move {run.rel(run.workdir)} to {patched[:12]}" + (f" ({'; '.join(said)})" if said else "")),
    ):
        # an ignored file in the way stops the switch (the next run then refuses or backs it up)
        repo.git("checkout", "--detach", "--quiet", "--no-overwrite-ignore", patched)
    return len(changed) if changed is not None else None


def stamp(git_dir: Path, queue: Queue, at: Resolved, patched: str) -> wd.Stamp:
    """Record what was prepared: written last, atomically."""
    new = wd.Stamp(
        upstream_sha=at.upstream_sha,
        patched_sha=patched,
        queue_digest=queue.digest,
        base_commit=at.base,
        source=at.source,
    )
    wd.write_stamp(git_dir, new)
    return new
