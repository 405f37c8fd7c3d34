"""``invoke prepare``: upstream checkout + the queue applied with ``git am --3way``.

Converge, then re-check: compute what must change (clone? fetch? re-apply?)
and act only on that difference.  The same pin and queue give the same
patched commit SHA on any machine.  A maintainer's work in the workdir is
never lost: it is refused, or (with ``force``) saved under a backup ref first.

A prepare is a sequence of small steps over one explicit state (:class:`Run`),
each a function of its own module that can be read and tested alone:

1. validate: the queue (:func:`skippy.queue.model.load_queue`) and the target
   (:func:`skippy.queue.target.validate`); then the lock-free no-op
   (:func:`fast_noop`);
2. lock (:func:`skippy.queue.guard.locked`), with disk errors told plainly;
3. the workdir's shape (:mod:`skippy.queue.checkout`): leftovers of killed
   runs, a cold clone, a re-clone of a shallow one;
4. recover (:mod:`skippy.queue.recover`): an interrupted run finished or
   undone, a patched HEAD without a stamp recognized, local work refused or
   saved and discarded;
5. resolve the upstream (:mod:`skippy.queue.upstream`);
6. decide (:func:`decide`): nothing to do, or apply;
7. apply aside and switch (:mod:`skippy.queue.apply`), or on a conflict
   triage and a session (:mod:`skippy.queue.session`);
8. stamp (:func:`skippy.queue.apply.stamp`), last; then the compat link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from skippy.core.errors import ConflictError, SkippyError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.apply import applied_commits, apply_aside, stamp, switch
from skippy.queue.checkout import (
    check_is_our_repo,
    cold,
    is_shallow_or_partial,
    missing,
    plain_checkout,
    reclone,
    remove_partials,
)
from skippy.queue.compat import ensure_compat_link
from skippy.queue.guard import guarded
from skippy.queue.model import Queue, load_queue
from skippy.queue.recover import recognize, recover, refuse_or_discard, remove_aside_worktrees
from skippy.queue.run import AS_IS_BUILD, PrepareReport, Run
from skippy.queue.session import on_conflict
from skippy.queue.target import Target, read_pin, rerun_command, validate
from skippy.queue.upstream import Resolved, resolve

if TYPE_CHECKING:
    from skippy.queue.triage import TriageReport

__all__ = [
    "PrepareReport",
    "Target",
    "apply_queue_aside",
    "converge",
    "decide",
    "fast_noop",
    "prepare",
    "resolve_target",
    "triage_target",
]

Decision = Literal["noop", "apply"]


def fast_noop(settings: Settings, queue: Queue, pin: str) -> wd.Stamp | None:
    """The recorded stamp when a pinned prepare has nothing to do, read-only and lock-free."""
    git_dir = wd.git_dir_of(settings.workdir)
    if git_dir is None:
        return None
    recorded = wd.read_stamp(git_dir)
    if recorded is None or (recorded.upstream_sha, recorded.queue_digest) != (pin, queue.digest) or not recorded.marked:
        return None
    if recorded.resolved:
        return None  # a session's resolution is local work, whatever its target: converge refuses it
    interrupted = (wd.skippy_dir(git_dir) / wd.JOURNAL_NAME).exists() or wd.in_progress(git_dir) is not None
    if interrupted or _head_file(git_dir) != recorded.patched_sha:
        return None
    entries = wd.status_entries(Repo(settings.workdir, settings.env))
    clean = all(xy == "??" and wd.is_tolerated(path, settings.tolerated_untracked) for xy, path in entries)
    return recorded if clean else None


def _head_file(git_dir: Path) -> str | None:
    """HEAD as the file says it (a detached SHA, or ``ref: ...``), without running git."""
    try:
        return (git_dir / "HEAD").read_text(encoding="ascii").strip()
    except OSError:
        return None


def prepare(
    settings: Settings,
    target: Target,
    *,
    console: Console,
    force: bool = False,
    offline: bool = False,
    interactive: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
    as_is_build: str = AS_IS_BUILD,
) -> PrepareReport:
    """Bring the workdir to ``target`` + the queue; see the module docstring.

    ``as_is_build``: the build of the workdir as it stands that a refusal of local work names
    (the calling build session's backend).

    On a conflict every patch is triaged; ``interactive`` (default: not on CI)
    then leaves the failed ``git am`` stopped in the workdir for
    :func:`skippy.queue.session.resume` (``invoke prepare --continue | --skip | --abort``).
    """
    started = time.monotonic()
    queue = load_queue(settings.patch_dir)
    pin = validate(settings, target)
    recorded = fast_noop(settings, queue, pin) if pin is not None else None
    if recorded is not None:
        report = Run(settings, console).report("noop", recorded, changed=0)
    else:
        run = Run(
            settings,
            console,
            force=force,
            offline=offline,
            interactive=(not settings.on_ci) if interactive is None else interactive,
            sleep=sleep,
            rerun=rerun_command(target, offline=offline),
            as_is_build=as_is_build,
        )
        rel = settings.relative(settings.workdir)
        with guarded(
            settings,
            console,
            rerun=rerun_command(target, force=force, offline=offline),
            untouched=f"{rel}: your files are as they were (a switch cut short is journaled and the next run "
            "finishes it); no stamp was written",
        ):
            report = converge(run, queue, target, pin)
    notes = ensure_compat_link(settings, console)
    return dataclasses.replace(report, seconds=time.monotonic() - started, notes=report.notes + notes)


def converge(run: Run, queue: Queue, target: Target, pin: str | None) -> PrepareReport:
    """The steps of a prepare under the lock: shape, recover, resolve, decide, apply and switch, stamp."""
    remove_partials(run)
    if missing(run):
        return cold(run, queue, target, pin)
    repo = run.repo()
    git_dir = check_is_our_repo(run, repo)
    recover(run, repo, git_dir)
    recorded = wd.read_stamp(git_dir)
    recognized = recognize(run, queue, repo, git_dir) if recorded is None else None
    work = wd.local_work(repo, git_dir, recorded or recognized, run.settings.tolerated_untracked)
    shallow = is_shallow_or_partial(repo, git_dir)
    committed = work.committed_only and not run.force and not shallow
    if not committed:
        refuse_or_discard(run, repo, git_dir, work)
    if shallow:
        return reclone(run, queue, target, pin)
    at = resolve(run, repo, target, pin)
    recorded = wd.read_stamp(git_dir) or recognized
    head = wd.head_of(repo, git_dir)
    if committed:
        return adopt_or_refuse(run, queue, repo, git_dir, at, work=work, since=recorded)
    if recorded is not None and decide(recorded, at, queue.digest, head) == "noop":
        if recorded is recognized:
            # the stamp the run that made HEAD wrote, with each patch's commit
            applied = applied_commits(repo, queue, recorded.base_commit, recorded.patched_sha)
            recorded = dataclasses.replace(recorded, applied=applied)
            wd.write_stamp(git_dir, recorded)
        return run.report("noop", recorded, changed=0)
    return apply_and_switch(run, queue, repo, git_dir, at, head=head, since=recorded)


def adopt_or_refuse(
    run: Run, queue: Queue, repo: Repo, git_dir: Path, at: Resolved, *, work: wd.LocalWork, since: wd.Stamp | None
) -> PrepareReport:
    """Commits in the workdir that the queue does not (yet) name: when the queue applied on the
    target gives HEAD's tree exactly (the maintainer regenerated the lanes from them), the workdir
    *is* the prepared tree: HEAD moves to the queue's own commit, which rewrites no file.  Else
    they are local work, refused with how HEAD's tree differs from the queue's."""
    head = repo.head()
    assert head is not None
    try:
        patched = apply_aside(run, queue, repo, git_dir, at.base, since=since)
    except ConflictError as exc:
        refuse_or_discard(
            run, repo, git_dir, work, differs=f"the queue does not apply on {at.upstream_sha[:12]}: {exc.what}"
        )
        raise
    differ = repo.out("diff", "--no-renames", "--name-status", patched, head)
    if differ:
        lines = differ.splitlines()
        shown = "\n".join(f"  {line}" for line in lines[:20]) + (
            f"\n  ... and {len(lines) - 20} more" if len(lines) > 20 else ""
        )
        refuse_or_discard(
            run,
            repo,
            git_dir,
            work,
            differs=f"HEAD's tree differs from the queue on {at.upstream_sha[:12]} in {len(lines)} file(s) "
            f"(queue -> HEAD):\n{shown}",
        )
    old = head[:12]
    changed = switch(run, queue, repo, git_dir, head=head, patched=patched, at=at)
    note = (
        f"HEAD {old} has the tree the queue gives on {at.upstream_sha[:12]}: the workdir is the prepared "
        f"tree (HEAD is now the queue's commit {patched[:12]}; no file was rewritten)"
    )
    run.console.info(note)
    run.notes.append(note)
    return run.report("adopted", stamp(git_dir, queue, at, patched, repo=repo), changed=changed)


def decide(recorded: wd.Stamp | None, at: Resolved, queue_digest: str, head: str | None) -> Decision:
    """Nothing to do when the stamp records this upstream and queue and HEAD is its patched commit
    (one a conflict session finished is not the queue's: its resolutions are local work)."""
    if (
        recorded is not None
        and recorded.marked
        and not recorded.resolved
        and recorded.upstream_sha == at.upstream_sha
        and recorded.queue_digest == queue_digest
        and head == recorded.patched_sha
    ):
        return "noop"
    return "apply"


def apply_and_switch(
    run: Run, queue: Queue, repo: Repo, git_dir: Path, at: Resolved, *, head: str | None, since: wd.Stamp | None
) -> PrepareReport:
    """Build the patched commit aside, move the workdir to it, stamp; a conflict is triaged
    (and, interactively, left stopped in the workdir) before it is raised."""
    try:
        patched = apply_aside(run, queue, repo, git_dir, at.base, since=since)
    except ConflictError as exc:
        raise on_conflict(run, queue, repo, git_dir, exc, at=at, head=head, since=since) from exc
    changed = switch(run, queue, repo, git_dir, head=head, patched=patched, at=at)
    return run.report("applied", stamp(git_dir, queue, at, patched, repo=repo), changed=changed)


def triage_target(
    settings: Settings,
    target: Target,
    *,
    console: Console,
    offline: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> TriageReport:
    """Try every patch against ``target`` without changing the workdir's checkout."""
    queue = load_queue(settings.patch_dir)
    pin = validate(settings, target)
    with guarded(
        settings,
        console,
        rerun=rerun_command(target, offline=offline, triage=True),
        untouched=f"{settings.relative(settings.workdir)}: its checkout and your files "
        "(triage works in a temporary worktree)",
    ):
        return _triage(Run(settings, console, offline=offline, sleep=sleep), queue, target, pin)


def _triage(run: Run, queue: Queue, target: Target, pin: str | None) -> TriageReport:
    from skippy.queue.triage import triage

    remove_partials(run)
    if missing(run):
        plain_checkout(run, target, pin)
    repo = run.repo()
    git_dir = check_is_our_repo(run, repo)
    remove_aside_worktrees(repo, git_dir)
    at = resolve(run, repo, target, pin)
    recorded = wd.read_stamp(git_dir)
    since = recorded.base_commit if recorded else None
    if since is None:
        with contextlib.suppress(SkippyError):
            since = resolve(run, repo, Target.pinned(), read_pin(run.settings)).base
    with run.console.step(f"triage: {len(queue.patches)} patches against {at.upstream_sha[:12]}"):
        return triage(repo, git_dir, queue, at.base, since)


def apply_queue_aside(settings: Settings, repo: Repo, base: str, queue: Queue, *, console: Console) -> str:
    """The patched commit of ``queue`` on ``base`` (a commit in ``repo``), built in a temporary
    worktree that shares ``repo``'s object store.  Deterministic; raises ConflictError; ``repo``'s
    own checkout is not touched."""
    git_dir = Path(repo.out("rev-parse", "--absolute-git-dir"))
    return apply_aside(Run(settings, console, offline=True), queue, repo, git_dir, base)


def resolve_target(
    settings: Settings, repo: Repo, target: Target, *, console: Console, offline: bool = False
) -> Resolved:
    """``(upstream SHA, local base commit, source)`` of ``target`` in ``repo`` (fetching, or
    importing the source archive, as prepare would)."""
    pin = read_pin(settings) if target.mode == "pinned" else None
    return resolve(Run(settings, console, offline=offline), repo, target, pin)
