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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippy.core import gitbulk
from skippy.core.errors import CommandError, DirtyWorkdirError, QueueError, SettingsError, SkippyError, WorkdirError
from skippy.core.files import same_folder, write_bytes_atomic
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import rangediff
from skippy.maintain.history import Commit, Lanes, lanes_of, refuse_merges
from skippy.maintain.replay import Replays, Store, applied_once, export_range, pinned_store, sub_queue
from skippy.queue import leftovers
from skippy.queue import workdir as wd
from skippy.queue.model import SERIES_LIMIT, Lane, load_queue, queue_file_bytes, unknown_entries
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


# --------------------------------------------------------------------------- backups


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes), for byte-for-byte comparisons."""
    out: dict[str, bytes] = {}
    if not folder.exists():
        return out
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(folder))] = path.read_bytes()
    return out


def back_up(patch_dir: Path, backups: Path) -> Path:
    """Copy the queue (through a linked patch dir or lane folder; file links stay links) under ``backups``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    target = backups / f"patches-{stamp}-{uuid.uuid4().hex[:6]}"
    backups.mkdir(parents=True, exist_ok=True)
    if patch_dir.is_dir():
        _copy(patch_dir, target)
    else:
        target.mkdir()
    return target


def _copy(src: Path, dst: Path) -> None:
    """Copy the folder ``src`` to the new ``dst``: links to folders are copied as folders, file links as links."""
    dst.mkdir()
    for child in sorted(src.iterdir()):
        if child.is_dir():
            _copy(child, dst / child.name)
        elif child.is_symlink():
            (dst / child.name).symlink_to(child.readlink())
        else:
            shutil.copy2(child, dst / child.name)


def prune_backups(backups: Path, *, keep: int, protect: Path) -> list[Path]:
    """Delete all but the newest ``keep`` queue backups (never ``protect``); the deleted ones, oldest first."""
    found = sorted(p for p in backups.glob("patches-*") if p.is_dir() and not p.is_symlink() and p != protect)
    doomed = found[: max(0, len(found) - (keep - 1))]
    removed = []
    for old in doomed:
        try:
            shutil.rmtree(old)
        except OSError:
            continue  # not ours to remove (permissions, a mount): left as it is
        removed.append(old)
    return removed


def restore(backup: Path, patch_dir: Path) -> bool:
    """Make ``patch_dir`` exactly the backup again, through links (a linked patch dir or lane folder
    stays a link; its target gets the bytes).  False when there was nothing to restore."""
    if patch_dir.is_dir() and same_folder(backup, patch_dir):
        return False
    _sync(backup, patch_dir)
    return True


def _sync(src: Path, dst: Path) -> None:
    """Make the folder ``dst`` (followed when it is a link) hold exactly what ``src`` holds."""
    dst.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in src.iterdir()}
    for child in dst.iterdir():
        keep = wanted.get(child.name)
        if keep is not None and keep.is_dir() and child.is_dir():
            continue  # synced below, through the link when it is one
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for name, source in sorted(wanted.items()):
        target = dst / name
        if source.is_dir():
            _sync(source, target)
        elif source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            shutil.copy2(source, target)


# --------------------------------------------------------------------------- the lanes on disk


def loose_items(patch_dir: Path) -> list[rangediff.Item]:
    """The queue's patches as files, valid or not (the range-diff's old side); one that is not a
    regular file inside the project (a link to /etc/shadow) is left out, never read."""
    files = [("core", p.name, p) for p in sorted(patch_dir.glob("*.patch"))] if patch_dir.is_dir() else []
    for lane in ("model_support", "generated"):
        folder = patch_dir / lane
        if not folder.is_dir():
            continue
        series = folder / "series"
        listed = queue_file_bytes(series, SERIES_LIMIT) if series.is_file() else None
        names = (
            [
                n.strip()
                for n in listed.decode("utf-8", errors="replace").splitlines()
                if n.strip() and not n.startswith("#")
            ]
            if listed is not None
            else sorted(p.name for p in folder.glob("*.patch"))
        )
        files += [(lane, n, folder / n) for n in names]
    found = [(lane, name, queue_file_bytes(path) if path.is_file() else None) for lane, name, path in files]
    return [rangediff.Item(lane, name, data) for lane, name, data in found if data is not None]


def write_lanes(patch_dir: Path, core: list[Path], model_support: list[Path]) -> None:
    """Replace the core and model_support lanes with the exported files (other files stay).

    A file that already holds the export's bytes is not written at all (its mode and time stay); a
    changed one is rewritten in place, keeping its mode; a new one gets the umask's mode, as ``open``
    gives it.  A link at a patch's place is replaced by a regular file, never written through."""
    patch_dir.mkdir(parents=True, exist_ok=True)
    _write_lane(patch_dir, core)
    folder = patch_dir / "model_support"
    if model_support:
        folder.mkdir(exist_ok=True)
    if folder.is_dir():
        _write_lane(folder, model_support)
        series = folder / "series"
        if model_support:
            names = sorted(p.name for p in model_support)
            _put(series, "".join(n + "\n" for n in names).encode("utf-8"))
        else:
            with contextlib.suppress(FileNotFoundError):
                series.unlink()


def _write_lane(folder: Path, files: list[Path]) -> None:
    """``folder``'s ``*.patch`` files become exactly ``files`` (by name), each through :func:`_put`."""
    wanted = {path.name: path for path in files}
    for old in folder.glob("*.patch"):
        if old.name not in wanted:
            old.unlink()
    for name, path in wanted.items():
        _put(folder / name, path.read_bytes())


def _put(path: Path, data: bytes) -> None:
    """``path`` holds ``data``: untouched when it already does, else written by
    :func:`write_bytes_atomic` (a regular file keeps its mode, a new one gets the umask's, a link
    is replaced, never written through)."""
    if not path.is_symlink() and path.is_file() and path.read_bytes() == data:
        return
    write_bytes_atomic(path, data)


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
            backups = settings.cache_dir / "backups"
            try:
                backup = back_up(patch_dir, backups)
            except OSError as exc:
                raise cannot_write(
                    settings, exc, "backing up the queue", untouched="the queue: nothing was changed", rerun=rerun
                ) from exc
            console.info(f"backed up {settings.relative(patch_dir)} to {settings.relative(backup)}")
            leftovers.regenerate_started(settings, backup)
            try:
                with _scratch(settings) as scratch:
                    with console.step(f"export the lanes ({store.base[:12]}..{core[:12]}..{ms[:12]})"):
                        core_files = export_range(repo, f"{store.base}..{core}", scratch / "core")
                        ms_files = export_range(repo, f"{core}..{ms}", scratch / "model_support")
                    write_lanes(patch_dir, core_files, ms_files)
                patched, generated = _verify(settings, store, ms, console=console)
            except BaseException as exc:
                replacement = _put_back(settings, backup, exc, rerun)
                if replacement is exc:
                    raise
                raise replacement from exc
            leftovers.regenerate_ended(settings)
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


def refuse_generated_changes(settings: Settings, store: Store, history: Lanes, rerun: str) -> None:
    """Refuse, before anything is written, a commit whose trailer puts it in the generated lane but
    whose change is not that lane's patch of the same name: regenerate never writes the generated
    lane (``invoke generate`` does), so the change would be dropped without a word."""
    generated = [c for c in history.commits if c.lane is Lane.GENERATED]
    if not generated:
        return
    repo = store.repo
    lane = {item.name: item for item in loose_items(settings.patch_dir) if item.lane == Lane.GENERATED.value}
    names = {c.sha: (c.label or "").split("/", 1)[1] for c in generated}
    changes = _commit_changes(repo, [c.sha for c in generated])
    found: list[tuple[Commit, str]] = []
    for commit in generated:
        name = names[commit.sha]
        if name not in lane:
            found.append((commit, f"the generated lane holds no {name}"))
            continue
        declared = _patch_changes(lane[name].data)
        if declared is not None and declared == changes.get(commit.sha):
            continue  # the same blobs and modes as the patch's full-index lines: exactly the patch
        why = _differs_from_patch(repo, commit.sha, settings.patch_dir / Lane.GENERATED.value / name)
        if why:
            found.append((commit, why))
    if not found:
        return
    rel = settings.relative(repo.path)
    first = found[0][0]
    named = ", ".join(f"{c.sha[:12]} ({c.subject})" for c, _ in found)
    raise QueueError(
        f"{'commit' if len(found) == 1 else 'commits'} {named} "
        f"{'carries' if len(found) == 1 else 'carry'} a `Skippy-Patch: generated/...` trailer but "
        f"{'its change is not' if len(found) == 1 else 'their changes are not'} the generated lane's patch: "
        "regenerate never writes the generated lane (`invoke generate` does), so the change would be dropped",
        details="\n".join(f"- {c.sha[:12]} Skippy-Patch: {c.label}: {why}" for c, why in found),
        untouched="everything: the queue and the workdir were not changed",
        next_step=f"move the change into a core or model_support commit: `git -C {rel} rebase -i "
        f"{store.base[:12]}`, `edit` {first.sha[:12]}, take your change out of it (the generated commit "
        "stays as the lane holds it) and commit it without a trailer after the generated commits (it joins "
        "model_support) or as a `--fixup` of a core/model_support commit; if it is the generator's change, "
        f"drop it there and run `invoke generate`; then re-run `{rerun}`",
    )


#: one file a change makes: (path, old blob, new blob, new mode); a null blob where the file is not
Changed = tuple[str, str, str, str]


def _commit_changes(repo: Repo, shas: list[str]) -> dict[str, frozenset[Changed]]:
    """The files each commit changes against its parent, by blob id (one ``diff-tree --stdin``)."""
    return {
        sha: frozenset((path, *change) for path, change in files.items())
        for sha, files in gitbulk.commit_changes(repo, shas).items()
    }


def _patch_changes(data: bytes) -> frozenset[Changed] | None:
    """The files a ``--full-index`` patch changes, by blob id, as :func:`_commit_changes` gives a
    commit's; None when a file of it carries no full blob ids (then only applying it tells)."""
    text = data.decode("utf-8", errors="replace")
    files = gitbulk.diff_files(text)
    if len(files) != text.count("\ndiff --git ") or any(len(c.old) != 40 or len(c.new) != 40 for c in files.values()):
        return None
    return frozenset((path, *change) for path, change in files.items())


def _differs_from_patch(repo: Repo, sha: str, patch: Path) -> str | None:
    """How commit ``sha`` differs from ``patch`` applied on its parent (None: it is that patch, exactly)."""
    scratch = wd.skippy_dir(repo.git_dir())
    scratch.mkdir(parents=True, exist_ok=True)
    index = scratch / "generated-check.index"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        repo.git("read-tree", f"{sha}^", env=env)
        applied = repo.git("apply", "--cached", "--whitespace=nowarn", str(patch.absolute()), env=env, check=False)
        if not applied.ok:
            return f"{patch.name} does not apply on its parent commit"
        tree = repo.git("write-tree", env=env).stdout.strip()
        differ = repo.git("diff", "--no-renames", "--name-only", tree, sha, check=False).stdout.splitlines()
    finally:
        with contextlib.suppress(FileNotFoundError):
            index.unlink()
    changed = [line for line in differ if line.strip()]
    return f"differs from {patch.name} (applied on its parent) in {', '.join(changed)}" if changed else None


def _put_back(settings: Settings, backup: Path, exc: BaseException, rerun: str) -> BaseException:
    """Restore the queue after a failed regenerate; the exception to raise (``exc``, or an error of its
    class told again with what the restore left)."""
    patch_dir = settings.patch_dir
    shown, saved = settings.relative(patch_dir), settings.relative(backup)
    try:
        restored = restore(backup, patch_dir)
    except OSError as failed:
        where = failed.filename or patch_dir
        return QueueError(
            f"regenerate failed ({_cause(exc)}) and the previous queue could not be put back: "
            f"cannot write {where}: {failed.strerror or failed}",
            untouched=f"the previous queue, byte for byte, in {saved} (nothing there was changed)",
            details=f"{shown} may hold a partly written, UNVERIFIED queue: do not prepare or commit it",
            next_step=f"make {where} writable, then copy the backup back (`rm -r {shown} && cp -a {saved} {shown}`, "
            f"or the files into the linked folder) and re-run `{rerun}`",
        )
    leftovers.regenerate_ended(settings)  # the previous queue is back: nothing unverified is left
    untouched = (
        f"the queue: {shown} was restored byte for byte from {saved}"
        if restored
        else f"the queue: {shown} holds exactly its previous bytes (backup in {saved})"
    )
    if isinstance(exc, OSError):
        return cannot_write(settings, exc, "writing the new queue", untouched=untouched, rerun=rerun)
    if isinstance(exc, CommandError):
        fatal = [line for line in exc.output_tail.splitlines() if line.startswith(("fatal:", "error:"))]
        return exc.restated(
            what=f"{exc.what}: {fatal[-1]}" if fatal else exc.what,
            untouched=untouched,
            next_step=exc.next_step or f"fix the cause named above, then re-run `{rerun}`",
        )
    if isinstance(exc, SkippyError):
        return exc.restated(untouched=untouched)
    return exc


def _cause(exc: BaseException) -> str:
    if isinstance(exc, SkippyError):
        return exc.what
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
    return type(exc).__name__


def cannot_write(settings: Settings, exc: OSError, doing: str, *, untouched: str, rerun: str) -> SkippyError:
    """A file-system failure as an error naming the path and the cause (never a traceback)."""
    where = Path(exc.filename) if exc.filename else None
    shown = settings.relative(where) if where is not None else "a file"
    cause = exc.strerror or str(exc)
    hint = {
        "EROFS": "the file system is mounted read-only",
        "ENOSPC": "the disk is full",
        "EDQUOT": "the disk quota is exhausted",
        "ENOTDIR": "a file stands where a folder is expected",
        "EEXIST": "a file stands where a folder is expected",
        "EISDIR": "a folder stands where a file is expected",
        "EACCES": "no write permission",
        "EPERM": "an immutable file or folder, or the file system refuses it",
    }.get(errno.errorcode.get(exc.errno or 0, ""), "")
    queue_side = where is None or any(
        where == top or top in where.parents for top in (settings.patch_dir, settings.patch_dir.resolve())
    )
    error_type: type[SkippyError] = QueueError if queue_side or doing.startswith("backing up") else WorkdirError
    return error_type(
        f"{doing} failed: cannot write {shown}: {cause}" + (f" ({hint})" if hint else ""),
        untouched=untouched,
        next_step=f"make {shown} writable (or free space / move it aside), then re-run `{rerun}`",
    )


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
