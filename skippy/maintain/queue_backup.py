"""The queue's backup for ``invoke regenerate``: made before anything is written, put back after a failure.

The patch dir is copied byte for byte under ``<cache_dir>/backups/`` (through a linked patch
dir or lane folder; file links stay links); a failed regenerate restores it through the links
and tells its error again with what the restore left (:func:`put_back`); a successful one
prunes all but the newest backups.  A file that cannot be written ends in an error naming the
path and the cause (:func:`cannot_write`), never in a traceback.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import shutil
import uuid
from pathlib import Path

from skippy.core.errors import CommandError, QueueError, SkippyError, WorkdirError
from skippy.core.files import same_folder
from skippy.core.settings import Settings
from skippy.queue import leftovers


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


def put_back(settings: Settings, backup: Path, exc: BaseException, rerun: str) -> BaseException:
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
