"""``invoke prepare``: upstream checkout + the queue applied with ``git am --3way``.

Converge, then re-check: compute what must change (clone? fetch? re-apply?)
and act only on that difference.  The same pin and queue give the same
patched commit SHA on any machine.  A maintainer's work in the workdir is
never lost: it is refused, or (with ``force``) saved under a backup ref first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from skippy.core.errors import (
    CommandError,
    ConflictError,
    DirtyWorkdirError,
    LockBusyError,
    NetworkError,
    SettingsError,
    SkippyError,
    WorkdirError,
)
from skippy.core.git import AM_ARGS, AM_ENV, FALLBACK_DATE, Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.model import LANES, Lane, Patch, Queue, load_queue

if TYPE_CHECKING:
    from skippy.queue.triage import TriageReport

_SHA40 = re.compile(r"^[0-9a-f]{40}$")
_SHA_PREFIX = re.compile(r"^[0-9a-fA-F]{7,40}$")
PARTIAL_PREFIX = ".skippy-partial-"
#: a workdir being replaced by a re-clone (put back if the re-clone does not finish)
OLD_PREFIX = ".skippy-replaced-"
#: the workdir when neither [tool.skippy] workdir nor LLAMA_WORKDIR says otherwise
DEFAULT_WORKDIR = ".deps/llama.cpp"

Mode = Literal["pinned", "latest", "sha"]


@dataclass(frozen=True)
class Target:
    mode: Mode
    sha: str | None = None

    @classmethod
    def pinned(cls) -> Target:
        return cls("pinned")

    @classmethod
    def latest(cls) -> Target:
        return cls("latest")

    @classmethod
    def at(cls, sha: str) -> Target:
        return cls("sha", sha)

    def describe(self) -> str:
        return {"pinned": "the pinned commit", "latest": "upstream master"}.get(self.mode, f"commit {self.sha}")


@dataclass(frozen=True)
class PrepareReport:
    action: str  # "noop" | "cloned" | "applied" | "switched"
    upstream_sha: str
    patched_sha: str
    queue_digest: str
    workdir: Path
    source: str
    seconds: float
    changed_files: int | None = None
    backup_ref: str | None = None
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "upstream_sha": self.upstream_sha,
            "patched_sha": self.patched_sha,
            "queue_digest": self.queue_digest,
            "workdir": str(self.workdir),
            "source": self.source,
            "seconds": round(self.seconds, 3),
            "changed_files": self.changed_files,
            "backup_ref": self.backup_ref,
            "notes": list(self.notes),
        }


def read_pin(settings: Settings) -> str:
    path = settings.pin_file
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(
            f"pin file {settings.relative(path)} does not exist",
            untouched="everything",
            next_step=f"write the upstream commit (40 hex) to {settings.relative(path)}, "
            "or run `invoke prepare --latest`",
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) != 1 or not _SHA40.match(lines[0].lower()):
        shown = lines[0] if lines else "(empty)"
        raise SettingsError(
            f"pin file {settings.relative(path)} must hold one full 40-hex commit SHA, found {shown!r}",
            untouched="everything",
            next_step=f"put the full upstream SHA in {settings.relative(path)} (`git rev-parse <ref>` prints it)",
        )
    return lines[0].lower()


# --------------------------------------------------------------------------- fast path


def fast_noop(settings: Settings, queue: Queue, pin: str) -> wd.Stamp | None:
    """The recorded stamp when a pinned prepare has nothing to do, read-only and lock-free."""
    git_dir = wd.git_dir_of(settings.workdir)
    if git_dir is None:
        return None
    stamp = wd.read_stamp(git_dir)
    if stamp is None or stamp.upstream_sha != pin or stamp.queue_digest != queue.digest:
        return None
    if (wd.skippy_dir(git_dir) / wd.JOURNAL_NAME).exists():
        return None
    if wd.in_progress(git_dir) is not None:
        return None
    head_file = git_dir / "HEAD"
    try:
        head = head_file.read_text(encoding="ascii").strip()
    except OSError:
        return None
    if head != stamp.patched_sha:
        return None
    repo = Repo(settings.workdir, settings.env)
    for xy, path in wd.status_entries(repo):
        if xy != "??" or not wd.is_tolerated(path, settings.tolerated_untracked):
            return None
    return stamp


# --------------------------------------------------------------------------- prepare


def prepare(
    settings: Settings,
    target: Target,
    *,
    console: Console,
    force: bool = False,
    offline: bool = False,
    interactive: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> PrepareReport:
    """Bring the workdir to ``target`` + the queue; see the module docstring.

    On a conflict every patch is triaged; ``interactive`` (default: not on CI)
    then leaves the failed ``git am`` stopped in the workdir for
    :func:`resume` (``invoke prepare --continue | --skip | --abort``).
    """
    started = time.monotonic()
    queue = load_queue(settings.patch_dir)
    pin = read_pin(settings) if target.mode == "pinned" else None
    if target.mode == "sha":
        _check_sha_arg(target.sha)
    if pin is not None:
        stamp = fast_noop(settings, queue, pin)
        if stamp is not None:
            notes = ensure_compat_link(settings, console)
            return PrepareReport(
                "noop",
                stamp.upstream_sha,
                stamp.patched_sha,
                stamp.queue_digest,
                settings.workdir,
                stamp.source,
                time.monotonic() - started,
                changed_files=0,
                notes=notes,
            )
    rel = settings.relative(settings.workdir)
    with (
        disk_errors(
            settings,
            rerun=rerun_command(target, force=force, offline=offline),
            untouched=f"{rel}: your files are as they were (a switch cut short is journaled and the next run "
            "finishes it); no stamp was written",
        ),
        _locked(settings, console),
    ):
        preparer = _Preparer(
            settings,
            queue,
            console,
            force=force,
            offline=offline,
            interactive=(not settings.on_ci) if interactive is None else interactive,
            sleep=sleep,
        )
        report = preparer.run(target, pin)
    notes = ensure_compat_link(settings, console)
    return PrepareReport(
        report.action,
        report.upstream_sha,
        report.patched_sha,
        report.queue_digest,
        report.workdir,
        report.source,
        time.monotonic() - started,
        changed_files=report.changed_files,
        backup_ref=report.backup_ref,
        notes=report.notes + notes,
    )


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
    pin = read_pin(settings) if target.mode == "pinned" else None
    if target.mode == "sha":
        _check_sha_arg(target.sha)
    with (
        disk_errors(
            settings,
            rerun=rerun_command(target, offline=offline, triage=True),
            untouched=f"{settings.relative(settings.workdir)}: its checkout and your files "
            "(triage works in a temporary worktree)",
        ),
        _locked(settings, console),
    ):
        preparer = _Preparer(settings, queue, console, force=False, offline=offline, sleep=sleep)
        return preparer.triage_only(target, pin)


def apply_queue_aside(settings: Settings, repo: Repo, base: str, queue: Queue, *, console: Console) -> str:
    """The patched commit of ``queue`` on ``base`` (a commit in ``repo``), built in a temporary
    worktree that shares ``repo``'s object store.  Deterministic; raises ConflictError; ``repo``'s
    own checkout is not touched."""
    git_dir = Path(repo.out("rev-parse", "--absolute-git-dir"))
    preparer = _Preparer(settings, queue, console, force=False, offline=True, sleep=time.sleep)
    return preparer._apply_aside(repo, git_dir, base)


def resolve_target(
    settings: Settings, repo: Repo, target: Target, *, console: Console, offline: bool = False
) -> tuple[str, str, str]:
    """``(upstream SHA, local base commit, source)`` of ``target`` in ``repo`` (fetching, or
    importing the source archive, as prepare would)."""
    pin = read_pin(settings) if target.mode == "pinned" else None
    queue = Queue(root=settings.patch_dir, patches=(), digest="")
    preparer = _Preparer(settings, queue, console, force=False, offline=offline, sleep=time.sleep)
    return preparer._resolve(repo, target, pin)


def rerun_command(target: Target, *, force: bool = False, offline: bool = False, triage: bool = False) -> str:
    """The command line that runs ``target`` again (for error messages)."""
    words = ["invoke", "triage" if triage else "prepare"]
    if target.mode == "latest":
        words.append("--latest")
    elif target.mode == "sha":
        words += ["--sha", target.sha or ""]
    if offline:
        words.append("--offline")
    if force:
        words.append("--force")
    return " ".join(words)


def disk_error(
    settings: Settings, problem: wd.DiskProblem, *, untouched: str, rerun: str, doing: str | None = None
) -> WorkdirError:
    """The real cause of a refused write (no space, read-only, permission), where, and what next."""
    rel = settings.relative(settings.workdir)
    path = Path(problem.path) if problem.path else settings.workdir
    if not path.is_absolute():
        path = settings.workdir / path
    inside = path == settings.workdir or settings.workdir in path.parents
    fix = settings.workdir if inside else path.parent
    if problem.full:
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
        raise disk_error(settings, wd.oserror_problem(exc), untouched=untouched, rerun=rerun) from exc
    except CommandError as exc:
        problem = wd.disk_problem(exc.output_tail)
        if problem is None:
            raise
        doing = exc.what.split(" failed", 1)[0].split(" timed out", 1)[0]
        raise disk_error(settings, problem, untouched=untouched, rerun=rerun, doing=doing) from exc


def expand_known_sha(settings: Settings, sha: str) -> str:
    """An abbreviated ``--sha`` that starts exactly one configured archive's commit or the pin, in full.

    Offline there is no upstream to ask git about an abbreviation, but the project names full
    SHAs itself (``[tool.skippy.archives]`` and the pin file): ``4df29be4f4c3`` is the pin.
    An abbreviation matching several is refused, naming them; one matching none is left as given.
    """
    if len(sha) >= 40:
        return sha
    known = {str(k).lower() for k in (settings.raw.get("archives") or {})}
    with contextlib.suppress(SkippyError, OSError):
        known.add(read_pin(settings))
    matches = sorted(k for k in known if len(k) == 40 and k.startswith(sha))
    if len(matches) > 1:
        raise SettingsError(
            f"--sha {sha} is ambiguous: it starts {', '.join(matches)}",
            untouched="everything: nothing was fetched or changed",
            next_step=f"invoke prepare --sha {matches[0]} (give more digits)",
        )
    return matches[0] if matches else sha


def _check_sha_arg(sha: str | None) -> None:
    if not sha or not _SHA_PREFIX.match(sha):
        raise SettingsError(
            f"--sha {sha!r} is not a commit SHA (7 to 40 hex digits)",
            untouched="everything",
            next_step="pass a commit SHA, e.g. `invoke prepare --sha 4df29be4f4c3`",
        )


@contextlib.contextmanager
def _locked(settings: Settings, console: Console) -> Iterator[None]:
    import filelock  # imported here: the no-op fast path does not pay for it

    settings.workdir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = settings.workdir.parent / (settings.workdir.name + ".lock")
    lock = filelock.FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        console.info(f"waiting for another prepare of {settings.relative(settings.workdir)} (lock {lock_path.name})")
        try:
            lock.acquire(timeout=settings.lock_timeout)
        except filelock.Timeout:
            raise LockBusyError(
                f"another prepare has held {lock_path} for over {settings.lock_timeout:.0f} s",
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


class _Preparer:
    def __init__(
        self,
        settings: Settings,
        queue: Queue,
        console: Console,
        *,
        force: bool,
        offline: bool,
        sleep: Callable[[float], None],
        interactive: bool = False,
    ) -> None:
        self.interactive = interactive
        self.settings = settings
        self.queue = queue
        self.console = console
        self.force = force
        self.offline = offline
        self.sleep = sleep
        self.workdir = settings.workdir
        self.backup_ref: str | None = None
        self.notes: list[str] = []
        #: what this run finished of an interrupted one (said when it then refuses local work)
        self.recovered: str | None = None

    # ---- helpers
    def repo(self, path: Path | None = None) -> Repo:
        return Repo(path or self.workdir, self.settings.env, echo=self.console.command)

    def rel(self, path: Path) -> str:
        return self.settings.relative(path)

    # ---- the run
    def run(self, target: Target, pin: str | None) -> PrepareReport:
        self._remove_partials()
        if not self.workdir.exists() and not self.workdir.is_symlink():
            return self._cold(target, pin)
        repo = self.repo()
        git_dir = self._check_is_our_repo(repo)
        self._recover(repo, git_dir)
        stamp = wd.read_stamp(git_dir)
        recognized = self._recognize(repo, git_dir) if stamp is None else None
        work = wd.local_work(repo, git_dir, stamp or recognized, self.settings.tolerated_untracked)
        if not work.empty:
            self._handle_local_work(repo, git_dir, work)
        if self._is_shallow_or_partial(repo):
            return self._reclone(target, pin)
        upstream_sha, base, source = self._resolve(repo, target, pin)
        stamp = wd.read_stamp(git_dir) or recognized
        head = repo.head()
        if (
            stamp is not None
            and stamp.upstream_sha == upstream_sha
            and stamp.queue_digest == self.queue.digest
            and head == stamp.patched_sha
        ):
            if stamp is recognized:
                wd.write_stamp(git_dir, stamp)
            return self._report("noop", stamp, changed=0)
        try:
            patched = self._apply_aside(repo, git_dir, base)
        except ConflictError as exc:
            self._on_conflict(
                repo, git_dir, exc, base=base, upstream_sha=upstream_sha, source=source, head=head, since=stamp
            )
            raise
        changed = self._switch(repo, git_dir, head, patched, upstream_sha, base=base, source=source)
        new = self._stamp(git_dir, upstream_sha, patched, base, source)
        return self._report("applied", new, changed=changed)

    def _stamp(self, git_dir: Path, upstream_sha: str, patched: str, base: str, source: str) -> wd.Stamp:
        """Record what was prepared: written last, atomically."""
        stamp = wd.Stamp(
            upstream_sha=upstream_sha,
            patched_sha=patched,
            queue_digest=self.queue.digest,
            base_commit=base,
            source=source,
        )
        wd.write_stamp(git_dir, stamp)
        return stamp

    def triage_only(self, target: Target, pin: str | None) -> TriageReport:
        from skippy.queue.triage import triage

        self._remove_partials()
        if not self.workdir.exists() and not self.workdir.is_symlink():
            # a plain upstream checkout (no stamp) to triage in; the next prepare applies on it
            partial = self._partial_dir()
            try:
                self._clone_or_init(partial)
                repo = self.repo(partial)
                _up, first_base, _src = self._resolve(repo, target, pin)
                repo.git("checkout", "--force", "--detach", "--quiet", first_base)
                partial.rename(self.workdir)
            finally:
                if partial.exists():
                    shutil.rmtree(partial, ignore_errors=True)
        repo = self.repo()
        git_dir = self._check_is_our_repo(repo)
        self._remove_aside_worktrees(repo, git_dir)
        _upstream_sha, base, _source = self._resolve(repo, target, pin)
        stamp = wd.read_stamp(git_dir)
        since = stamp.base_commit if stamp else None
        if since is None:
            with contextlib.suppress(SkippyError):
                since = self._resolve(repo, Target.pinned(), read_pin(self.settings))[1]
        with self.console.step(f"triage: {len(self.queue.patches)} patches against {base[:12]}"):
            return triage(repo, git_dir, self.queue, base, since)

    def _cold(self, target: Target, pin: str | None) -> PrepareReport:
        """Clone, check out and apply in a partial dir; renaming it into place is the commit point.

        An interrupted cold prepare leaves only a partial dir, which the next run removes.
        """
        self.workdir.parent.mkdir(parents=True, exist_ok=True)
        partial = self._partial_dir()
        try:
            self._clone_or_init(partial)
            repo = self.repo(partial)
            git_dir = partial / ".git"
            upstream_sha, base, source = self._resolve(repo, target, pin)
            with self.console.step(f"check out {upstream_sha[:12]}"):
                repo.git("checkout", "--force", "--detach", "--quiet", base)
            try:
                patched = self._apply_lanes(repo, git_dir, self.rel(self.workdir))
            except ConflictError as exc:
                # leave a clean upstream checkout (no stamp) for the maintainer to work in
                repo.git("checkout", "--force", "--detach", "--quiet", base, check=False)
                partial.rename(self.workdir)
                repo = self.repo()
                self._on_conflict(
                    repo,
                    self.workdir / ".git",
                    exc,
                    base=base,
                    upstream_sha=upstream_sha,
                    source=source,
                    head=None,
                    since=None,
                )
                raise
            new = self._stamp(git_dir, upstream_sha, patched, base, source)
            partial.rename(self.workdir)
        finally:
            if partial.exists():
                shutil.rmtree(partial, ignore_errors=True)
        return self._report("cloned", new, changed=None)

    def _report(self, action: str, stamp: wd.Stamp, changed: int | None) -> PrepareReport:
        return PrepareReport(
            action,
            stamp.upstream_sha,
            stamp.patched_sha,
            stamp.queue_digest,
            self.workdir,
            stamp.source,
            0.0,
            changed_files=changed,
            backup_ref=self.backup_ref,
            notes=tuple(self.notes),
        )

    # ---- workdir shape
    def _remove_partials(self) -> None:
        parent = self.workdir.parent
        if not parent.is_dir():
            return
        if not self.workdir.exists() and not self.workdir.is_symlink():
            for interrupted in sorted(parent.glob(f"{OLD_PREFIX}{self.workdir.name}-*"))[:1]:
                # a re-clone was killed: the checkout it replaced comes back (then is re-cloned again)
                self.console.info(f"putting back the checkout an interrupted re-clone moved: {self.rel(interrupted)}")
                interrupted.rename(self.workdir)
        for leftover in parent.glob(f"{PARTIAL_PREFIX}{self.workdir.name}-*"):
            self.console.info(f"removing an interrupted clone: {self.rel(leftover)}")
            shutil.rmtree(leftover, ignore_errors=True)

    def _partial_dir(self) -> Path:
        return self.workdir.parent / f"{PARTIAL_PREFIX}{self.workdir.name}-{uuid.uuid4().hex[:8]}"

    def _check_is_our_repo(self, repo: Repo) -> Path:
        if not self.workdir.is_dir():
            raise WorkdirError(
                f"workdir {self.rel(self.workdir)} exists but is not a directory",
                untouched=f"{self.rel(self.workdir)}",
                next_step="move it away, or set LLAMA_WORKDIR to another path",
            )
        top = repo.toplevel()
        if top is None or top.resolve() != self.workdir.resolve():
            raise WorkdirError(
                f"workdir {self.rel(self.workdir)} exists but is not a git checkout of its own",
                untouched=f"{self.rel(self.workdir)} and everything in it",
                next_step=f"move {self.rel(self.workdir)} away (or set LLAMA_WORKDIR elsewhere), "
                "then re-run `invoke prepare`",
            )
        git_dir = wd.git_dir_of(self.workdir)
        if git_dir is None:
            raise WorkdirError(
                f"workdir {self.rel(self.workdir)} is a linked worktree or submodule (its .git is a file)",
                untouched=f"{self.rel(self.workdir)}",
                next_step="point LLAMA_WORKDIR at a plain clone, or let skippy clone one",
            )
        return git_dir

    def _clone_or_init(self, partial: Path) -> None:
        """Clone upstream (full history, no checkout) into ``partial``, or init it for an archive."""
        url = self.settings.upstream_url
        if self.offline:
            self._init_empty(partial)
            return
        try:
            self._retry(
                lambda: self.repo(partial.parent).network(
                    "clone", "--no-checkout", "--origin", "origin", "--", url, partial.name, what="git clone"
                ),
                f"clone {url}",
                cleanup=lambda: shutil.rmtree(partial, ignore_errors=True),
            )
        except NetworkError as exc:
            if not self._has_archive_fallback():
                raise
            self.console.warn(f"{exc.what}; falling back to the source archive")
            self.notes.append("upstream unreachable: used the source archive")
            shutil.rmtree(partial, ignore_errors=True)
            self._init_empty(partial)
            self.offline = True

    def _init_empty(self, path: Path) -> None:
        path.mkdir(parents=True)
        repo = self.repo(path)
        repo.git("init", "--quiet")
        repo.git("remote", "add", "origin", self.settings.upstream_url)

    def _is_shallow_or_partial(self, repo: Repo) -> bool:
        shallow = repo.out("rev-parse", "--is-shallow-repository") == "true"
        promisor = repo.git("config", "--get", "remote.origin.promisor", check=False).stdout.strip() == "true"
        partial = bool(repo.git("config", "--get", "extensions.partialClone", check=False).stdout.strip())
        return shallow or promisor or partial

    def _reclone(self, target: Target, pin: str | None) -> PrepareReport:
        self.console.info(
            f"{self.rel(self.workdir)} is a shallow or partial clone, which cannot serve `git am --3way`: re-cloning"
        )
        # not a partial name: a hard kill leaves it for the next run to put back, never to delete
        old = self.workdir.parent / f"{OLD_PREFIX}{self.workdir.name}-{uuid.uuid4().hex[:8]}"
        self.workdir.rename(old)
        try:
            report = self._cold(target, pin)
        except BaseException:
            if not self.workdir.exists():
                old.rename(self.workdir)
            raise
        if self.repo(old).git("for-each-ref", "--count=1", wd.BACKUP_PREFIX).stdout.strip():
            # backups (a --force on the shallow clone made one just now) move into the new clone
            carried = self.repo().git(
                "fetch", "--no-tags", "--quiet", str(old), f"+{wd.BACKUP_PREFIX}*:{wd.BACKUP_PREFIX}*", check=False
            )
            saved_state = wd.skippy_dir(old / ".git") / "backups"
            if carried.ok and saved_state.is_dir():
                shutil.copytree(saved_state, wd.skippy_dir(self.workdir / ".git") / "backups", dirs_exist_ok=True)
            if not carried.ok:
                kept = self.workdir.parent / f"{self.workdir.name}.before-reclone-{old.name.rsplit('-', 1)[1]}"
                old.rename(kept)
                note = f"could not carry the backup refs of the shallow clone over: it is kept as {self.rel(kept)}"
                self.console.warn(note)
                return dataclasses.replace(report, notes=(*report.notes, note))
        shutil.rmtree(old, ignore_errors=True)
        return report

    # ---- local work and recovery
    def _recover(self, repo: Repo, git_dir: Path) -> None:
        """Finish or undo what an interrupted skippy run left behind (recognized by its journal)."""
        self._remove_aside_worktrees(repo, git_dir)
        entry = wd.read_journal(git_dir)
        if entry is None:
            return
        if entry.op == "session":
            if not self.force:
                raise ConflictError(
                    f"a conflict session is in progress in {self.rel(self.workdir)} (stopped at {entry.stopped_patch})",
                    untouched=f"{self.rel(self.workdir)}: the session is as you left it",
                    next_step=session_commands(self.rel(self.workdir)),
                )
            work = wd.local_work(repo, git_dir, None, self.settings.tolerated_untracked)
            self.backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --force (conflict session)")
            self.notes.append(f"conflict session state saved under {self.backup_ref}")
            wd.abort_in_progress(repo, git_dir)
            wd.discard_local_changes(repo, self.settings.tolerated_untracked)
            if entry.from_commit and repo.has_commit(entry.from_commit):
                repo.git("checkout", "--force", "--detach", "--quiet", entry.from_commit)
            wd.drop_journal(git_dir)
            return
        if entry.op == "switch" and entry.to_commit and repo.has_commit(entry.to_commit):
            self._finish_switch(repo, git_dir, entry)
            return
        self.console.info(f"recovering from an interrupted prepare ({entry.op})")
        wd.clear_stamp(git_dir)
        progress = wd.in_progress(git_dir)
        if entry.op == "apply":
            # our own am: save whatever is there (nothing is lost), then undo it
            work = wd.local_work(repo, git_dir, None, self.settings.tolerated_untracked)
            if work.modified or work.untracked:
                self.backup_ref = wd.save_backup(repo, git_dir, work, "recovering an interrupted prepare")
                self.notes.append(f"state of the interrupted run saved under {self.backup_ref}")
            if progress is not None and progress[0].startswith("rebase-apply"):
                repo.git("am", "--abort", check=False)
                if wd.in_progress(git_dir) is not None:
                    repo.git("am", "--quit", check=False)
            if entry.from_commit and repo.has_commit(entry.from_commit):
                repo.git("checkout", "--force", "--detach", entry.from_commit)
        wd.drop_journal(git_dir)

    def _finish_switch(self, repo: Repo, git_dir: Path, entry: wd.Journal) -> None:
        """Finish a switch that was interrupted, overwriting only files skippy itself wrote.

        Every file the interrupted checkout reached holds the new commit's content, every other
        the old one's; anything else is the maintainer's (an edit made since): refused, or with
        ``force`` saved under a backup ref first, like any other local work.
        """
        to = entry.to_commit
        assert to is not None
        old = entry.from_commit
        rel = self.rel(self.workdir)
        head = repo.head()
        foreign = wd.foreign_changes(repo, old if old and repo.has_commit(old) else None, to)
        findings = [f"{p}: neither the old nor the new version (an edit made since?)" for p in foreign]
        if head not in (old, to):
            findings.append(f"HEAD moved to {head[:12] if head else '(none)'} since the switch was interrupted")
        moving = f"from {old[:12] if old else '(nothing)'} to {to[:12]}"
        if findings:
            if not self.force:
                raise DirtyWorkdirError(
                    f"a prepare was interrupted while moving {rel} {moving}, and {rel} now holds "
                    "changes that prepare did not make",
                    details="\n".join(f"- {f}" for f in findings),
                    untouched=f"{rel}: nothing was changed (the half-done switch and your changes are as they were)",
                    next_step="`invoke prepare --force` saves everything under a backup ref first, then finishes "
                    f"the switch; bring your files back with `git -C {rel} checkout <backup ref> -- <paths>` "
                    "(the ref is printed)",
                )
            work = wd.local_work(repo, git_dir, None, self.settings.tolerated_untracked)
            work = dataclasses.replace(work, head_problem="; ".join(findings))
            self.backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --force", also=tuple(foreign))
            self.console.warn(
                f"local work saved under {self.backup_ref} before --force discards it; "
                f"restore with: git -C {rel} checkout {self.backup_ref} -- ."
            )
            self.notes.append(f"local work saved under {self.backup_ref}")
        self.console.info(f"finishing an interrupted prepare: moving {rel} {moving}")
        repo.git("checkout", "--force", "--detach", "--quiet", to)
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
        self.recovered = f"finished the interrupted move {moving}"
        self.notes.append(self.recovered)

    def _recognize(self, repo: Repo, git_dir: Path) -> wd.Stamp | None:
        """With no (readable) stamp: is HEAD this queue applied on HEAD's upstream base?

        The same base and queue always give the same patched SHA, so replaying the queue in a
        temporary worktree and comparing SHAs tells a run's own patched commit from local work.
        """
        head = repo.head()
        if head is None or not self.queue.patches:
            return None
        on_top = repo.git(
            "rev-list", "--reverse", head, "--not", "--remotes", "--tags", "--glob=refs/skippy/archive/*", check=False
        ).stdout.split()
        if len(on_top) != len(self.queue.patches):
            return None
        base = repo.rev_parse(f"{on_top[0]}^")
        if base is None:
            return None
        with self.console.step(f"no stamp: replaying the queue on {base[:12]} to recognize HEAD {head[:12]}"):
            try:
                replayed = self._apply_aside(repo, git_dir, base)
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
        self.notes.append(f"no stamp: recognized HEAD {head[:12]} as this queue on {upstream_sha[:12]}")
        return wd.Stamp(
            upstream_sha=upstream_sha,
            patched_sha=head,
            queue_digest=self.queue.digest,
            base_commit=base,
            source=source,
        )

    def _remove_aside_worktrees(self, repo: Repo, git_dir: Path) -> None:
        aside_root = wd.skippy_dir(git_dir) / "aside"
        if aside_root.exists():
            shutil.rmtree(aside_root, ignore_errors=True)
            repo.git("worktree", "prune")

    def _handle_local_work(self, repo: Repo, git_dir: Path, work: wd.LocalWork) -> None:
        findings = "\n".join(f"- {f}" for f in work.findings())
        if not self.force:
            raise DirtyWorkdirError(
                f"{self.rel(self.workdir)} holds work that `prepare` would lose",
                details=findings,
                untouched=f"{self.rel(self.workdir)}: nothing was changed"
                if self.recovered is None
                else f"{self.rel(self.workdir)}: your work was not changed (this run only {self.recovered})",
                next_step="keep it: commit it on a branch on top of the patched commit and carry it into "
                "the queue (`invoke regenerate`, or `git format-patch` into the patch dir); "
                "discard it: `invoke prepare --force` (saves everything under a backup ref first)",
            )
        self.backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --force")
        self.console.warn(
            f"local work saved under {self.backup_ref} before --force discards it; "
            f"restore with: git -C {self.rel(self.workdir)} checkout {self.backup_ref} -- ."
        )
        self.notes.append(f"local work saved under {self.backup_ref}")
        if work.in_progress is not None:
            wd.abort_in_progress(repo, git_dir)
        wd.discard_local_changes(repo, self.settings.tolerated_untracked)
        wd.clear_stamp(git_dir)

    # ---- resolving the target
    def _has_archive_fallback(self) -> bool:
        return bool(self.settings.raw.get("archives"))

    def _retry(self, action: Callable[[], object], what: str, cleanup: Callable[[], None] | None = None) -> None:
        attempts = self.settings.network_attempts
        last: CommandError | None = None
        for attempt in range(1, attempts + 1):
            try:
                action()
                return
            except CommandError as exc:
                last = exc
                if cleanup is not None:
                    cleanup()
                if wd.disk_problem(exc.output_tail) is not None:
                    raise  # no space, read-only, permission: retrying or an archive cannot help
                if attempt < attempts:
                    delay = self.settings.network_backoff * (2 ** (attempt - 1))
                    self.console.warn(f"{what} failed (attempt {attempt}/{attempts}); retrying in {delay:.0f} s")
                    self.sleep(delay)
        assert last is not None
        raise NetworkError(
            f"could not {what} after {attempts} attempt(s)",
            details=last.details,
            untouched=f"{self.rel(self.workdir)}: nothing was changed",
            next_step="check the network and LLAMA_UPSTREAM_URL / [tool.skippy] upstream_url, then re-run; "
            "for the pinned commit, `invoke prepare --offline` uses the configured source archive",
        )

    def _fetch(self, repo: Repo) -> None:
        url = self.settings.upstream_url
        current = repo.git("remote", "get-url", "origin", check=False)
        if not current.ok:
            repo.git("remote", "add", "origin", url)
        elif current.stdout.strip() != url:
            repo.git("remote", "set-url", "origin", url)
        branch = self.settings.upstream_branch
        self._retry(
            lambda: repo.network(
                "fetch",
                "--tags",
                "--quiet",
                "origin",
                f"+refs/heads/{branch}:refs/remotes/origin/{branch}",
                what="git fetch",
            ),
            f"fetch {branch} from {url}",
        )

    def _resolve(self, repo: Repo, target: Target, pin: str | None) -> tuple[str, str, str]:
        """(upstream SHA, local base commit, source) for the target."""
        if target.mode == "latest":
            if self.offline:
                raise SettingsError(
                    "--latest needs the upstream: it cannot run --offline",
                    untouched="everything",
                    next_step="drop --offline, or use `invoke prepare --pinned --offline`",
                )
            self._fetch(repo)
            ref = f"refs/remotes/origin/{self.settings.upstream_branch}"
            sha = repo.rev_parse(ref + "^{commit}")
            if sha is None:
                raise NetworkError(
                    f"upstream has no branch {self.settings.upstream_branch}",
                    untouched=f"{self.rel(self.workdir)}",
                    next_step="check [tool.skippy] upstream_branch",
                )
            return sha, sha, "git"
        wanted = pin if target.mode == "pinned" else expand_known_sha(self.settings, (target.sha or "").lower())
        assert wanted
        local = self._lookup(repo, wanted)
        if local is not None:
            return local
        fetch_error: NetworkError | None = None
        if not self.offline:
            try:
                self._fetch(repo)
            except NetworkError as exc:
                fetch_error = exc
            else:
                local = self._lookup(repo, wanted)
                if local is None and len(wanted) == 40:
                    try:
                        repo.network("fetch", "--quiet", "origin", wanted, what="git fetch")
                    except CommandError as exc:
                        if wd.disk_problem(exc.output_tail) is not None:
                            raise
                    local = self._lookup(repo, wanted)
                if local is not None:
                    return local
        # after a failed fetch, only an archive mapped for this very commit can stand in (an unmapped
        # one would bury the fetch's own error under "no archive mapped")
        mapped = wanted in (self.settings.raw.get("archives") or {})
        if (
            len(wanted) == 40
            and (self.offline or (fetch_error is not None and mapped))
            and self._has_archive_fallback()
        ):
            from skippy.queue import archives  # only archive users pay for the import

            if fetch_error is not None:
                self.console.warn(f"{fetch_error.what}; falling back to the source archive for {wanted[:12]}")
            base = archives.import_archive(self.settings, repo, wanted, self.console)
            return wanted, base, "archive"
        if fetch_error is not None:
            raise fetch_error
        raise SettingsError(
            f"commit {wanted} is not in the upstream {self.settings.upstream_url}"
            + (" (offline: no archive is configured for it)" if self.offline else ""),
            untouched=f"{self.rel(self.workdir)}: nothing was changed",
            next_step="check the SHA (and the pin file), or map it to a source archive in "
            "[tool.skippy.archives] to prepare it offline",
        )

    def _lookup(self, repo: Repo, wanted: str) -> tuple[str, str, str] | None:
        if len(wanted) == 40:
            if repo.has_commit(wanted):
                return wanted, wanted, "git"
            archived = repo.rev_parse(f"refs/skippy/archive/{wanted}^{{commit}}")
            if archived is not None:
                specs = self.settings.raw.get("archives") or {}
                if wanted in specs:
                    # re-checks the recorded digest against the mapping (re-imports if it changed)
                    from skippy.queue import archives

                    return wanted, archives.import_archive(self.settings, repo, wanted, self.console), "archive"
                return wanted, archived, "archive"
            return None
        full = repo.rev_parse(f"{wanted}^{{commit}}")
        return (full, full, "git") if full is not None else None

    # ---- conflicts: triage, then (interactive) a resumable session in the workdir
    def _on_conflict(
        self,
        repo: Repo,
        git_dir: Path,
        exc: ConflictError,
        *,
        base: str,
        upstream_sha: str,
        source: str,
        head: str | None,
        since: wd.Stamp | None,
    ) -> None:
        from skippy.queue.triage import triage

        with self.console.step("triage: trying every patch against the target"):
            report = triage(repo, git_dir, self.queue, base, since.base_commit if since else None)
        exc.triage = report
        exc.details = report.render() + ("\n\n" + exc.details if exc.details else "")
        if not self.interactive:
            return
        repo.git("checkout", "--force", "--detach", "--quiet", base)
        entry = wd.Journal(
            "session",
            from_commit=head,
            to_commit=None,
            upstream_sha=upstream_sha,
            base=base,
            queue_digest=self.queue.digest,
            source=source,
        )
        stopped = run_session(repo, git_dir, self.queue, entry, start=0, console=self.console)
        assert stopped is not None, "the queue failed aside but applied in the workdir"
        exc.what = f"{stopped.stopped_patch} does not apply: the conflict is waiting in {self.rel(self.workdir)}"
        exc.untouched = (
            "your previous patched checkout is recorded: `invoke prepare --abort` returns to it"
            if head
            else "nothing of yours was in the workdir"
        )
        exc.next_step = session_commands(self.rel(self.workdir))

    # ---- applying the queue
    def _apply_lanes(self, repo: Repo, git_dir: Path, where: str) -> str:
        for lane in LANES:
            patches = self.queue.lane(lane)
            if not patches:
                continue
            with self.console.step(
                f"git am --3way: {lane.value} lane ({len(patches)} patch{'es' if len(patches) != 1 else ''}) in {where}"
            ):
                result = repo.git(*AM_ARGS, *[str(p.path) for p in patches], env=AM_ENV, check=False)
            if not result.ok:
                self._raise_conflict(repo, git_dir, lane, patches, result.tail())
        head = repo.head()
        assert head is not None
        return head

    def _raise_conflict(self, repo: Repo, git_dir: Path, lane: Lane, patches: tuple[Patch, ...], output: str) -> None:
        failed: Patch | None = None
        state = git_dir / "rebase-apply"
        with contextlib.suppress(OSError, ValueError):
            index = int((state / "next").read_text().strip())
            failed = patches[index - 1]
        conflicts = [
            line for line in repo.git("diff", "--name-only", "--diff-filter=U", check=False).stdout.splitlines() if line
        ]
        if not conflicts:
            conflicts = sorted(set(re.findall(r"^error: patch failed: (.+?):\d+$", output, flags=re.MULTILINE)))
        repo.git("am", "--abort", check=False)
        name = failed.label if failed else f"a patch of the {lane.value} lane"
        raise ConflictError(
            f"{name} does not apply"
            + (f": {failed.subject}" if failed and failed.subject else "")
            + (f" (conflicts in {', '.join(conflicts)})" if conflicts else ""),
            details=output,
            untouched=f"{self.rel(self.workdir)} was left as it was before this run; no stamp was written",
            next_step="refresh that patch against the new upstream (edit it, or carry the fix on a branch and "
            "run `invoke regenerate`), then re-run `invoke prepare`",
        )

    def _apply_aside(self, repo: Repo, git_dir: Path, base: str) -> str:
        """Build the patched commit in a temporary worktree sharing the object store."""
        aside_root = wd.skippy_dir(git_dir) / "aside"
        aside_root.mkdir(parents=True, exist_ok=True)
        aside = aside_root / uuid.uuid4().hex[:8]
        with self.console.step(f"check out {base[:12]} in a temporary worktree"):
            repo.git("worktree", "add", "--detach", "--quiet", str(aside), base)
        try:
            aside_repo = self.repo(aside)
            aside_git = Path(aside_repo.out("rev-parse", "--absolute-git-dir"))
            return self._apply_lanes(aside_repo, aside_git, "a temporary worktree")
        finally:
            repo.git("worktree", "remove", "--force", str(aside), check=False)
            shutil.rmtree(aside, ignore_errors=True)
            repo.git("worktree", "prune", check=False)

    def _changed_paths(self, repo: Repo, old: str | None, new: str) -> list[str]:
        if old is None:
            return []
        out = repo.git("diff", "--name-only", "--no-renames", "-z", old, new).stdout
        return [p for p in out.split("\0") if p]

    def _switch(
        self, repo: Repo, git_dir: Path, head: str | None, patched: str, upstream_sha: str, *, base: str, source: str
    ) -> int | None:
        """Move the workdir to ``patched``; git rewrites only files whose content differs.

        The journal records everything the stamp needs, so an interrupted switch is finished
        and stamped by the next run."""
        changed = self._changed_paths(repo, head, patched) if head else None
        entry = wd.Journal(
            "switch", head, patched, upstream_sha, base=base, queue_digest=self.queue.digest, source=source
        )
        with (
            wd.journal(git_dir, entry),
            self.console.step(
                f"move {self.rel(self.workdir)} to {patched[:12]}"
                + (f" ({len(changed)} file(s) differ)" if changed is not None else "")
            ),
        ):
            # an ignored file in the way stops the switch (the next run then refuses or backs it up)
            repo.git("checkout", "--detach", "--quiet", "--no-overwrite-ignore", patched)
        return len(changed) if changed is not None else None


# --------------------------------------------------------------------------- conflict sessions


def session_commands(rel_workdir: str) -> str:
    return (
        f"resolve the conflicts in {rel_workdir} (`git -C {rel_workdir} status` lists them), "
        f"stage them (`git -C {rel_workdir} add <paths>`), then `invoke prepare --continue`; "
        "or `invoke prepare --skip` to leave this patch out, or `invoke prepare --abort` to go back"
    )


def _am_one(repo: Repo, patch: Patch) -> bool:
    return repo.git(*AM_ARGS, str(patch.path), env=AM_ENV, check=False).ok


def run_session(
    repo: Repo, git_dir: Path, queue: Queue, entry: wd.Journal, *, start: int, console: Console
) -> wd.Journal | None:
    """Apply ``queue.patches[start:]`` one ``git am`` per patch; stop (journal written) at a conflict.

    Returns the journal of the stop, or None when the whole queue is applied.
    """
    for index in range(start, len(queue.patches)):
        patch = queue.patches[index]
        if not _am_one(repo, patch):
            stopped = dataclasses.replace(entry, stopped_at=index, stopped_patch=patch.label)
            wd.write_journal(git_dir, stopped)
            console.info(f"stopped at {patch.label}: {patch.subject}")
            return stopped
    return None


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


def resume(settings: Settings, action: Literal["continue", "skip", "abort"], *, console: Console) -> PrepareReport:
    """Drive a stopped conflict session to its end (``--continue``/``--skip``) or back (``--abort``)."""
    started = time.monotonic()
    rel = settings.relative(settings.workdir)
    git_dir = wd.git_dir_of(settings.workdir)
    entry = wd.read_journal(git_dir) if git_dir else None
    if git_dir is None or entry is None or entry.op != "session" or entry.stopped_at is None:
        raise ConflictError(
            f"no conflict session is in progress in {rel}",
            untouched=f"{rel}",
            next_step="`invoke prepare` starts one when a patch does not apply (outside CI)",
        )
    with (
        disk_errors(
            settings,
            rerun=f"invoke prepare --{action}",
            untouched=f"{rel}: the conflict session and your files are as they were",
        ),
        _locked(settings, console),
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
        position = entry.stopped_at
        current = queue.patches[position]
        resolved = entry.resolved
        saved: list[str] = []
        if action == "skip":
            # `git am --skip` resets the files of the skipped patch: a half-done resolution goes
            work = wd.local_work(repo, git_dir, None, settings.tolerated_untracked)
            if work.modified or work.untracked:
                ref = wd.save_backup(repo, git_dir, work, "invoke prepare --skip")
                console.warn(f"uncommitted changes in {rel} saved under {ref} before skipping {current.label}")
                saved.append(f"uncommitted changes before skipping {current.label} saved under {ref}")
            repo.git("am", "--skip", check=False)
            resolved = (*resolved, f"{current.label} (skipped)")
        else:
            unmerged = [p for p in repo.git("diff", "--name-only", "--diff-filter=U").stdout.splitlines() if p]
            if unmerged:
                raise ConflictError(
                    f"{current.label} still has unresolved conflicts in {', '.join(unmerged)}",
                    untouched=f"{rel}: the session is as you left it",
                    next_step=f"edit them, `git -C {rel} add {' '.join(unmerged)}`, then `invoke prepare --continue`",
                )
            date = _author_date(git_dir) or FALLBACK_DATE
            result = repo.git("am", "--continue", env={"GIT_COMMITTER_DATE": date}, check=False)
            if not result.ok:
                raise ConflictError(
                    f"`git am --continue` did not finish {current.label}",
                    details=result.tail(),
                    untouched=f"{rel}: the session is as you left it",
                    next_step=session_commands(rel),
                )
            resolved = (*resolved, f"{current.label} (resolved)")
        entry = dataclasses.replace(entry, resolved=resolved)
        stopped = run_session(repo, git_dir, queue, entry, start=position + 1, console=console)
        if stopped is not None:
            raise ConflictError(
                f"{stopped.stopped_patch} does not apply either: the conflict is waiting in {rel}",
                untouched=f"{rel}: earlier resolutions are kept in this session",
                next_step=session_commands(rel),
            )
        patched = repo.head()
        assert patched is not None and entry.base is not None
        stamp = wd.Stamp(
            upstream_sha=entry.upstream_sha,
            patched_sha=patched,
            queue_digest=queue.digest,
            base_commit=entry.base,
            source=entry.source or "git",
            resolved=resolved,
        )
        wd.write_stamp(git_dir, stamp)
        wd.drop_journal(git_dir)
    carry = (
        f"the resolution lives only in {rel} until it is in the queue: re-export the resolved patch "
        f"(`git -C {rel} format-patch --zero-commit --no-signature -1 <commit>` over the patch file) "
        "or regenerate the lanes from this checkout (`invoke regenerate`)"
    )
    console.info(carry)
    return PrepareReport(
        "resumed",
        stamp.upstream_sha,
        stamp.patched_sha,
        stamp.queue_digest,
        settings.workdir,
        stamp.source,
        time.monotonic() - started,
        notes=(*resolved, *saved, carry),
    )


def _abort_session(
    settings: Settings, repo: Repo, git_dir: Path, entry: wd.Journal, *, console: Console, started: float
) -> PrepareReport:
    """Back to the checkout the session started from, losing nothing.

    Uncommitted changes (a half-done resolution, an unrelated edit, new files) are saved under a
    backup ref first.  ``git am --abort`` keeps edits to files the session did not touch, and the
    move back keeps them too when the previous checkout has the same version of those files, as a
    plain ``git checkout`` does; only files that differ there are reset, and they are in the backup.
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
    repo.git("am", "--abort", check=False)
    if wd.in_progress(git_dir) is not None:
        repo.git("am", "--quit", check=False)
    if not repo.git("checkout", "--detach", "--quiet", back, check=False).ok:
        # edits to files that differ in the previous checkout: they go (they are in the backup)
        if backup_ref is None:
            backup_ref = wd.save_backup(repo, git_dir, work, "invoke prepare --abort")
        repo.git("checkout", "--force", "--detach", "--quiet", back)
    if backup_ref is not None:
        reset = wd.differ_from(repo, backup_ref, dirty)
        kept = sorted(set(dirty) - set(reset))
        if reset:
            notes.append(
                f"back at the previous checkout's version (yours is in {backup_ref}): {', '.join(reset)}; "
                f"bring one back with `git -C {rel} checkout {backup_ref} -- <path>`"
            )
            console.warn(notes[-1])
        if kept:
            notes.append(f"kept in {rel} as they were: {', '.join(kept)}")
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


# --------------------------------------------------------------------------- compat link


def ensure_compat_link(settings: Settings, console: Console) -> tuple[str, ...]:
    """Keep ``llama.cpp -> .deps/llama.cpp``; never replace a real file or directory."""
    link = settings.compat_link
    if link is None or not settings.workdir.exists():
        return ()
    configured = settings.root / str(settings.raw.get("workdir") or DEFAULT_WORKDIR)
    if settings.workdir.resolve() != configured.resolve():
        # LLAMA_WORKDIR points elsewhere (a scratch or second checkout): the project's link keeps
        # naming the configured workdir, so it never dangles when that other directory goes away
        return (
            f"compat link {settings.relative(link)} left as it is: it follows only the configured workdir "
            f"{settings.relative(configured)}, not LLAMA_WORKDIR={settings.workdir}",
        )
    try:
        return _update_compat_link(settings, link, console)
    except OSError as exc:
        problem = wd.oserror_problem(exc)
        note = f"compat link {settings.relative(link)} not updated: {problem.cause} ({problem.path or link})"
        console.warn(note)
        return (note,)


def _update_compat_link(settings: Settings, link: Path, console: Console) -> tuple[str, ...]:
    target = Path(_relpath(settings.workdir, link.parent))
    if link.is_symlink():
        if Path(link.readlink()) == target:
            return ()
        tmp = link.with_name(link.name + ".skippy-tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target, target_is_directory=True)
        tmp.replace(link)
        return (f"compat link {settings.relative(link)} now points to {target}",)
    if link.exists():
        console.warn(
            f"{settings.relative(link)} is a real file or directory, not the compatibility link; left as it is "
            "(set [tool.skippy] compat_link = false to silence this)"
        )
        return (f"{settings.relative(link)} is not a link: left untouched",)
    link.symlink_to(target, target_is_directory=True)
    return (f"compat link {settings.relative(link)} -> {target}",)


def _relpath(path: Path, start: Path) -> str:
    import os.path

    return os.path.relpath(path, start)
