"""``invoke status``: wanted (pin, queue digest) vs actual (stamp, HEAD, work tree),
and what ``invoke prepare --pinned`` would do.  Read-only and offline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skippy.core.errors import SkippyError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.queue import workdir as wd
from skippy.queue.am_output import unmerged_paths
from skippy.queue.damage import refuse_damaged_git_dir
from skippy.queue.model import load_queue
from skippy.queue.session import am_running, next_commands
from skippy.queue.target import read_pin


@dataclass(frozen=True)
class Status:
    workdir: str
    pin: str | None
    queue_digest: str | None
    queue_patches: int
    queue_error: str | None
    exists: bool
    head: str | None
    stamp: wd.Stamp | None
    work: wd.LocalWork | None
    interrupted: str | None
    would: str
    up_to_date: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "workdir": self.workdir,
            "pin": self.pin,
            "queue": {"digest": self.queue_digest, "patches": self.queue_patches, "error": self.queue_error},
            "exists": self.exists,
            "head": self.head,
            "stamp": self.stamp.as_dict() if self.stamp else None,
            "local_work": self.work.as_dict() if self.work else None,
            "interrupted": self.interrupted,
            "would": self.would,
            "up_to_date": self.up_to_date,
        }

    def render(self) -> str:
        def short(value: str | None) -> str:
            return value[:12] if value else "-"

        lines = [
            f"workdir:       {self.workdir}" + ("" if self.exists else " (missing)"),
            f"pin:           {self.pin or '-'}",
            f"upstream:      {self.stamp.upstream_sha if self.stamp else '-'}"
            + (f" (from {self.stamp.source})" if self.stamp else ""),
            f"patched:       {self.stamp.patched_sha if self.stamp else '-'}",
            f"base:          {self.stamp.base_commit}"
            + (f" (stands for upstream {self.stamp.upstream_sha[:12]})" if self.stamp.source == "archive" else "")
            + f" (rebase onto it: `git -C {self.workdir} rebase -i --autosquash {self.stamp.base_commit[:12]}`)"
            if self.stamp
            else "base:          -",
            f"HEAD:          {self.head or '-'}",
            f"queue digest:  {short(self.queue_digest)} ({self.queue_patches} patches)"
            + (
                f", recorded {short(self.stamp.queue_digest)}"
                + (" (same)" if self.stamp.queue_digest == self.queue_digest else " (differs)")
                if self.stamp
                else ""
            ),
        ]
        if self.queue_error:
            lines.append(f"queue:         INVALID: {self.queue_error}")
        if self.interrupted:
            lines.append(f"interrupted:   {self.interrupted}")
        if self.work is not None:
            findings = self.work.findings()
            lines.append("local work:    " + ("none" if not findings else findings[0]))
            lines.extend("               " + f for f in findings[1:])
        lines.append(f"prepare would: {self.would}")
        return "\n".join(lines)


def build_moved_on(backend: str, build: Mapping[str, Any], status: Status) -> str | None:
    """What moved in the workdir since ``build`` (one of ``invoke status``'s newest builds) was
    made, or None: a ``--workdir-as-is`` build of another HEAD, a build of an earlier prepare."""
    built = str(build.get("patched_sha") or "")
    if build.get("mode") == "local":
        if status.head is None or built == status.head:
            return None
        return (
            f"HEAD has moved since (now {status.head[:12]}): this is not the workdir as it stands; "
            f"`nox -s build-{backend} -- --workdir-as-is` builds that, `nox -s build-{backend}` the prepared tree"
        )
    if status.stamp is None or built == status.stamp.patched_sha:
        return None
    return (
        f"the workdir was prepared again since (patched now {status.stamp.patched_sha[:12]}): "
        f"`nox -s build-{backend}` builds it"
    )


def compute_status(settings: Settings) -> Status:
    digest, count, queue_error = _queue_state(settings)
    pin: str | None
    try:
        pin = read_pin(settings)
    except SkippyError as exc:
        pin = None
        queue_error = queue_error or exc.what
    rel = settings.relative(settings.workdir)
    git_dir = wd.git_dir_of(settings.workdir)
    if not settings.workdir.exists() or git_dir is None:
        exists = settings.workdir.exists()
        would = "clone upstream, check out the pin and apply the queue"
        if exists:
            would = f"refuse: {rel} exists but is not a git checkout skippy can manage"
        return Status(rel, pin, digest, count, queue_error, exists, None, None, None, None, would, False)
    refuse_damaged_git_dir(settings, git_dir)
    repo = Repo(settings.workdir, settings.env)
    stamp = wd.read_stamp(git_dir)
    journal = wd.read_journal(git_dir)
    interrupted = _interrupted(repo, journal) if journal else None
    work = wd.local_work(repo, git_dir, stamp, settings.tolerated_untracked)
    head = repo.head()
    up_to_date = bool(
        stamp
        and pin
        and stamp.upstream_sha == pin
        and stamp.queue_digest == digest
        and head == stamp.patched_sha
        and work.empty
        and journal is None
    )
    if queue_error:
        would = "refuse: fix the queue / pin first"
    elif journal is not None:
        would = _would_recover(journal, repo, rel)
    elif up_to_date:
        would = "nothing (up to date)"
    else:
        would = _would(pin, digest, stamp, work)
    return Status(rel, pin, digest, count, queue_error, True, head, stamp, work, interrupted, would, up_to_date)


def _queue_state(settings: Settings) -> tuple[str | None, int, str | None]:
    """``(digest, number of patches, error)`` of the queue as it is on disk."""
    try:
        queue = load_queue(settings.patch_dir)
    except SkippyError as exc:
        return None, 0, exc.what
    return queue.digest, len(queue.patches), None


def _interrupted(repo: Repo, journal: wd.Journal) -> str:
    if journal.op != "session":
        return f"a prepare was interrupted ({journal.op})"
    if not am_running(repo):
        return (
            f"a conflict session stopped at {journal.stopped_patch}, its `git am` ended outside skippy "
            "(nothing to continue)"
        )
    unmerged = unmerged_paths(repo)
    return f"a conflict session is stopped at {journal.stopped_patch}: " + (
        f"conflicts in {', '.join(unmerged)}"
        if unmerged
        else "the patch does not apply and git wrote no conflict markers"
    )


def _would_recover(journal: wd.Journal, repo: Repo, rel: str) -> str:
    """What prepare does first with the journal an interrupted run left (or a stopped session)."""
    if journal.op == "session":
        return (
            "refuse while the conflict session is stopped (`invoke prepare --force` saves it under a backup "
            f"ref and discards it); next: {next_commands(repo, rel)}"
        )
    if journal.op == "switch" and journal.to_commit:
        return (
            f"finish the interrupted move to {journal.to_commit[:12]} (over the files it wrote only: files "
            "changed since are refused, or saved first with --force), then converge"
        )
    return "recover the interrupted run, then re-apply"


def _would(pin: str | None, digest: str | None, stamp: wd.Stamp | None, work: wd.LocalWork) -> str:
    """What prepare does with a workdir that no run left half-done and that is not up to date."""
    if stamp is None and work.head_problem and not (work.modified or work.untracked or work.in_progress):
        return (
            "check whether HEAD is this queue applied on its upstream base (replaying the queue in a "
            "temporary worktree): if so carry on from it, else refuse (local commits)"
        )
    if not work.empty:
        return _would_with_work(work, unchanged_queue=stamp is not None and stamp.queue_digest == digest)
    if stamp is None:
        return f"check out {pin[:12] if pin else 'the pin'} and apply the queue"
    if pin and stamp.upstream_sha != pin:
        return f"move from upstream {stamp.upstream_sha[:12]} to the pin {pin[:12]} and re-apply the queue"
    if stamp.queue_digest != digest:
        return "re-apply the changed queue (only files whose content changes are rewritten)"
    return f"move HEAD back to the patched commit {stamp.patched_sha[:12]}"


def _would_with_work(work: wd.LocalWork, *, unchanged_queue: bool) -> str:
    if work.committed_only and work.unqueued and unchanged_queue:
        # the queue is still the one the session stopped on: it cannot give the resolved tree
        return (
            "refuse: the conflict session's resolution is local work, not in the queue (`invoke regenerate` "
            "carries it there, then prepare takes the workdir as prepared; `--workdir-as-is` builds it as it "
            "stands; `--force` discards it after a backup)"
        )
    if work.committed_only:
        return (
            "apply the queue aside: when it gives HEAD's tree (after `invoke regenerate`), take the workdir "
            "as prepared (no file rewritten); else refuse: the commits are not in the queue"
        )
    return "refuse: local work present (commit it into the queue, or use --force: it is backed up first)"
