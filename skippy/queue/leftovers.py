"""What a killed run left, told and swept by the next command of any kind.

* A regenerate killed between writing the new lanes and verifying them leaves an
  unverified queue in the patch dir: its marker (:func:`regenerate_started`, removed
  when the run ends either way) names the backup of the previous queue.  While the
  patch dir differs from that backup, every command warns, naming both ways out;
  once it is back (restored by hand) or a regenerate ends, the marker goes.
* Temporary worktrees under ``<workdir>/.git/skippy/aside`` (a killed prepare, check or
  regenerate) are removed, with the space they held, when no run holds the workdir's
  lock (a live run's worktree is never touched), and so are git's entries of them
  (:func:`remove_aside_worktrees`): a ``git worktree add`` killed midway leaves its
  entry locked ("initializing"), which ``git worktree prune`` never prunes.  Only
  entries of folders directly under ``aside`` are removed: a worktree of the user's
  is never touched, locked or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Sequence
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
    if git_dir is None:
        return []
    aside = wd.skippy_dir(git_dir) / "aside"
    folders = aside.is_dir() and any(aside.iterdir())
    if not folders and not _entries_left(git_dir):
        return []
    lock = filelock.FileLock(str(lock_path(settings)))
    try:
        lock.acquire(timeout=0)
    except (filelock.Timeout, OSError):
        return []  # a run holds the workdir: its worktrees are its own
    try:
        size = sum(p.lstat().st_size for p in aside.rglob("*") if p.is_file() and not p.is_symlink())
        entries = remove_aside_worktrees(Repo(settings.workdir, settings.env), git_dir)
    finally:
        lock.release()
    if not folders and not entries:
        return []
    note = (
        f"removed {size / 2**20:.0f} MiB of temporary worktrees a killed run left in {settings.relative(aside)}"
        if folders
        else f"removed {entries} entr{'y' if entries == 1 else 'ies'} of temporary worktrees that killed runs "
        f"left in {settings.relative(git_dir / 'worktrees')}"
    )
    console.warn(note)
    return [note]


def _entries_left(git_dir: Path) -> bool:
    """Whether git holds an entry of a worktree under ``aside`` (read from git's ``gitdir`` files,
    without running git: the sweep runs before every command)."""
    homes = {str(wd.skippy_dir(git_dir).absolute() / "aside"), os.path.realpath(wd.skippy_dir(git_dir) / "aside")}
    for gitdir in (git_dir / "worktrees").glob("*/gitdir"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            home = Path(gitdir.read_text(encoding="utf-8").strip()).parent.parent
            if str(home) in homes or os.path.realpath(home) in homes:
                return True
    return False


def aside_entries(repo: Repo, aside: Path) -> list[Path]:
    """git's linked worktree entries of skippy's temporary worktrees: the folders directly under
    ``aside`` (locked or not, present or gone)."""
    result = repo.git("worktree", "list", "--porcelain", check=False)
    if not result.ok:
        return []
    homes = {str(aside.absolute()), os.path.realpath(aside)}
    found: list[Path] = []
    for line in result.stdout.splitlines():
        if line.startswith("worktree "):
            path = Path(line.removeprefix("worktree "))
            if str(path.parent) in homes or os.path.realpath(path.parent) in homes:
                found.append(path)
    return found


def remove_aside_worktrees(repo: Repo, git_dir: Path) -> int:
    """Remove skippy's temporary worktrees and git's entries of them; the number of entries removed.

    Called with the workdir's lock held, so no live run owns one (every run that makes them holds
    the lock, and a run's git children die with it); a worktree that a live process still works in
    (the checkout a killed ``git worktree add`` started may outlive it for a moment) is left for a
    later sweep.  Each entry goes with ``git worktree remove --force --force``, which also takes a
    locked one (a ``git worktree add`` killed midway leaves it locked "initializing"); the folders
    go first (a half-made one has no ``.git`` file for git to check).  Nothing else is pruned: a
    worktree of the user's is never touched."""
    aside = wd.skippy_dir(git_dir) / "aside"
    if not _entries_left(git_dir) and not (aside.is_dir() and any(aside.iterdir())):
        return 0  # nothing left: the folder a finished run leaves empty asks git nothing
    entries = aside_entries(repo, aside)
    folders = sorted(aside.iterdir()) if aside.is_dir() else []
    names = {p.name for p in [*folders, *entries]}
    busy = {p.name for p in in_use([*(aside / n for n in names), *(git_dir / "worktrees" / n for n in names)])}
    for folder in folders:
        if folder.name not in busy:
            shutil.rmtree(folder, ignore_errors=True)
    if not busy:
        with contextlib.suppress(OSError):
            aside.rmdir()
    removed = 0
    for path in entries:
        if path.name not in busy and repo.git("worktree", "remove", "--force", "--force", str(path), check=False).ok:
            removed += 1
    return removed


def in_use(paths: Sequence[Path], proc_root: Path = Path("/proc")) -> set[Path]:
    """Those of ``paths`` a live process works in: its current directory, or a file it holds open,
    is in one (Linux: read from /proc; where that cannot be read, none is known to be)."""
    if not paths or not proc_root.is_dir():
        return set()
    roots = {os.path.realpath(p): p for p in paths}
    found: set[Path] = set()
    for proc in proc_root.glob("[0-9]*"):
        links = [proc / "cwd"]
        with contextlib.suppress(OSError):
            links += list((proc / "fd").iterdir())
        for link in links:
            try:
                where = str(link.readlink())
            except OSError:
                continue  # gone, or not ours to read
            found.update(p for root, p in roots.items() if where == root or where.startswith(root + os.sep))
    return found
