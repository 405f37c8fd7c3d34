"""What wraps every run that writes in the workdir: the lock, and disk errors told plainly."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

from skippy.core.errors import CommandError, LockBusyError, WorkdirError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.disk import DiskProblem, disk_problem, file_system_of, oserror_problem


def lock_path(settings: Settings) -> Path:
    """The prepare lock of the workdir: in the project's cache dir (never beside the workdir,
    which may be anywhere), named by the workdir's name and a hash of its resolved path, so
    two workdirs get two locks and one workdir, however it is spelled, one."""
    resolved = settings.workdir.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return settings.cache_dir / "locks" / f"{resolved.name or 'root'}-{digest}.lock"


@contextlib.contextmanager
def locked(settings: Settings, console: Console) -> Iterator[None]:
    """Hold the workdir's lock (:func:`lock_path`, waiting up to ``lock_timeout``); a stale
    ``index.lock`` goes first."""
    import filelock  # imported here: the no-op fast path does not pay for it

    lock_file = lock_path(settings)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_file))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        console.info(f"waiting for another prepare of {settings.relative(settings.workdir)} (lock {lock_file})")
        try:
            lock.acquire(timeout=settings.lock_timeout)
        except filelock.Timeout:
            raise LockBusyError(
                f"another prepare has held {lock_file} for over {settings.lock_timeout:.0f} s",
                untouched="the workdir: this run did nothing",
                next_step="wait for the other run to finish (or stop it), then re-run `invoke prepare`",
            ) from None
    try:
        git_dir = wd.git_dir_of(settings.workdir) if settings.workdir.is_dir() else None
        stale = wd.remove_stale_index_lock(git_dir) if git_dir is not None else None
        if stale is not None:
            console.info(f"removed {settings.relative(stale)}: a killed git left it and no process holds it")
        yield
    finally:
        lock.release()


def disk_error(
    settings: Settings, problem: DiskProblem, *, untouched: str, rerun: str, doing: str | None = None
) -> WorkdirError:
    """The real cause of a refused write (no space, read-only, permission), where, and what next."""
    rel = settings.relative(settings.workdir)
    path = Path(problem.path) if problem.path else settings.workdir
    if not path.is_absolute():
        path = settings.workdir / path
    inside = path == settings.workdir or settings.workdir in path.parents
    fix = settings.workdir if inside else path.parent
    fs = file_system_of(path) if problem.full else None
    if fs is not None:
        # the file system that is full, named by its mount point (the workdir, the cache's scratch
        # folder or a path git names may each sit on another one; the path may be gone by now)
        next_step = (
            f"free space on the file system mounted at {fs.mount_point} (it holds {settings.relative(path)}; "
            f"`df -h {fs.mount_point}` shows it: {fs.describe()} now), then re-run `{rerun}`"
        )
    elif problem.full:
        next_step = (
            f"free space on the file system that holds {settings.relative(fix)} "
            f"(`df -h {settings.relative(fix)}` shows it), then re-run `{rerun}`"
        )
    else:
        next_step = (
            f"make {settings.relative(fix)} writable for this user (or set LLAMA_WORKDIR to a writable "
            f"directory), then re-run `{rerun}`"
        )
    what = (
        f"cannot write {settings.relative(path)}: {problem.cause}"
        if problem.path
        else f"{problem.cause} while writing in {rel}"
    )
    return WorkdirError(
        what + (f" ({doing})" if doing else ""),
        details=problem.line,
        untouched=untouched,
        next_step=next_step,
    )


@contextlib.contextmanager
def disk_errors(settings: Settings, *, rerun: str, untouched: str) -> Iterator[None]:
    """Turn a write the file system refused (a Python OSError, or git saying so) into a WorkdirError
    naming the cause and the path, instead of a traceback or a misleading command failure."""
    try:
        yield
    except OSError as exc:
        raise disk_error(settings, oserror_problem(exc), untouched=untouched, rerun=rerun) from exc
    except CommandError as exc:
        problem = disk_problem(exc.output_tail)
        if problem is None:
            raise
        doing = exc.what.split(" failed", 1)[0].split(" timed out", 1)[0]
        raise disk_error(settings, problem, untouched=untouched, rerun=rerun, doing=doing) from exc


@contextlib.contextmanager
def guarded(settings: Settings, console: Console, *, rerun: str, untouched: str) -> Iterator[None]:
    """The workdir's lock, with a read-only or full disk named as such (``rerun`` and
    ``untouched`` go into that error): how every step that writes the workdir runs."""
    with disk_errors(settings, rerun=rerun, untouched=untouched), locked(settings, console):
        yield
