"""Conflict sessions: a failed ``git am`` left stopped in the workdir, driven by
``invoke prepare --continue | --skip | --abort``.

A session starts when an interactive prepare meets a patch that does not apply
(:func:`on_conflict`, after triage); its journal (op ``session``) records where
it started from, the target and the patch it stopped at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skippy.core.errors import CommandError, ConflictError, SettingsError
from skippy.core.git import AM_ARGS, AM_ENV, FALLBACK_DATE, Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.am_output import (
    failed_paths,
    failing_hunks,
    stopped_failures,
    stopped_patch_paths,
    unmerged_paths,
)
from skippy.queue.apply import am_said
from skippy.queue.guard import guarded
from skippy.queue.mail import tagged
from skippy.queue.model import Patch, Queue, load_queue
from skippy.queue.run import PrepareReport, Run
from skippy.queue.upstream import Resolved

Action = Literal["continue", "skip", "abort"]


_THEN = (
    "then `invoke prepare --continue`; or `invoke prepare --skip` to leave this patch out, "
    "or `invoke prepare --abort` to go back"
)


def session_commands(rel_workdir: str, unmerged: Sequence[str], failed: Sequence[str] = ()) -> str:
    """The next commands of a stopped session.  With conflict markers (``unmerged`` paths): resolve
    them.  Without (git could not merge the patch at all, the tree is clean): make the change of the
    failing hunks by hand.  Then continue, skip or abort."""
    rel = rel_workdir
    if unmerged:
        return (
            f"resolve the conflicts in {', '.join(unmerged)} (`git -C {rel} status` lists them), "
            f"stage them (`git -C {rel} add {' '.join(unmerged)}`), {_THEN}"
        )
    files = ", ".join(failed) if failed else "the files it touches"
    return (
        "git wrote no conflict markers and applied none of this patch: apply the hunks that fit with "
        f"`git -C {rel} am --show-current-patch=diff | git -C {rel} apply --reject` (the others go to "
        f"*.rej files), make the change of the failing hunk(s) by hand in {files}, delete the *.rej files, "
        f"stage the files (`git -C {rel} add <paths>`), {_THEN}"
    )


#: what a session whose ``git am`` was ended by hand can still do
ENDED_BY_HAND = (
    "`invoke prepare --abort` goes back to the checkout the session started from (your edits are kept "
    "or saved under a backup ref)"
)


def am_running(repo: Repo) -> bool:
    """Whether a ``git am`` is stopped in ``repo`` (a session's ``git am`` may have been ended by hand)."""
    progress = wd.in_progress(repo.git_dir())
    return progress is not None and progress[0] == "rebase-apply/applying"


def next_commands(repo: Repo, rel_workdir: str) -> str:
    """:func:`session_commands` of the session stopped in ``repo``, read from the tree as it is now
    (the same words for the stop itself, for prepare refusing while it lasts, and for status)."""
    if not am_running(repo):
        return f"the session's `git am` was ended outside skippy: {ENDED_BY_HAND}, then `invoke prepare`"
    unmerged = unmerged_paths(repo)
    return session_commands(rel_workdir, unmerged, () if unmerged else stopped_failures(repo))


@dataclass(frozen=True)
class Stop:
    """Where a session stopped: its journal (written), the patch, and what ``git am`` said."""

    entry: wd.Journal
    patch: Patch
    output: str

    def explain(self, repo: Repo, rel: str) -> tuple[str, str, str]:
        """``(what, details, next step)``: the conflicts, or (none) the failing hunks and why."""
        unmerged = unmerged_paths(repo)
        said = am_said(self.output, [self.patch])
        if unmerged:
            return (
                f"{self.patch.label} does not apply: the conflict is waiting in {rel} "
                f"(conflicts in {', '.join(unmerged)})",
                said,
                session_commands(rel, unmerged),
            )
        failed = failed_paths(self.output) or stopped_failures(repo)
        return (
            f"{self.patch.label} does not apply and git could not merge it: no conflict markers were "
            f"written and none of the patch was applied ({rel} is clean); the session is stopped there"
            + (f" (failed: {', '.join(failed)})" if failed else ""),
            "the failing hunk(s):\n" + failing_hunks(repo, failed) + ("\n\ngit am said:\n" + said if said else ""),
            next_commands(repo, rel),
        )


def run_session(
    repo: Repo, git_dir: Path, queue: Queue, entry: wd.Journal, *, start: int, console: Console
) -> Stop | None:
    """Apply ``queue.patches[start:]`` one ``git am`` per patch; stop (journal written) at a conflict.

    Returns where it stopped, or None when the whole queue is applied.
    """
    for index in range(start, len(queue.patches)):
        patch = queue.patches[index]
        with tagged(git_dir, [patch]) as mails:
            result = repo.git(*AM_ARGS, *map(str, mails), env=AM_ENV, check=False)
        if not result.ok:
            stopped = dataclasses.replace(entry, stopped_at=index, stopped_patch=patch.label)
            wd.write_journal(git_dir, stopped)
            console.info(f"stopped at {patch.label}: {patch.subject}")
            return Stop(stopped, patch, result.tail())
    return None


def on_conflict(
    run: Run,
    queue: Queue,
    repo: Repo,
    git_dir: Path,
    exc: ConflictError,
    *,
    at: Resolved,
    head: str | None,
    since: wd.Stamp | None,
) -> ConflictError:
    """The conflict ``exc`` with every patch triaged; interactively, the failed ``git am`` is then
    left stopped in the workdir (a session, journaled), and the error says so and what to run next."""
    from skippy.queue.triage import triage

    with run.console.step("triage: trying every patch against the target"):
        report = triage(repo, git_dir, queue, at.base, since.base_commit if since else None)
    if not run.interactive:
        return ConflictError(
            exc.what,
            details=report.render() + ("\n\n" + exc.details if exc.details else ""),
            untouched=exc.untouched,
            next_step=exc.next_step,
            annotations=exc.annotations,
            triage=report,
        )
    repo.git("checkout", "--force", "--detach", "--quiet", at.base)
    entry = wd.Journal(
        "session",
        from_commit=head,
        to_commit=None,
        upstream_sha=at.upstream_sha,
        base=at.base,
        queue_digest=queue.digest,
        source=at.source,
    )
    stopped = run_session(repo, git_dir, queue, entry, start=0, console=run.console)
    assert stopped is not None, "the queue failed aside but applied in the workdir"
    what, details, next_step = stopped.explain(repo, run.rel(run.workdir))
    return ConflictError(
        what,
        details=report.render() + "\n\n" + details,
        untouched="your previous patched checkout is recorded: `invoke prepare --abort` returns to it"
        if head
        else "nothing of yours was in the workdir",
        next_step=next_step,
        annotations=exc.annotations,
        triage=report,
    )


def _author_date(git_dir: Path) -> str | None:
    script = git_dir / "rebase-apply" / "author-script"
    with contextlib.suppress(OSError):
        for line in script.read_text(encoding="utf-8").splitlines():
            if line.startswith("GIT_AUTHOR_DATE="):
                return line.split("=", 1)[1].strip().strip("'")
    return None


def resume_session(settings: Settings, action: str, *, console: Console) -> PrepareReport:
    """``invoke prepare --continue | --skip | --abort``."""
    if action not in ("continue", "skip", "abort"):
        raise SettingsError(
            f"unknown session action {action!r}",
            untouched="everything",
            next_step="invoke prepare --continue | --skip | --abort",
        )
    return resume(settings, action, console=console)  # type: ignore[arg-type]


def stopped_session(settings: Settings) -> tuple[Path, wd.Journal]:
    """The git dir and journal of the session stopped in the workdir; ConflictError when none is."""
    rel = settings.relative(settings.workdir)
    git_dir = wd.git_dir_of(settings.workdir)
    entry = wd.read_journal(git_dir) if git_dir else None
    if git_dir is None or entry is None or entry.op != "session" or entry.stopped_at is None:
        raise ConflictError(
            f"no conflict session is in progress in {rel}",
            untouched=f"{rel}",
            next_step="`invoke prepare` starts one when a patch does not apply (outside CI)",
        )
    return git_dir, entry


def resume(settings: Settings, action: Action, *, console: Console) -> PrepareReport:
    """Drive a stopped conflict session to its end (``--continue``/``--skip``) or back (``--abort``)."""
    started = time.monotonic()
    rel = settings.relative(settings.workdir)
    git_dir, entry = stopped_session(settings)
    with guarded(
        settings,
        console,
        rerun=f"invoke prepare --{action}",
        untouched=f"{rel}: the conflict session and your files are as they were",
    ):
        repo = Repo(settings.workdir, settings.env, echo=console.command)
        queue = load_queue(settings.patch_dir)
        if action == "abort":
            return _abort_session(settings, repo, git_dir, entry, console=console, started=started)
        if queue.digest != entry.queue_digest:
            raise ConflictError(
                "the queue changed since the session started",
                untouched=f"{rel}: the session is as you left it",
                next_step="`invoke prepare --abort`, then `invoke prepare` with the new queue",
            )
        assert entry.stopped_at is not None
        if not am_running(repo):
            raise ConflictError(
                f"the conflict session stopped at {entry.stopped_patch} has no `git am` in progress any more "
                f"(ended by hand: `git am --abort` or `--quit`?): there is nothing to {action}",
                untouched=f"{rel}: nothing was changed",
                next_step=ENDED_BY_HAND,
            )
        current = queue.patches[entry.stopped_at]
        saved: list[str] = []
        if action == "skip":
            saved = _skip(settings, repo, git_dir, current, console=console)
            entry = dataclasses.replace(entry, resolved=(*entry.resolved, f"{current.label} (skipped)"))
        else:
            _continue(settings, repo, git_dir, current)
            entry = dataclasses.replace(entry, resolved=(*entry.resolved, f"{current.label} (resolved)"))
        stamp = _finish(settings, repo, git_dir, queue, entry, console=console)
    carry = carry_note(settings, repo, stamp, action)
    console.info(carry)
    return PrepareReport(
        "resumed",
        stamp.upstream_sha,
        stamp.patched_sha,
        stamp.queue_digest,
        settings.workdir,
        stamp.source,
        time.monotonic() - started,
        notes=(*entry.resolved, *saved, carry),
        next_step=carry_next(settings, stamp),
    )


def after_carry(settings: Settings, upstream_sha: str, base_commit: str) -> tuple[str, str]:
    """``(command, why)``: what follows ``invoke regenerate`` for lanes made on ``upstream_sha``
    (its tree's base commit ``base_commit``).  At the pin, ``invoke prepare`` (it takes the tree as
    prepared); elsewhere ``invoke pin-bump --sha`` moves the pin there, with
    ``--allow-non-descendant`` (and why) when the pin's commit in the workdir is not an ancestor:
    two source-archive imports have no history between them."""
    from skippy.queue.imports import archive_ref
    from skippy.queue.target import read_pin

    try:
        pin: str | None = read_pin(settings)
    except SettingsError:
        pin = None
    if pin == upstream_sha:
        return "invoke prepare", "it takes this tree as prepared"
    here = None
    if pin and wd.git_dir_of(settings.workdir) is not None:
        repo = Repo(settings.workdir, settings.env)
        here = repo.rev_parse(f"{archive_ref(pin)}^{{commit}}") or repo.rev_parse(f"{pin}^{{commit}}")
        if here is not None and not repo.is_ancestor(here, base_commit):
            here = None
    if here is not None:
        return f"invoke pin-bump --sha {upstream_sha}", "moves the pin here: this tree is taken as prepared"
    return (
        f"invoke pin-bump --sha {upstream_sha} --allow-non-descendant",
        "moves the pin here: this tree is taken as prepared; no history here shows that it descends from the "
        f"pin {(pin or '?')[:12]}, so check that upstream first",
    )


def after_regenerate(settings: Settings, upstream_sha: str, base_commit: str) -> str:
    """The next step once the lanes are written back (regenerate's success): prepare and check at the
    pin, pin-bump elsewhere."""
    command, why = after_carry(settings, upstream_sha, base_commit)
    if command == "invoke prepare":
        return f"`invoke prepare` ({why}: no file rewritten), then `invoke check`"
    return f"`{command}` ({why})"


def carry_note(settings: Settings, repo: Repo, stamp: wd.Stamp, action: Action) -> str:
    """How a finished session reaches the queue: regenerate, then prepare accepts the tree as it is
    (at the pin), or pin-bump moves the pin to it (:func:`after_carry`)."""
    rel = settings.relative(settings.workdir)
    done = "the resolution lives" if action == "continue" else "leaving the patch out lives"
    command, why = after_carry(settings, stamp.upstream_sha, stamp.base_commit)
    return (
        f"{done} only in {rel} until it is in the queue (`invoke status` calls it local work): "
        f"`invoke regenerate` writes the lanes back from {rel}'s commits, then `{command}` ({why})"
    )


def carry_next(settings: Settings, stamp: wd.Stamp) -> str:
    """The next step of a finished session: regenerate, then what :func:`after_carry` says."""
    command, _ = after_carry(settings, stamp.upstream_sha, stamp.base_commit)
    return f"`invoke regenerate`, then `{command}`" + (" and `invoke check`" if command == "invoke prepare" else "")


def after_as_is(settings: Settings) -> str | None:
    """The next step after a build of the workdir as it stands (``--workdir-as-is``): its work
    carried into the queue (commit, regenerate), then prepare at the pin or pin-bump elsewhere.
    None when the workdir holds nothing the queue lacks (or is not a checkout skippy made)."""
    git_dir = wd.git_dir_of(settings.workdir)
    stamp = wd.read_stamp(git_dir) if git_dir is not None else None
    if git_dir is None or stamp is None:
        return None
    repo = Repo(settings.workdir, settings.env)
    try:
        work = wd.local_work(repo, git_dir, stamp, settings.tolerated_untracked)
    except CommandError:
        return None  # a stamp without a checkout git can read: the build stands, there is no work to carry
    if work.empty:
        return None
    rel = settings.relative(settings.workdir)
    then = carry_next(settings, stamp)
    if work.in_progress:
        return f"finish the {work.in_progress.removeprefix('a ').removeprefix('an ')} in {rel}, then {then}"
    if work.modified or work.untracked:
        return f"commit your edits (`git -C {rel} add -A && git -C {rel} commit`), then {then}"
    return then


def _skip(settings: Settings, repo: Repo, git_dir: Path, current: Patch, *, console: Console) -> list[str]:
    """``git am --skip``, saving uncommitted changes first (it resets the skipped patch's files)."""
    rel = settings.relative(settings.workdir)
    work = wd.local_work(repo, git_dir, None, settings.tolerated_untracked)
    saved: list[str] = []
    if work.modified or work.untracked:
        ref = wd.save_backup(repo, git_dir, work, "invoke prepare --skip")
        console.warn(f"uncommitted changes in {rel} saved under {ref} before skipping {current.label}")
        saved.append(f"uncommitted changes before skipping {current.label} saved under {ref}")
    repo.git("am", "--skip", check=False)
    return saved


def _continue(settings: Settings, repo: Repo, git_dir: Path, current: Patch) -> None:
    """``git am --continue`` once no path is left unmerged, keeping the patch's author date."""
    rel = settings.relative(settings.workdir)
    unmerged = [p for p in repo.git("diff", "--name-only", "--diff-filter=U").stdout.splitlines() if p]
    if unmerged:
        raise ConflictError(
            f"{current.label} still has unresolved conflicts in {', '.join(unmerged)}",
            untouched=f"{rel}: the session is as you left it",
            next_step=f"edit them, `git -C {rel} add {' '.join(unmerged)}`, then `invoke prepare --continue`",
        )
    markers = wd.conflict_markers(repo, "--cached")  # staged, against HEAD
    if markers:
        raise ConflictError(
            f"{current.label}: conflict markers are staged in {', '.join(markers)}",
            details="\n".join(line for lines in markers.values() for line in lines),
            untouched=f"{rel}: the session is as you left it (nothing was committed)",
            next_step=f"remove the <<<<<<< ======= >>>>>>> lines from {', '.join(markers)}, "
            f"`git -C {rel} add {' '.join(markers)}`, then `invoke prepare --continue`",
        )
    date = _author_date(git_dir) or FALLBACK_DATE
    result = repo.git("am", "--continue", env={"GIT_COMMITTER_DATE": date}, check=False)
    if not result.ok:
        raise ConflictError(
            f"`git am --continue` did not finish {current.label}",
            details=am_said(result.tail(), [current]),
            untouched=f"{rel}: the session is as you left it",
            next_step=next_commands(repo, rel),
        )


def _finish(
    settings: Settings, repo: Repo, git_dir: Path, queue: Queue, entry: wd.Journal, *, console: Console
) -> wd.Stamp:
    """Apply the rest of the queue; stamp the result and close the session (or stop again)."""
    rel = settings.relative(settings.workdir)
    assert entry.stopped_at is not None
    stopped = run_session(repo, git_dir, queue, entry, start=entry.stopped_at + 1, console=console)
    if stopped is not None:
        what, details, next_step = stopped.explain(repo, rel)
        raise ConflictError(
            what.replace(" does not apply", " does not apply either", 1),
            details=details,
            untouched=f"{rel}: earlier resolutions are kept in this session",
            next_step=next_step,
        )
    patched = repo.head()
    assert patched is not None and entry.base is not None
    stamp = wd.Stamp(
        upstream_sha=entry.upstream_sha,
        patched_sha=patched,
        queue_digest=queue.digest,
        base_commit=entry.base,
        source=entry.source or "git",
        resolved=entry.resolved,
    )
    wd.write_stamp(git_dir, stamp)
    wd.drop_journal(git_dir)
    return stamp


def _abort_session(
    settings: Settings, repo: Repo, git_dir: Path, entry: wd.Journal, *, console: Console, started: float
) -> PrepareReport:
    """Back to the checkout the session started from, losing nothing.

    Uncommitted changes (a half-done resolution, an unrelated edit, new files) are saved under a
    backup ref first.  The stopped patch's own files go back, as ``git am --abort`` does; every other
    edit is kept: carried over to the previous checkout's version of its file (``git apply`` of your
    change), and only where it does not apply there is the file reset (yours is in the backup).
    """
    rel = settings.relative(settings.workdir)
    back = entry.from_commit or entry.base
    assert back is not None
    work = wd.local_work(repo, git_dir, None, settings.tolerated_untracked)
    dirty = [
        p
        for xy, p in wd.status_entries(repo, untracked="all")
        if xy != "??" or not wd.is_tolerated(p, settings.tolerated_untracked)
    ]
    backup_ref: str | None = None
    notes: list[str] = []
    if work.modified or work.untracked:
        backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --abort")
        console.warn(f"uncommitted changes in {rel} saved under {backup_ref} before the abort")
        notes.append(f"uncommitted changes saved under {backup_ref}")
    patch_paths = set(stopped_patch_paths(repo))
    edits = _edits(repo, [p for p in work.modified if p not in patch_paths])
    repo.git("am", "--abort", check=False)
    if wd.in_progress(git_dir) is not None:
        repo.git("am", "--quit", check=False)
    carried: list[str] = []
    if not repo.git("checkout", "--detach", "--quiet", back, check=False).ok:
        # edits to files that differ in the previous checkout: carried over where they apply
        if backup_ref is None:
            backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --abort")
        repo.git("checkout", "--force", "--detach", "--quiet", back)
        carried = _carry_edits(repo, edits, back)
    if backup_ref is not None:
        notes += _restore_notes(repo, rel, backup_ref, dirty, carried, console=console)
    wd.drop_journal(git_dir)
    stamp = wd.read_stamp(git_dir)
    if stamp is None or stamp.patched_sha != back:
        wd.clear_stamp(git_dir)
    console.info(f"conflict session aborted: {rel} is back at {back[:12]}")
    return PrepareReport(
        "aborted",
        stamp.upstream_sha if stamp else entry.upstream_sha,
        back,
        stamp.queue_digest if stamp else "",
        settings.workdir,
        stamp.source if stamp else (entry.source or "git"),
        time.monotonic() - started,
        backup_ref=backup_ref,
        notes=tuple(notes),
    )


def _edits(repo: Repo, paths: list[str]) -> dict[str, str]:
    """Each path's uncommitted change against HEAD, as a patch ``git apply`` takes."""
    edits: dict[str, str] = {}
    for path in paths:
        diff = repo.git("diff", "--binary", "--full-index", "HEAD", "--", path, check=False)
        if diff.ok and diff.stdout.strip():
            edits[path] = diff.stdout
    return edits


def _carry_edits(repo: Repo, edits: dict[str, str], back: str) -> list[str]:
    """Apply each saved edit to the work tree as it is now (by context, else by a 3-way merge of
    the blobs the edit names); the paths whose edit applied.  One that conflicts stays at
    ``back``'s version (the caller's backup holds it)."""
    carried = []
    for path, diff in edits.items():
        if repo.git("apply", "--whitespace=nowarn", input=diff, check=False).ok:
            carried.append(path)
            continue
        merged = repo.git("apply", "--3way", "--whitespace=nowarn", input=diff, check=False)
        if merged.ok:
            repo.git("reset", "--quiet", "--", path, check=False)  # --3way staged it: unstage
            carried.append(path)
        else:
            repo.git("checkout", "--force", back, "--", path, check=False)  # no markers left behind
    return carried


def _restore_notes(
    repo: Repo, rel: str, backup_ref: str, dirty: list[str], carried: list[str], *, console: Console
) -> list[str]:
    """What the abort reset (it is in ``backup_ref``), what it kept as it was, and the edits it
    carried over to the previous checkout's version of their file."""
    reset = [p for p in wd.differ_from(repo, backup_ref, dirty) if p not in carried]
    kept = sorted(set(dirty) - set(reset) - set(carried))
    notes: list[str] = []
    if carried:
        notes.append(f"your edits carried over to the previous checkout's version of: {', '.join(carried)}")
    if reset:
        notes.append(
            f"back at the previous checkout's version (yours is in {backup_ref}): {', '.join(reset)}; "
            f"bring one back with `git -C {rel} checkout {backup_ref} -- <path>`"
        )
        console.warn(notes[-1])
    if kept:
        notes.append(f"kept in {rel} as they were: {', '.join(kept)}")
    return notes
