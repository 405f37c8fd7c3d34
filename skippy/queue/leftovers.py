"""What a killed run left, told and swept by the next command of any kind.

* A regenerate killed between writing the new lanes and verifying them leaves an
  unverified queue in the patch dir: its marker (:func:`regenerate_started`, removed
  when the run ends either way) names the backup of the previous queue.  While the
  patch dir differs from that backup, every command warns, naming both ways out;
  once it is back (restored by hand) or a regenerate ends, the marker goes.
* Temporary worktrees under ``<workdir>/.git/skippy/aside`` (a killed prepare, check or
  regenerate) are removed, with the space they held, when no run holds the workdir's
  lock (a live run's worktree is never touched).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from skippy.core.files import same_folder, write_text_atomic
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd

MARKER = "regenerate-running.json"


def marker_path(settings: Settings) -> Path:
    return settings.cache_dir / MARKER


def regenerate_started(settings: Settings, backup: Path) -> None:
    """Record a regenerate about to write the lanes (the backup holds the previous queue)."""
    data = {"pid": os.getpid(), "backup": str(backup), "patch_dir": str(settings.patch_dir)}
    path = marker_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data) + "\n")


def regenerate_ended(settings: Settings) -> None:
    with contextlib.suppress(FileNotFoundError):
        marker_path(settings).unlink()


def sweep(settings: Settings, console: Console) -> list[str]:
    """Tell (and where safe, remove) what killed runs left; the warnings given."""
    said: list[str] = []
    with contextlib.suppress(OSError):
        said += _killed_regenerate(settings, console)
    with contextlib.suppress(OSError):
        said += _aside_scratch(settings, console)
    return said


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _killed_regenerate(settings: Settings, console: Console) -> list[str]:
    path = marker_path(settings)
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        data = {}
    pid = data.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
        return []  # a regenerate is running now
    backup = Path(str(data.get("backup", "")))
    patch_dir = settings.patch_dir
    if backup.is_dir() and patch_dir.is_dir() and same_folder(backup, patch_dir):
        regenerate_ended(settings)  # put back by hand: nothing unverified is left
        return []
    shown, saved = settings.relative(patch_dir), settings.relative(backup)
    note = (
        f"a killed `invoke regenerate` left an UNVERIFIED queue in {shown} (it was stopped after writing the "
        f"new lanes, before checking them); the previous queue is in {saved}: run `invoke regenerate` again "
        f"(it verifies), or put the previous one back (`rm -r {shown} && cp -a {saved} {shown}`)"
    )
    console.warn(note)
    return [note]


def _aside_scratch(settings: Settings, console: Console) -> list[str]:
    import filelock

    from skippy.queue.guard import lock_path

    git_dir = wd.git_dir_of(settings.workdir)
    aside = wd.skippy_dir(git_dir) / "aside" if git_dir is not None else None
    if aside is None or not aside.is_dir() or not any(aside.iterdir()):
        return []
    lock = filelock.FileLock(str(lock_path(settings)))
    try:
        lock.acquire(timeout=0)
    except (filelock.Timeout, OSError):
        return []  # a run holds the workdir: its worktrees are its own
    try:
        size = sum(p.lstat().st_size for p in aside.rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(aside, ignore_errors=True)
        Repo(settings.workdir, settings.env).git("worktree", "prune", check=False)
    finally:
        lock.release()
    note = f"removed {size / 2**20:.0f} MiB of temporary worktrees a killed run left in {settings.relative(aside)}"
    console.warn(note)
    return [note]
