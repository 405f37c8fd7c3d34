"""``invoke regenerate``: rebuild the core and model_support lanes from branches carried on the pin.

    core lane          = <pin>..<core head>
    model_support lane = <core head>..<model-support head>

1. the current patch dir is backed up (byte for byte) under
   ``<cache_dir>/backups/`` (the newest KEEP_BACKUPS are kept after a success);
2. each lane is exported with ``git format-patch --start-number 1`` and the
   fixed options of :mod:`skippy.maintain.replay` (zero commit, no signature,
   ``[PATCH]`` subjects, full index, fixed diffstat, no renames, myers, all
   output-shaping config forced), so re-exporting an unchanged branch gives
   the same bytes; ``model_support/series`` lists the sorted names;
3. the generated lane is left as it is unless its inputs changed
   (``generated/inputs.sha256``), in which case it is regenerated;
4. the new queue is replayed on a clean checkout of the pin (a temporary
   worktree): the tree after the two lanes must be the model-support head's
   tree, and the whole queue must apply.  Each patch is applied once: the
   generated lane (made again, and checked) goes on top of the lanes applied
   for the tree check.  On any failure the backup is restored byte for byte
   and the error says what differed;
5. a range-diff report classifies every patch (unchanged, context, changed,
   new, dropped).

Before any of this, the checkout the branches come from must hold no
uncommitted change (tracked edits, untracked files other than the tolerated
build outputs, an operation in progress): ``format-patch`` exports commits
only, so such work would silently be left out of the queue.  A patch dir that
is a symlink is written, backed up and restored through the link.  A file
that cannot be written (a read-only or full file system, a file where a
folder is expected) ends in an error naming the path and the cause, never in
a traceback or an unverified queue.

The backup and its restore are :mod:`skippy.maintain.queue_backup`'s, the lanes'
files :mod:`skippy.maintain.lanefiles`'s, the refusal of a generated-lane commit
that is not the lane's patch :mod:`skippy.maintain.generated_commits`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippy.core.errors import DirtyWorkdirError, QueueError, SettingsError, WorkdirError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import rangediff
from skippy.maintain.generated_commits import refuse_generated_changes
from skippy.maintain.history import Lanes, lanes_of, refuse_merges
from skippy.maintain.lanefiles import loose_items, write_lanes
from skippy.maintain.queue_backup import back_up, cannot_write, prune_backups, put_back
from skippy.maintain.replay import Replays, Store, applied_once, export_range, pinned_store, sub_queue
from skippy.queue import leftovers
from skippy.queue import workdir as wd
from skippy.queue.model import Lane, load_queue, unknown_entries
from skippy.queue.session import after_regenerate

#: queue backups kept under ``<cache_dir>/backups`` after a successful regenerate (a failed one keeps all)
KEEP_BACKUPS: Final = 10


@dataclass(frozen=True)
class RegenerateReport:
    upstream_sha: str
    core_head: str
    model_support_head: str
    patched_sha: str
    backup: Path
    entries: tuple[rangediff.Entry, ...]
    generated: str  # "kept" | "regenerated" | "none"
    counts: dict[str, int]
    #: the workdir history the lanes were read from (no heads given)
    history: Lanes | None = None
    #: what to run next: prepare and check at the pin, pin-bump elsewhere
    next_step: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "from_history": None
            if self.history is None
            else {
                "commits": [
                    {"sha": c.sha, "subject": c.subject, "lane": c.lane.value, "patch": c.label}
                    for c in self.history.commits
                ],
                "reordered": self.history.reordered,
            },
            "upstream_sha": self.upstream_sha,
            "core_head": self.core_head,
            "model_support_head": self.model_support_head,
            "patched_sha": self.patched_sha,
            "backup": str(self.backup),
            "generated_lane": self.generated,
            "lanes": self.counts,
            "range_diff": [e.as_dict() for e in self.entries],
            "range_diff_counts": rangediff.counts(self.entries),
            "next": self.next_step,
        }

    def render(self) -> str:
        read = []
        if self.history is not None:
            new = len(self.history.new())
            read.append(
                f"read from the workdir's history: {len(self.history.commits)} commit(s) on {self.upstream_sha[:12]}"
                + (f", {new} new" if new else "")
                + (" (put in lane order aside)" if self.history.reordered else "")
            )
        return "\n".join(
            [
                *read,
                rangediff.render(self.entries),
                f"lanes: {self.counts['core']} core, {self.counts['model_support']} model_support, "
                f"{self.counts['generated']} generated (generated lane {self.generated})",
                f"verified: the new queue on {self.upstream_sha[:12]} gives {self.patched_sha[:12]}; "
                f"the lanes reproduce {self.model_support_head[:12]}'s tree",
                f"backup of the previous queue: {self.backup}",
            ]
        )


# --------------------------------------------------------------------------- regenerate


def _commit(repo: Repo, ref: str, flag: str) -> str:
    sha = repo.rev_parse(f"{ref}^{{commit}}")
    if sha is None:
        raise SettingsError(
            f"{flag} {ref!r} is not a commit in {repo.path}",
            untouched="everything: the queue was not changed",
            next_step=f"pass a branch or commit of that checkout ({flag} my-branch)",
        )
    return sha


def _check_range(repo: Repo, lower: str, upper: str, what: str) -> None:
    if not repo.is_ancestor(lower, upper):
        raise QueueError(
            f"{what}: {upper[:12]} does not descend from {lower[:12]}",
            untouched="everything: the queue was not changed",
            next_step="rebase the branch onto the pin (core) or onto the core head (model_support)",
        )
    refuse_merges(
        repo, lower, upper, what=what, next_step="linearize the branch (git rebase) so every commit is one patch"
    )


def _scratch(settings: Settings) -> contextlib.AbstractContextManager[Path]:
    """A scratch folder of this run (what a killed run left there is removed by the next one)."""
    from skippy.queue.scratch import owned_scratch

    return owned_scratch(settings.cache_dir / "tmp", "regenerate-")


def regenerate(
    settings: Settings,
    *,
    core_head: str | None = None,
    model_support_head: str | None = None,
    console: Console,
    checkout: Path | None = None,
    offline: bool = False,
) -> RegenerateReport:
    """Rebuild the core and model_support lanes from ``core_head`` and ``model_support_head``, or,
    without them, from the history of the prepared workdir (or ``checkout``) read through the
    ``Skippy-Patch`` trailers (:mod:`skippy.maintain.history`)."""
    patch_dir = settings.patch_dir
    if core_head and model_support_head:
        rerun = f"invoke regenerate --core-head {core_head} --model-support-head {model_support_head}"
    else:
        rerun = "invoke regenerate" + (f" --checkout {checkout}" if checkout is not None else "")
    _refuse_strays(settings, rerun)
    try:
        old_items = loose_items(patch_dir)
        from_history = not (core_head and model_support_head)
        opened = (
            prepared_store(settings, console=console)
            if from_history and checkout is None
            else pinned_store(settings, console=console, checkout=checkout, offline=offline)
        )
        with opened as store:
            repo = store.repo
            if store.shared:
                refuse_uncommitted(settings, repo, rerun)
            core, ms, history = _heads(settings, store, core_head, model_support_head, rerun, console=console)
            _check_range(repo, store.base, core, "core lane")
            _check_range(repo, core, ms, "model_support lane")
            backup, patched, generated = _rewrite(settings, store, core, ms, rerun, console=console)
    except OSError as exc:
        nothing = "the queue: nothing was changed"
        raise cannot_write(settings, exc, "regenerate", untouched=nothing, rerun=rerun) from exc
    pruned = prune_backups(settings.cache_dir / "backups", keep=KEEP_BACKUPS, protect=backup)
    if pruned:
        console.info(f"removed {len(pruned)} older queue backup(s); the newest {KEEP_BACKUPS} are kept")
    queue = load_queue(patch_dir)
    new_items = [rangediff.Item(p.lane.value, p.name, p.data) for p in queue.patches]
    counts = {lane.value: len(queue.lane(lane)) for lane in Lane}
    return RegenerateReport(
        store.upstream_sha,
        core,
        ms,
        patched,
        backup,
        rangediff.range_diff(old_items, new_items),
        generated,
        counts,
        history=history,
        next_step=after_regenerate(settings, store.upstream_sha, store.base),
    )


def _rewrite(
    settings: Settings, store: Store, core: str, ms: str, rerun: str, *, console: Console
) -> tuple[Path, str, str]:
    """Back the queue up, write the lanes exported from ``store.base..core..ms`` and verify the new
    queue; on any failure the backup is put back.  (the backup, the patched commit, the generated
    lane's status)"""
    patch_dir = settings.patch_dir
    try:
        backup = back_up(patch_dir, settings.cache_dir / "backups")
    except OSError as exc:
        raise cannot_write(
            settings, exc, "backing up the queue", untouched="the queue: nothing was changed", rerun=rerun
        ) from exc
    console.info(f"backed up {settings.relative(patch_dir)} to {settings.relative(backup)}")
    leftovers.regenerate_started(settings, backup)
    try:
        with _scratch(settings) as scratch:
            with console.step(f"export the lanes ({store.base[:12]}..{core[:12]}..{ms[:12]})"):
                core_files = export_range(store.repo, f"{store.base}..{core}", scratch / "core")
                ms_files = export_range(store.repo, f"{core}..{ms}", scratch / "model_support")
            write_lanes(patch_dir, core_files, ms_files)
        patched, generated = _verify(settings, store, ms, console=console)
    except BaseException as exc:
        replacement = put_back(settings, backup, exc, rerun)
        if replacement is exc:
            raise
        raise replacement from exc
    leftovers.regenerate_ended(settings)
    return backup, patched, generated


def _refuse_strays(settings: Settings, rerun: str) -> None:
    patch_dir = settings.patch_dir
    strays = unknown_entries(patch_dir) if patch_dir.is_dir() else []
    if strays:
        raise QueueError(
            f"the patch dir {settings.relative(patch_dir)} holds {len(strays)} "
            f"{'entry that belongs' if len(strays) == 1 else 'entries that belong'} to no lane",
            details="\n".join(v.render(patch_dir) for v in strays),
            untouched="everything: the queue was not changed",
            next_step=f"rename or move the entries named above, then re-run `{rerun}`",
        )


@contextlib.contextmanager
def prepared_store(settings: Settings, *, console: Console) -> Iterator[Store]:
    """The workdir as a store whose base is the one it was prepared on (its stamp): the pin, or the
    commit a conflict session was resolved against.  Held under the prepare lock."""
    from skippy.queue.guard import locked

    rel = settings.relative(settings.workdir)
    git_dir = wd.git_dir_of(settings.workdir)
    stamp = wd.read_stamp(git_dir) if git_dir is not None else None
    if git_dir is None or stamp is None:
        raise WorkdirError(
            f"{rel} holds no prepared tree to regenerate the lanes from"
            + (" (no skippy stamp)" if git_dir is not None else " (no git checkout)"),
            untouched="everything: the queue was not changed",
            next_step="`invoke prepare`, commit your changes in "
            f"{rel}, then `invoke regenerate`; or name branches of another checkout: "
            "`invoke regenerate --core-head BRANCH --model-support-head BRANCH --checkout PATH`",
        )
    with locked(settings, console):
        repo = Repo(settings.workdir, settings.env, echo=console.command)
        yield Store(repo, stamp.upstream_sha, stamp.base_commit, stamp.source, shared=True)


def _heads(
    settings: Settings, store: Store, core_head: str | None, ms_head: str | None, rerun: str, *, console: Console
) -> tuple[str, str, Lanes | None]:
    """The two heads to export: the branches given, or the lanes read from the history."""
    if core_head and ms_head:
        return _commit(store.repo, core_head, "--core-head"), _commit(store.repo, ms_head, "--model-support-head"), None
    history = _history(settings, store, rerun, console=console)
    refuse_generated_changes(settings, store, history, rerun)
    return history.core_head, history.model_support_head, history


def _history(settings: Settings, store: Store, rerun: str, *, console: Console) -> Lanes:
    """The lanes of ``store.base..HEAD`` read from the trailers; new commits named on the console."""
    repo = store.repo
    head = repo.head()
    if head is None:
        raise WorkdirError(
            f"{settings.relative(repo.path)} has no HEAD",
            untouched="everything: the queue was not changed",
            next_step="`invoke prepare`, then commit your changes and re-run `invoke regenerate`",
        )
    if not repo.is_ancestor(store.base, head):
        raise QueueError(
            f"HEAD {head[:12]} does not descend from the prepared base {store.base[:12]} "
            f"(upstream {store.upstream_sha[:12]})",
            untouched="everything: the queue was not changed",
            next_step=f"rebase your commits onto it (`git -C {settings.relative(repo.path)} rebase "
            f"{store.base[:12]}`), then re-run `{rerun}`",
        )
    lanes = lanes_of(repo, repo.git_dir(), store.base, head, rerun=rerun)
    for commit in lanes.new():
        console.info(f"new commit {commit.sha[:12]} ({commit.subject}): {commit.lane.value} lane")
    if lanes.reordered:
        console.info("the core and model_support commits were put in lane order aside (the workdir is untouched)")
    return lanes


def refuse_uncommitted(settings: Settings, repo: Repo, rerun: str) -> None:
    """Refuse to export branches from a checkout holding work that ``format-patch`` would leave out."""
    changed: list[str] = []
    for xy, path in wd.status_entries(repo):
        if xy == "??" and wd.is_tolerated(path, settings.tolerated_untracked):
            continue
        changed.append(f"{'untracked' if xy == '??' else xy.strip() or 'changed'}  {path}")
    progress = wd.in_progress(repo.git_dir())
    if not changed and progress is None:
        return
    where = settings.relative(repo.path)
    lines = ([f"{progress[1]} is in progress"] if progress else []) + changed[:30]
    if len(changed) > 30:
        lines.append(f"... and {len(changed) - 30} more (`git -C {where} status`)")
    raise DirtyWorkdirError(
        f"{where} holds uncommitted changes that `regenerate` would not export "
        f"({len(changed)} file(s){', ' + progress[1] + ' in progress' if progress else ''})",
        details="\n".join(lines),
        untouched=f"everything: the queue and {where} were not changed",
        next_step=f"commit them onto the branch they belong to (`git -C {where} commit`), or set them aside "
        f"(`git -C {where} stash --include-untracked`), then re-run `{rerun}`",
    )


def _verify(settings: Settings, store: Store, ms: str, *, console: Console) -> tuple[str, str]:
    """Replay the new queue on the pin; the lanes must give ``ms``'s tree.  (patched commit, generated status)

    Each patch is applied once, in one temporary worktree (:func:`applied_once`): the generated
    lane, when its inputs changed, is made on the lanes applied here, and the whole queue's check
    applies only the generated lane, on top of them."""
    with applied_once(settings, store.repo, store.base, console=console) as replays:
        return _verify_in(settings, store, ms, replays, console=console)


def _verify_in(settings: Settings, store: Store, ms: str, replays: Replays, *, console: Console) -> tuple[str, str]:
    from skippy.maintain import generate, genfiles, genmanifest

    repo = store.repo
    queue = load_queue(settings.patch_dir)
    lower = sub_queue(queue, (Lane.CORE, Lane.MODEL_SUPPORT))
    with console.step(f"verify: replay {len(lower.patches)} lane patch(es) on a clean checkout of the pin"):
        tip = replays.replay(lower).patched
    wanted, got = repo.out("rev-parse", f"{ms}^{{tree}}"), repo.out("rev-parse", f"{tip}^{{tree}}")
    if wanted != got:
        differ = repo.out("diff", "--no-renames", "--name-status", tip, ms)
        raise QueueError(
            f"the exported lanes replayed on the pin do not give the tree of {ms[:12]} "
            f"(tree {got[:12]}, not {wanted[:12]})",
            details="files that differ (replayed -> head):\n" + differ,
            next_step="look for what `git format-patch`/`git am` cannot carry (CR line endings, empty commits), "
            "fix the branch, then re-run `invoke regenerate`",
        )
    status = "none"
    spec = generate.load_spec(settings)
    folder = generate.lane_dir(settings)
    if spec is not None:
        expected = genmanifest.expected_inputs(settings, spec, store.upstream_sha, queue)
        if generate.recorded_inputs(settings) == expected:
            status = "kept"
        else:
            with console.step("the generated lane's inputs changed: regenerate it"):
                # its replay of the lanes is the one above (applied_once)
                lane = generate.generate_lane(
                    settings, repo, store.base, upstream_sha=store.upstream_sha, queue=queue, spec=spec, console=console
                )
                genfiles.write_lane(folder, lane)
            status = "regenerated"
    elif queue.lane(Lane.GENERATED):
        status = "kept"
    queue = load_queue(settings.patch_dir)
    if not queue.lane(Lane.GENERATED):
        return tip, status
    with console.step("verify: the whole queue applies (the generated lane on the lanes applied above)"):
        patched = replays.replay(queue).patched
    return patched, status
