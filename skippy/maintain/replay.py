"""Shared plumbing of the queue-maintenance commands (regenerate, generate, parity, check).

* :func:`pinned_store`: a repository that holds the pinned upstream commit (the
  workdir's object store, or a temporary repository when there is no
  workdir), whose checkout is never touched;
* :func:`replay`: the queue applied on the pin in a temporary worktree, one
  commit per patch, deterministic; inside :func:`applied_once` the replays of
  one command share what they have in common: each patch is applied once
  (:class:`Replays`);
* :data:`EXPORT_ARGS` / :func:`export_range` / :func:`export_commit`: ``git
  format-patch`` with every option that shapes its output fixed, so that
  exporting the same commits twice gives the same bytes on any machine.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import QueueError, WorkdirError
from skippy.core.git import Repo, config_args
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.guard import locked
from skippy.queue.mail import untag
from skippy.queue.model import LANES, Lane, Patch, Queue, queue_digest
from skippy.queue.prepare import apply_queue_aside, resolve_target
from skippy.queue.target import Target

#: config that shapes `git format-patch` output, forced over the repository's own
EXPORT_CONFIG: tuple[tuple[str, str], ...] = (
    ("format.numbered", "false"),
    ("format.signOff", "false"),
    ("format.coverLetter", "false"),
    ("format.thread", "false"),
    ("format.useAutoBase", "false"),
    ("format.suffix", ".patch"),
    ("format.from", "false"),
    ("format.forceInBodyFrom", "false"),
    ("format.encodeEmailHeaders", "true"),
    ("format.filenameMaxLength", "64"),
    ("format.notes", "false"),
    ("diff.algorithm", "myers"),
    ("diff.renames", "false"),
    ("diff.context", "3"),
    ("diff.interHunkContext", "0"),
    ("diff.indentHeuristic", "true"),
    ("diff.orderFile", os.devnull),
    ("diff.relative", "false"),
    ("diff.suppressBlankEmpty", "false"),
    ("diff.statGraphWidth", "20"),
    ("diff.statNameWidth", "60"),
    ("diff.external", ""),
    ("core.abbrev", "12"),
    ("core.quotePath", "true"),
    ("color.ui", "false"),
    ("log.showSignature", "false"),
)

#: `git format-patch` options of every export (lanes and the generated lane)
EXPORT_ARGS: tuple[str, ...] = (
    "--zero-commit",
    "--no-signature",
    "--no-numbered",
    # To:/Cc:/extra headers from the repository's config are dropped, not blanked
    "--no-to",
    "--no-cc",
    "--no-add-header",
    "--full-index",
    "--binary",
    "--no-renames",
    "--diff-algorithm=myers",
    "--unified=3",
    "--stat=80,60",
    "--no-notes",
    "--no-cover-letter",
    "--no-thread",
    "--no-relative",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
    "--encoding=UTF-8",
)

#: dates of the commits skippy makes itself (generated lane)
FIXED_DATE = "2000-01-01T00:00:00+0000"


def export_config_args() -> list[str]:
    return config_args(EXPORT_CONFIG)


def export_range(repo: Repo, rev_range: str, out_dir: Path) -> list[Path]:
    """``git format-patch --start-number 1`` of ``rev_range`` into ``out_dir``; the files in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = repo.git(
        *export_config_args(),
        "format-patch",
        *EXPORT_ARGS,
        "--start-number",
        "1",
        "-o",
        str(out_dir),
        rev_range,
        "--",
        what="git format-patch",
    )
    files = [Path(line.strip()) for line in result.stdout.splitlines() if line.strip()]
    for path in files:  # the workdir's commits carry their Skippy-Patch trailer: the queue does not
        data = path.read_bytes()
        stripped = untag(data)
        if stripped != data:
            path.write_bytes(stripped)
    return files


def export_commit(repo: Repo, commit: str) -> bytes:
    """The mailbox patch of one commit, exported like the lanes."""
    result = repo.git(*export_config_args(), "format-patch", *EXPORT_ARGS, "--stdout", "-1", commit, "--")
    return untag(result.stdout.encode("utf-8"))


# --------------------------------------------------------------------------- the pinned store


@dataclass(frozen=True)
class Store:
    repo: Repo
    #: the upstream SHA of the pin and the local commit that stands for it
    upstream_sha: str
    base: str
    source: str
    #: True when the repository is the maintainer's checkout (never changed; worktrees only)
    shared: bool


@contextlib.contextmanager
def pinned_store(
    settings: Settings,
    *,
    console: Console,
    checkout: Path | None = None,
    offline: bool = False,
    lock: bool = True,
) -> Iterator[Store]:
    """A repository with the pinned commit: ``checkout`` (default the workdir) when it is a git
    checkout, else a temporary repository (fetched or imported from the source archive, removed
    afterwards).  Work happens in temporary worktrees only."""
    path = checkout if checkout is not None else settings.workdir
    if (path / ".git").exists():
        repo = Repo(path, settings.env, echo=console.command)
        if repo.toplevel() is None:
            raise WorkdirError(
                f"{settings.relative(path)} is not a git checkout",
                untouched="everything",
                next_step="run `invoke prepare --pinned`, or pass --checkout PATH",
            )
        guard = locked(settings, console) if lock and path == settings.workdir else contextlib.nullcontext()
        with guard:
            upstream_sha, base, source = resolve_target(
                settings, repo, Target.pinned(), console=console, offline=offline
            )
            yield Store(repo, upstream_sha, base, source, shared=True)
        return
    if checkout is not None:
        raise WorkdirError(
            f"--checkout {checkout} is not a git checkout",
            untouched="everything",
            next_step="pass the llama.cpp checkout that carries the branches",
        )
    tmp = settings.cache_dir / "tmp" / f"store-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        repo = Repo(tmp, settings.env, echo=console.command)
        repo.git("init", "--quiet")
        repo.git("remote", "add", "origin", settings.upstream_url)
        upstream_sha, base, source = resolve_target(settings, repo, Target.pinned(), console=console, offline=offline)
        # HEAD at the pin, detached, nothing checked out: a command that reads HEAD finds a commit, not an unborn branch
        repo.git("update-ref", "--no-deref", "HEAD", base)
        yield Store(repo, upstream_sha, base, source, shared=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class Replay:
    base: str
    patched: str
    #: every patch of the queue and the commit it made, in application order
    steps: tuple[tuple[Patch, str], ...]

    def tip(self, through: Lane) -> str:
        """The commit after the last patch of ``through`` and the lanes before it."""
        order = LANES.index(through)
        tip = self.base
        for patch, commit in self.steps:
            if LANES.index(patch.lane) <= order:
                tip = commit
        return tip


def sub_queue(queue: Queue, lanes: tuple[Lane, ...]) -> Queue:
    patches = tuple(p for p in queue.patches if p.lane in lanes)
    return Queue(root=queue.root, patches=patches, digest=queue_digest(patches))


class Replays:
    """Queues replayed on one ``base`` of ``repo``, each patch applied once: a queue that starts
    with patches already applied here (the same lane, name and bytes, in the same order) reuses
    their commits, and only the rest is applied, on top of them (by prepare's own apply aside, in
    a temporary worktree).

    ``git am`` makes the same commit from the same parent and patch whatever ran before it (fixed
    identity, committer date = author date, the patch's trailer), so a reused commit is the one a
    fresh replay of the whole queue makes."""

    def __init__(self, settings: Settings, repo: Repo, base: str, *, console: Console):
        self.settings = settings
        self.repo = repo
        self.base = base
        self.console = console
        #: the patches applied so far, one line of commits on ``base``: ((label, sha256), commit)
        self._line: list[tuple[tuple[str, str], str]] = []

    def serves(self, repo: Repo, base: str) -> bool:
        return repo.path == self.repo.path and base == self.base

    def replay(self, queue: Queue) -> Replay:
        """``queue`` applied on the base (raises ConflictError); one commit per patch."""
        keys = [(p.label, p.sha256) for p in queue.patches]
        done = 0
        while done < min(len(keys), len(self._line)) and self._line[done][0] == keys[done]:
            done += 1
        commits = [commit for _key, commit in self._line[:done]]
        rest = queue.patches[done:]
        if rest:
            start = commits[-1] if commits else self.base
            todo = Queue(root=queue.root, patches=rest, digest=queue_digest(rest))
            patched = apply_queue_aside(self.settings, self.repo, start, todo, console=self.console)
            made = self.repo.out("rev-list", "--reverse", "--topo-order", f"{start}..{patched}").split()
            if len(made) != len(rest):
                raise QueueError(
                    f"the queue has {len(queue.patches)} patches but applying it made {done + len(made)} commits",
                    untouched="everything: the queue was only applied in a temporary worktree",
                    next_step="look for empty patches in the queue (`invoke check` lists the lanes)",
                )
            self._line = self._line[:done] + list(zip(keys[done:], made, strict=True))
            commits += made
        return Replay(self.base, commits[-1] if commits else self.base, tuple(zip(queue.patches, commits, strict=True)))


_ACTIVE: contextvars.ContextVar[Replays | None] = contextvars.ContextVar("skippy_replays", default=None)


@contextlib.contextmanager
def applied_once(settings: Settings, repo: Repo, base: str, *, console: Console) -> Iterator[Replays]:
    """Inside the block, every :func:`replay` on ``base`` of ``repo`` (also one made by a step that
    knows nothing of the block, such as the generated lane's) shares one :class:`Replays`: a patch
    applied once is not applied again.  Nothing outlives the block (each apply's worktree is gone
    when it returns; the commits stay in the object store, unreferenced, as any replay's)."""
    replays = Replays(settings, repo, base, console=console)
    token = _ACTIVE.set(replays)
    try:
        yield replays
    finally:
        _ACTIVE.reset(token)


def replay(settings: Settings, repo: Repo, base: str, queue: Queue, *, console: Console) -> Replay:
    """Apply ``queue`` on ``base`` in a temporary worktree (raises ConflictError); one commit per
    patch.  Inside :func:`applied_once` for the same repository and base, the patches it already
    applied are reused."""
    active = _ACTIVE.get()
    if active is not None and active.serves(repo, base):
        return active.replay(queue)
    return Replays(settings, repo, base, console=console).replay(queue)


def read_text(repo: Repo, commit: str, path: str) -> str | None:
    """A file of ``commit`` as text (undecodable bytes replaced), or None when it is not there."""
    result = repo.git("cat-file", "blob", f"{commit}:{path}", check=False)
    return result.stdout if result.ok else None


def blob_id(repo: Repo, commit: str, path: str) -> str | None:
    return repo.rev_parse(f"{commit}:{path}")


def tracked_files(repo: Repo, commit: str) -> list[str]:
    out = repo.git("ls-tree", "-r", "-z", "--name-only", "--full-tree", commit).stdout
    return [p for p in out.split("\0") if p]


def changed_files(repo: Repo, old: str, new: str) -> list[str]:
    out = repo.git("diff-tree", "-r", "-z", "--no-renames", "--name-only", old, new).stdout
    return [p for p in out.split("\0") if p]
