"""Steps about the workdir's shape: leftovers of killed runs, is it a checkout of our own,
the cold clone (built in a partial directory, renamed into place when done) and the re-clone
of a shallow or partial clone."""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from pathlib import Path

from skippy.core.errors import ConflictError, WorkdirError
from skippy.core.git import Repo
from skippy.queue import workdir as wd
from skippy.queue.apply import apply_lanes, stamp
from skippy.queue.model import Queue
from skippy.queue.run import PrepareReport, Run
from skippy.queue.session import on_conflict
from skippy.queue.target import Target
from skippy.queue.upstream import clone_or_init, resolve

PARTIAL_PREFIX = ".skippy-partial-"
#: a workdir being replaced by a re-clone (put back if the re-clone does not finish)
OLD_PREFIX = ".skippy-replaced-"


def missing(run: Run) -> bool:
    return not run.workdir.exists() and not run.workdir.is_symlink()


def remove_partials(run: Run) -> None:
    """Remove what killed cold clones left; put back a checkout an interrupted re-clone moved away."""
    parent = run.workdir.parent
    if not parent.is_dir():
        return
    if missing(run):
        for interrupted in sorted(parent.glob(f"{OLD_PREFIX}{run.workdir.name}-*"))[:1]:
            # a re-clone was killed: the checkout it replaced comes back (then is re-cloned again)
            run.console.info(f"putting back the checkout an interrupted re-clone moved: {run.rel(interrupted)}")
            interrupted.rename(run.workdir)
    for leftover in parent.glob(f"{PARTIAL_PREFIX}{run.workdir.name}-*"):
        run.console.info(f"removing an interrupted clone: {run.rel(leftover)}")
        shutil.rmtree(leftover, ignore_errors=True)


def partial_dir(run: Run) -> Path:
    return run.workdir.parent / f"{PARTIAL_PREFIX}{run.workdir.name}-{uuid.uuid4().hex[:8]}"


def check_is_our_repo(run: Run, repo: Repo) -> Path:
    """The workdir's git dir; WorkdirError when it is not a plain git checkout of its own."""
    rel = run.rel(run.workdir)
    if not run.workdir.is_dir():
        raise WorkdirError(
            f"workdir {rel} exists but is not a directory",
            untouched=rel,
            next_step="move it away, or set LLAMA_WORKDIR to another path",
        )
    top = repo.toplevel()
    if top is None or top.resolve() != run.workdir.resolve():
        raise WorkdirError(
            f"workdir {rel} exists but is not a git checkout of its own",
            untouched=f"{rel} and everything in it",
            next_step=f"move {rel} away (or set LLAMA_WORKDIR elsewhere), then re-run `invoke prepare`",
        )
    git_dir = wd.git_dir_of(run.workdir)
    if git_dir is None:
        raise WorkdirError(
            f"workdir {rel} is a linked worktree or submodule (its .git is a file)",
            untouched=rel,
            next_step="point LLAMA_WORKDIR at a plain clone, or let skippy clone one",
        )
    return git_dir


def is_shallow_or_partial(repo: Repo, git_dir: Path) -> bool:
    """A shallow clone (git's ``shallow`` file: what ``rev-parse --is-shallow-repository`` reads)
    or a partial one (a promisor remote, ``extensions.partialClone``: read with the config's audit,
    no git command of its own)."""
    return (git_dir / "shallow").is_file() or repo.config_audit().partial


def cold(run: Run, queue: Queue, target: Target, pin: str | None) -> PrepareReport:
    """Clone, check out and apply in a partial dir; renaming it into place is the commit point.

    An interrupted cold prepare leaves only a partial dir, which the next run removes.
    """
    run.workdir.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_dir(run)
    try:
        clone_or_init(run, partial)
        repo = run.repo(partial)
        git_dir = partial / ".git"
        at = resolve(run, repo, target, pin)
        with run.console.step(f"check out {at.upstream_sha[:12]}"):
            repo.git("checkout", "--force", "--detach", "--quiet", at.base)
        try:
            patched = apply_lanes(run, queue, repo, git_dir, run.rel(run.workdir))
        except ConflictError as exc:
            # leave a clean upstream checkout (no stamp) for the maintainer to work in
            repo.git("checkout", "--force", "--detach", "--quiet", at.base, check=False)
            partial.rename(run.workdir)
            raise on_conflict(run, queue, run.repo(), run.workdir / ".git", exc, at=at, head=None, since=None) from exc
        new = stamp(git_dir, queue, at, patched, repo=repo)
        partial.rename(run.workdir)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    return run.report("cloned", new, changed=None)


def plain_checkout(run: Run, target: Target, pin: str | None) -> None:
    """A plain upstream checkout of ``target`` (no queue, no stamp) as the workdir, for triage;
    the next prepare applies on it."""
    partial = partial_dir(run)
    try:
        clone_or_init(run, partial)
        repo = run.repo(partial)
        at = resolve(run, repo, target, pin)
        repo.git("checkout", "--force", "--detach", "--quiet", at.base)
        partial.rename(run.workdir)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def reclone(run: Run, queue: Queue, target: Target, pin: str | None) -> PrepareReport:
    """Replace a shallow or partial clone (it cannot serve ``git am --3way``) by a full one,
    carrying its backup refs over (or keeping it beside when they cannot be carried)."""
    run.console.info(
        f"{run.rel(run.workdir)} is a shallow or partial clone, which cannot serve `git am --3way`: re-cloning"
    )
    # not a partial name: a hard kill leaves it for the next run to put back, never to delete
    old = run.workdir.parent / f"{OLD_PREFIX}{run.workdir.name}-{uuid.uuid4().hex[:8]}"
    run.workdir.rename(old)
    try:
        report = cold(run, queue, target, pin)
    except BaseException:
        if not run.workdir.exists():
            old.rename(run.workdir)
        raise
    if run.repo(old).git("for-each-ref", "--count=1", wd.BACKUP_PREFIX).stdout.strip():
        note = _carry_backups(run, old)
        if note is not None:
            return dataclasses.replace(report, notes=(*report.notes, note))
    shutil.rmtree(old, ignore_errors=True)
    return report


def _carry_backups(run: Run, old: Path) -> str | None:
    """Backups of the replaced clone (a --force on it made one just now) move into the new one;
    when they cannot, the old clone is kept beside (the note says where)."""
    carried = run.repo().git(
        "fetch", "--no-tags", "--quiet", str(old), f"+{wd.BACKUP_PREFIX}*:{wd.BACKUP_PREFIX}*", check=False
    )
    saved_state = wd.skippy_dir(old / ".git") / "backups"
    if carried.ok and saved_state.is_dir():
        shutil.copytree(saved_state, wd.skippy_dir(run.workdir / ".git") / "backups", dirs_exist_ok=True)
    if carried.ok:
        return None
    kept = run.workdir.parent / f"{run.workdir.name}.before-reclone-{old.name.rsplit('-', 1)[1]}"
    old.rename(kept)
    note = f"could not carry the backup refs of the shallow clone over: it is kept as {run.rel(kept)}"
    run.console.warn(note)
    return note
