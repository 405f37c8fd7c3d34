"""Steps that make an existing workdir safe to converge: finish or undo what an interrupted
run left (its journal says what), recognize a patched HEAD without a stamp, and refuse (or,
with ``force``, save and discard) the maintainer's local work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from skippy.core.errors import ConflictError, DirtyWorkdirError
from skippy.core.git import Repo
from skippy.queue import leftovers
from skippy.queue import workdir as wd
from skippy.queue.apply import apply_aside, changed_paths
from skippy.queue.model import Queue
from skippy.queue.run import Run
from skippy.queue.session import after_carry, next_commands


def remove_aside_worktrees(repo: Repo, git_dir: Path) -> None:
    """The temporary worktrees a killed run left, and git's entries of them (locked ones too)."""
    leftovers.remove_aside_worktrees(repo, git_dir)


def recover(run: Run, repo: Repo, git_dir: Path) -> None:
    """Finish or undo what an interrupted skippy run left behind (recognized by its journal)."""
    remove_aside_worktrees(repo, git_dir)
    entry = wd.read_journal(git_dir)
    if entry is None:
        return
    if entry.op == "session":
        _discard_session(run, repo, git_dir, entry)
        return
    if entry.op == "switch" and entry.to_commit and repo.has_commit(entry.to_commit):
        finish_switch(run, repo, git_dir, entry)
        return
    run.console.info(f"recovering from an interrupted prepare ({entry.op})")
    wd.clear_stamp(git_dir)
    if entry.op == "apply":
        _undo_apply(run, repo, git_dir, entry)
    wd.drop_journal(git_dir)


def _discard_session(run: Run, repo: Repo, git_dir: Path, entry: wd.Journal) -> None:
    """A stopped conflict session: refused, or with ``force`` saved under a backup ref and ended."""
    if not run.force:
        raise ConflictError(
            f"a conflict session is in progress in {run.rel(run.workdir)} (stopped at {entry.stopped_patch})",
            untouched=f"{run.rel(run.workdir)}: the session is as you left it",
            next_step=next_commands(repo, run.rel(run.workdir)),
        )
    work = wd.local_work(repo, git_dir, None, run.settings.tolerated_untracked)
    run.backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --force (conflict session)")
    run.notes.append(f"conflict session state saved under {run.backup_ref}")
    wd.abort_in_progress(repo, git_dir)
    wd.discard_local_changes(repo, run.settings.tolerated_untracked)
    if entry.from_commit and repo.has_commit(entry.from_commit):
        repo.git("checkout", "--force", "--detach", "--quiet", entry.from_commit)
    wd.drop_journal(git_dir)
    run.discarded(work.modified, work.untracked, what="--force (conflict session)")


def _undo_apply(run: Run, repo: Repo, git_dir: Path, entry: wd.Journal) -> None:
    """Our own interrupted ``git am``: save whatever is there (nothing is lost), then undo it."""
    progress = wd.in_progress(git_dir)
    work = wd.local_work(repo, git_dir, None, run.settings.tolerated_untracked)
    if work.modified or work.untracked:
        run.backup_ref = wd.save_backup(repo, git_dir, work, "recovering an interrupted prepare")
        run.notes.append(f"state of the interrupted run saved under {run.backup_ref}")
    if progress is not None and progress[0].startswith("rebase-apply"):
        repo.git("am", "--abort", check=False)
        if wd.in_progress(git_dir) is not None:
            repo.git("am", "--quit", check=False)
    if entry.from_commit and repo.has_commit(entry.from_commit):
        repo.git("checkout", "--force", "--detach", entry.from_commit)


def finish_switch(run: Run, repo: Repo, git_dir: Path, entry: wd.Journal) -> None:
    """Finish a switch that was interrupted, overwriting only files skippy itself wrote.

    Every file the interrupted checkout reached holds the new commit's content, every other
    the old one's; anything else is the maintainer's (an edit made since): refused, or with
    ``force`` saved under a backup ref first, like any other local work.
    """
    to = entry.to_commit
    assert to is not None
    old = entry.from_commit
    rel = run.rel(run.workdir)
    head = repo.head()
    known_old = old if old and repo.has_commit(old) else None
    everything = wd.foreign_changes(repo, known_old, to)
    # a file the switch was writing when it was cut short may hold part of either version
    switching = set(changed_paths(repo, known_old, to)) if known_old else set(everything)
    cut = [p for p in everything if p in switching]
    foreign = [p for p in everything if p not in switching]
    findings = [f"{p}: neither the old nor the new version (an edit made since?)" for p in foreign]
    if head not in (old, to):
        findings.append(f"HEAD moved to {head[:12] if head else '(none)'} since the switch was interrupted")
    moving = f"from {old[:12] if old else '(nothing)'} to {to[:12]}"
    if findings:
        _save_before_finishing(run, repo, git_dir, moving=moving, findings=findings, foreign=foreign)
    elif cut:
        _save_cut_short(run, repo, git_dir, cut, moving=moving)
    run.console.info(f"finishing an interrupted prepare: moving {rel} {moving}")
    repo.git("checkout", "--force", "--detach", "--quiet", to)
    if findings:
        run.discarded(foreign, ())
    # the journal says what this commit is: the stamp the interrupted run would have written (a
    # journal from before it recorded the queue digest gives an empty one: the run re-applies)
    wd.write_stamp(
        git_dir,
        wd.Stamp(
            upstream_sha=entry.upstream_sha,
            patched_sha=to,
            queue_digest=entry.queue_digest or "",
            base_commit=entry.base or entry.upstream_sha,
            source=entry.source or "git",
        ),
    )
    wd.drop_journal(git_dir)
    run.recovered = f"finished the interrupted move {moving}"
    run.notes.append(run.recovered)


def _save_cut_short(run: Run, repo: Repo, git_dir: Path, cut: list[str], *, moving: str) -> None:
    """Files the interrupted switch was writing that hold neither version (a write cut short, or an
    edit made since): saved under a backup ref, then the switch is finished over them."""
    rel = run.rel(run.workdir)
    work = wd.LocalWork(modified=tuple(cut), head_problem=f"an interrupted move {moving}")
    run.backup_ref = wd.save_backup(repo, git_dir, work, "finishing an interrupted prepare", also=tuple(cut))
    note = (
        f"{len(cut)} file(s) the interrupted move was writing held neither version (a write cut short, or "
        f"an edit made since): {wd.listing(cut, limit=8)}; saved under {run.backup_ref} before the move is finished "
        f"(bring one back with `git -C {rel} checkout {run.backup_ref} -- <path>`)"
    )
    run.console.warn(note)
    run.notes.append(note)


def restore_command(rel: str, ref: str, paths: list[str] | tuple[str, ...]) -> str:
    """The command that brings back exactly the saved files (not the whole tree the ref holds)."""
    if not paths:
        return f"git -C {rel} checkout {ref} -- <path>"
    if len(paths) <= 10:
        return f"git -C {rel} checkout {ref} -- {' '.join(paths)}"
    return (
        f"git -C {rel} diff --name-only {ref}^ {ref} (lists your {len(paths)} files), then "
        f"git -C {rel} checkout {ref} -- <paths>"
    )


def _save_before_finishing(
    run: Run, repo: Repo, git_dir: Path, *, moving: str, findings: list[str], foreign: list[str]
) -> None:
    rel = run.rel(run.workdir)
    if not run.force:
        raise DirtyWorkdirError(
            f"a prepare was interrupted while moving {rel} {moving}, and {rel} now holds "
            "changes that prepare did not make",
            details="\n".join(f"- {f}" for f in findings),
            untouched=f"{rel}: nothing was changed (the half-done switch and your changes are as they were)",
            next_step="`invoke prepare --force` saves everything under a backup ref first, then finishes "
            f"the switch; bring your files back with `git -C {rel} checkout <backup ref> -- <paths>` "
            "(the ref is printed)",
        )
    work = wd.local_work(repo, git_dir, None, run.settings.tolerated_untracked)
    work = dataclasses.replace(work, head_problem="; ".join(findings))
    run.backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --force", also=tuple(foreign))
    run.console.warn(
        f"local work saved under {run.backup_ref} before --force discards it; "
        f"restore with: {restore_command(rel, run.backup_ref, foreign)}"
    )
    run.notes.append(f"local work saved under {run.backup_ref}")


def recognize(run: Run, queue: Queue, repo: Repo, git_dir: Path) -> wd.Stamp | None:
    """With no (readable) stamp: is HEAD this queue applied on HEAD's upstream base?

    The same base and queue always give the same patched SHA, so replaying the queue in a
    temporary worktree and comparing SHAs tells a run's own patched commit from local work.
    """
    head = repo.head()
    if head is None or not queue.patches:
        return None
    on_top = repo.git(
        "rev-list", "--reverse", head, "--not", "--remotes", "--tags", "--glob=refs/skippy/archive/*", check=False
    ).stdout.split()
    if len(on_top) != len(queue.patches):
        return None
    base = repo.rev_parse(f"{on_top[0]}^")
    if base is None:
        return None
    with run.console.step(f"no stamp: replaying the queue on {base[:12]} to recognize HEAD {head[:12]}"):
        try:
            replayed = apply_aside(run, queue, repo, git_dir, base)
        except ConflictError:
            return None
    if replayed != head:
        return None
    upstream_sha, source = base, "git"
    archived = repo.git(
        "for-each-ref", "--points-at", base, "--format=%(refname)", "refs/skippy/archive/", check=False
    ).stdout.split()
    if archived:
        upstream_sha, source = archived[0].rsplit("/", 1)[1], "archive"
    run.notes.append(f"no stamp: recognized HEAD {head[:12]} as this queue on {upstream_sha[:12]}")
    return wd.Stamp(
        upstream_sha=upstream_sha,
        patched_sha=head,
        queue_digest=queue.digest,
        base_commit=base,
        source=source,
    )


def keep_or_discard(run: Run, work: wd.LocalWork, stamp: wd.Stamp | None = None) -> str:
    """The next commands for local work: carry it into the queue, build it as it is, or discard it.
    Work on another upstream than the pin (a finished conflict session on X, its ``stamp``) reaches
    the queue through ``invoke pin-bump --sha X`` after regenerate, as ``--continue`` said: a plain
    prepare targets the pin and would refuse again."""
    rel = run.rel(run.workdir)
    after = f"`{run.rerun}`"
    if stamp is not None and stamp.resolved:
        command, why = after_carry(run.settings, stamp.upstream_sha, stamp.base_commit)
        if command != "invoke prepare":
            after = f"`{command}` ({why})"
    if work.in_progress:
        keep = (
            f"finish or abort the {work.in_progress.removeprefix('a ').removeprefix('an ')} in {rel} "
            f"(`git -C {rel} status` says how), carry its commits into the queue with `invoke regenerate`, "
            f"then {after}"
        )
    elif work.modified or work.untracked:
        keep = (
            f"keep it: commit it (`git -C {rel} add -A && git -C {rel} commit`; a new commit joins the lane "
            f"of the commit before it), then `invoke regenerate` and {after}"
        )
    else:
        keep = (
            "carry it into the queue: `invoke regenerate` (reads each commit's lane from its Skippy-Patch "
            f"trailer), then {after}"
            + (" (accepts the workdir when the queue gives its tree)" if after == f"`{run.rerun}`" else "")
        )
    return (
        f"{keep}; build it as it stands: `{run.as_is_build}`; discard it: `{run.rerun} --force` "
        "(saves everything under a backup ref first)"
    )


def refuse_or_discard(run: Run, repo: Repo, git_dir: Path, work: wd.LocalWork, *, differs: str | None = None) -> None:
    """Local work: refused, naming it and how to keep or discard it; with ``force`` saved under a
    backup ref, then discarded (an ``am``/rebase/merge in progress aborted, the stamp cleared).
    ``differs``: how HEAD's tree differs from the queue's (when that was computed)."""
    if work.empty:
        return
    rel = run.rel(run.workdir)
    findings = "\n".join(f"- {f}" for f in work.findings()) + (f"\n\n{differs}" if differs else "")
    if not run.force:
        raise DirtyWorkdirError(
            f"{rel} holds work that `prepare` would lose",
            details=findings,
            untouched=f"{rel}: nothing was changed"
            if run.recovered is None
            else f"{rel}: your work was not changed (this run only {run.recovered})",
            next_step=keep_or_discard(run, work, wd.read_stamp(git_dir)),
        )
    run.backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --force")
    mine = [*work.modified, *work.untracked]
    restore = (
        f"restore with: {restore_command(rel, run.backup_ref, mine)}"
        if mine
        else f"your commits: git -C {rel} log {run.backup_ref}"
    )
    run.console.warn(f"local work saved under {run.backup_ref} before --force discards it; {restore}")
    run.notes.append(f"local work saved under {run.backup_ref}")
    if work.in_progress is not None:
        wd.abort_in_progress(repo, git_dir)
    wd.discard_local_changes(repo, run.settings.tolerated_untracked)
    wd.clear_stamp(git_dir)
    run.discarded(work.modified, work.untracked)
