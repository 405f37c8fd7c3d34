"""The llama.cpp workdir: stamps, journal, local-work detection, backups.

Everything here reads or writes small files under ``<git dir>/skippy/`` or
asks git about the work tree; nothing here moves HEAD.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.errors import WorkdirError
from skippy.core.files import write_text_atomic
from skippy.core.git import Repo

STAMP_SCHEMA = 1
STAMP_NAME = "prepare.json"
JOURNAL_NAME = "journal.json"
BACKUP_PREFIX = "refs/skippy/backups/"

#: markers of an operation in progress, relative to the git dir
_IN_PROGRESS: tuple[tuple[str, str], ...] = (
    ("rebase-apply/applying", "a `git am` session"),
    ("rebase-apply", "a `git rebase` (apply backend) session"),
    ("rebase-merge", "a `git rebase` session"),
    ("MERGE_HEAD", "a merge"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
    ("BISECT_LOG", "a bisect"),
)


@dataclass(frozen=True)
class Stamp:
    """What the last successful prepare produced (written last, atomically)."""

    upstream_sha: str
    patched_sha: str
    queue_digest: str
    #: the local commit that stands for upstream_sha (itself, or an archive import)
    base_commit: str
    source: str = "git"
    schema: int = STAMP_SCHEMA
    #: patches whose conflicts the maintainer resolved by hand in a session (not yet in the queue)
    resolved: tuple[str, ...] = ()
    #: the commits carry their Skippy-Patch trailers (False: prepared by an older skippy; the next
    #: prepare re-applies the queue, which rewrites no file)
    marked: bool = True
    #: each patch applied, in order: ``(label, recipe digest, commit)`` (see
    #: :func:`skippy.queue.apply.recipe_digests`); a later prepare reuses the commits of the patches
    #: that did not change (empty: it applies the whole queue)
    applied: tuple[tuple[str, str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["resolved"] = list(self.resolved)
        data["applied"] = [list(entry) for entry in self.applied]
        return data


@dataclass(frozen=True)
class Journal:
    """Written before skippy changes the workdir; removed when it is done."""

    op: str  # "apply" (git am in the workdir), "switch" (checkout of a prepared commit), "session"
    from_commit: str | None
    to_commit: str | None
    upstream_sha: str
    #: conflict sessions: the local base commit, queue digest, source, and the patch stopped at
    base: str | None = None
    queue_digest: str | None = None
    source: str | None = None
    stopped_at: int | None = None
    stopped_patch: str | None = None
    resolved: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocalWork:
    """Maintainer work in the workdir that a prepare must not lose."""

    modified: tuple[str, ...] = ()
    untracked: tuple[str, ...] = ()
    in_progress: str | None = None
    in_progress_marker: str | None = None
    head_problem: str | None = None
    tolerated: tuple[str, ...] = field(default=(), compare=False)
    #: conflict resolutions finished with ``--continue`` that the queue does not hold yet
    unqueued: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.modified or self.untracked or self.in_progress or self.head_problem or self.unqueued)

    @property
    def committed_only(self) -> bool:
        """Only commits (no uncommitted change, no operation in progress): the queue may reproduce them."""
        return bool(self.head_problem or self.unqueued) and not (self.modified or self.untracked or self.in_progress)

    def findings(self) -> list[str]:
        out: list[str] = []
        if self.in_progress:
            out.append(f"{self.in_progress} is in progress")
        if self.modified:
            out.append(f"{len(self.modified)} uncommitted change(s): {listing(self.modified)}")
        if self.untracked:
            out.append(f"{len(self.untracked)} untracked file(s): {listing(self.untracked)}")
        if self.head_problem:
            out.append(self.head_problem)
        if self.unqueued:
            out.append(self.unqueued)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "modified": list(self.modified),
            "untracked": list(self.untracked),
            "in_progress": self.in_progress,
            "head_problem": self.head_problem,
            "unqueued_resolution": self.unqueued,
        }


def listing(paths: Sequence[str], limit: int = 5) -> str:
    """``a, b, c and N more``: the first ``limit`` paths, for messages."""
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def skippy_dir(git_dir: Path) -> Path:
    return git_dir / "skippy"


_OBJECT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def head_of(repo: Repo, git_dir: Path) -> str | None:
    """HEAD's commit: read from ``git_dir``'s HEAD file when it is detached (as skippy leaves its
    checkouts: no git command), else asked of git (a branch, a packed ref, an unborn HEAD)."""
    try:
        text = (git_dir / "HEAD").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return text if _OBJECT_ID.match(text) else repo.head()


def git_dir_of(workdir: Path) -> Path | None:
    """The git dir of a workdir made by skippy (a plain ``.git`` directory)."""
    candidate = workdir / ".git"
    return candidate if candidate.is_dir() else None


def held_open(path: Path, proc_root: Path = Path("/proc")) -> bool | None:
    """Whether any process has ``path`` open (Linux: read from /proc); None where that cannot be known."""
    if not proc_root.is_dir():
        return None
    target = str(path.resolve())
    for fd_dir in proc_root.glob("[0-9]*/fd"):
        try:
            links = list(fd_dir.iterdir())
        except OSError:
            continue  # gone, or not ours to read
        for link in links:
            try:
                if str(link.readlink()) == target:
                    return True
            except OSError:
                continue
    return False


def remove_stale_index_lock(git_dir: Path) -> Path | None:
    """Remove ``index.lock`` when no process holds it (a git killed mid-write leaves it behind).

    Called with the prepare lock held: no git of another skippy run is writing, and no
    child of a killed run is left (skippy.core.proc ties children to their run).  A git
    the user runs by hand holds the file open and keeps it; where open files cannot be
    read (no /proc), nothing is removed.
    """
    lock = git_dir / "index.lock"
    if not lock.is_file() or held_open(lock) is not False:
        return None
    try:
        lock.unlink()
    except FileNotFoundError:
        return None  # a git of the killed run was still finishing: it took its lock away itself
    return lock


def read_stamp(git_dir: Path) -> Stamp | None:
    path = skippy_dir(git_dir) / STAMP_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # a damaged stamp is no stamp: the next prepare re-checks everything
    if not isinstance(data, dict) or data.get("schema") != STAMP_SCHEMA:
        return None
    try:
        return Stamp(
            upstream_sha=str(data["upstream_sha"]),
            patched_sha=str(data["patched_sha"]),
            queue_digest=str(data["queue_digest"]),
            base_commit=str(data["base_commit"]),
            source=str(data.get("source", "git")),
            resolved=tuple(str(x) for x in data.get("resolved", ())),
            marked=bool(data.get("marked", False)),
            applied=_applied(data.get("applied")),
        )
    except KeyError:
        return None


def _applied(value: object) -> tuple[tuple[str, str, str], ...]:
    """The stamp's ``applied`` list, or () when it is absent or not three strings per entry."""
    if not isinstance(value, list):
        return ()
    entries: list[tuple[str, str, str]] = []
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, str) for x in entry)):
            return ()
        entries.append((entry[0], entry[1], entry[2]))
    return tuple(entries)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_stamp(git_dir: Path, stamp: Stamp) -> None:
    write_json_atomic(skippy_dir(git_dir) / STAMP_NAME, stamp.as_dict())


def clear_stamp(git_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (skippy_dir(git_dir) / STAMP_NAME).unlink()


def read_journal(git_dir: Path) -> Journal | None:
    path = skippy_dir(git_dir) / JOURNAL_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Journal(
            op=str(data["op"]),
            from_commit=data.get("from_commit"),
            to_commit=data.get("to_commit"),
            upstream_sha=str(data["upstream_sha"]),
            base=data.get("base"),
            queue_digest=data.get("queue_digest"),
            source=data.get("source"),
            stopped_at=data.get("stopped_at"),
            stopped_patch=data.get("stopped_patch"),
            resolved=tuple(data.get("resolved", ())),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Journal(op="unknown", from_commit=None, to_commit=None, upstream_sha="")


@contextlib.contextmanager
def journal(git_dir: Path, entry: Journal) -> Iterator[None]:
    """Record ``entry`` while the block runs; keep it if the block is interrupted."""
    write_json_atomic(skippy_dir(git_dir) / JOURNAL_NAME, asdict(entry))
    yield
    with contextlib.suppress(FileNotFoundError):
        (skippy_dir(git_dir) / JOURNAL_NAME).unlink()


def write_journal(git_dir: Path, entry: Journal) -> None:
    data = asdict(entry)
    data["resolved"] = list(entry.resolved)
    write_json_atomic(skippy_dir(git_dir) / JOURNAL_NAME, data)


def drop_journal(git_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (skippy_dir(git_dir) / JOURNAL_NAME).unlink()


def conflict_markers(repo: Repo, *against: str) -> dict[str, list[str]]:
    """Files holding conflict markers, as ``git diff --check`` finds them in ``against`` (e.g.
    ``--cached``: the index against HEAD; ``HEAD``: the work tree against HEAD): path -> git's lines."""
    out = repo.git("diff", *against, "--check", check=False).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        if "leftover conflict marker" in line:
            found.setdefault(line.split(":", 1)[0], []).append(line.strip())
    return found


def in_progress(git_dir: Path) -> tuple[str, str] | None:
    for marker, label in _IN_PROGRESS:
        if (git_dir / marker).exists():
            return marker, label
    return None


def status_entries(repo: Repo, *, untracked: str = "normal", ignored: bool = False) -> list[tuple[str, str]]:
    """``(XY, path)`` pairs of ``git status --porcelain -z`` (untracked: ``??``; ``untracked="all"``
    lists the files inside untracked directories one by one; ``ignored`` adds ignored ones as ``!!``)."""
    result = repo.git(
        "status",
        "--porcelain=v1",
        "-z",
        f"--untracked-files={untracked}",
        *(["--ignored=traditional"] if ignored else []),
        "--no-renames",
        "--ignore-submodules=none",
    )
    entries: list[tuple[str, str]] = []
    for item in result.stdout.split("\0"):
        if len(item) > 3:
            entries.append((item[:2], item[3:]))
    return entries


def _tree_blobs(repo: Repo, commit: str | None) -> dict[str, str]:
    """``path -> blob`` of every file in ``commit`` (empty for None)."""
    if commit is None:
        return {}
    out = repo.git("ls-tree", "-r", "-z", "--full-tree", commit).stdout
    blobs: dict[str, str] = {}
    for item in out.split("\0"):
        meta, _, path = item.partition("\t")
        if path:
            blobs[path] = meta.split()[2]
    return blobs


def _worktree_blobs(repo: Repo, paths: list[str]) -> dict[str, str | None]:
    """``path -> blob`` as ``git add`` would store each work-tree file (None: absent; "?": not a file)."""
    files = [p for p in paths if (repo.path / p).is_file() and not (repo.path / p).is_symlink()]
    hashed: dict[str, str | None] = {}
    if files:
        out = repo.git("hash-object", "--stdin-paths", input="".join(p + "\n" for p in files)).stdout
        hashed.update(zip(files, out.split(), strict=True))
    for p in paths:
        if p not in hashed:
            hashed[p] = "?" if os.path.lexists(repo.path / p) else None
    return hashed


def differ_from(repo: Repo, commit: str, paths: list[str]) -> list[str]:
    """Those of ``paths`` whose work-tree file is not ``commit``'s version."""
    saved = _tree_blobs(repo, commit)
    actual = _worktree_blobs(repo, paths)
    return [p for p in paths if actual[p] != saved.get(p)]


def foreign_changes(repo: Repo, old: str | None, new: str) -> list[str]:
    """Paths of the work tree that hold neither ``old``'s nor ``new``'s version.

    An interrupted ``git checkout`` from ``old`` to ``new`` leaves every file it
    reached at ``new``'s content and every other at ``old``'s: anything else (an
    edit made after the interruption, a new file where ``new`` has one) is not
    skippy's and must not be overwritten.  Untracked or ignored files at paths
    neither commit has are not listed: a checkout does not touch them.
    """
    entries = status_entries(repo, untracked="all", ignored=True)
    if not entries:
        return []
    before, after = _tree_blobs(repo, old), _tree_blobs(repo, new)
    paths = [p for xy, p in entries if xy not in ("??", "!!") or p in before or p in after]
    actual = _worktree_blobs(repo, paths)
    return [p for p in paths if actual[p] not in (before.get(p), after.get(p))]


def is_tolerated(path: str, patterns: tuple[str, ...]) -> bool:
    for pattern in patterns:
        if pattern.endswith("/"):
            if path.endswith("/") and fnmatch.fnmatchcase(path.rstrip("/"), pattern.rstrip("/")):
                return True
            first = path.split("/", 1)[0]
            if "/" in path and fnmatch.fnmatchcase(first, pattern.rstrip("/")):
                return True
        elif fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern):
            return True
    return False


def local_work(repo: Repo, git_dir: Path, stamp: Stamp | None, tolerated: tuple[str, ...]) -> LocalWork:
    """Everything in the workdir that is not what skippy left there."""
    modified: list[str] = []
    untracked: list[str] = []
    ignored_ok: list[str] = []
    for xy, path in status_entries(repo):
        if xy == "??":
            (ignored_ok if is_tolerated(path, tolerated) else untracked).append(path)
        else:
            modified.append(path)
    progress = in_progress(git_dir)
    head = repo.head()
    head_problem: str | None = None
    unqueued: str | None = None
    if head is not None:
        if stamp is not None:
            if head == stamp.patched_sha and stamp.resolved:
                commits = resolution_commits(repo, stamp)
                unqueued = (
                    f"the conflict resolution(s) of {', '.join(stamp.resolved)} on upstream "
                    f"{stamp.upstream_sha[:12]} are committed here"
                    + (f" (commit {', '.join(c[:12] for c in commits)})" if commits else "")
                    + " but not in the queue"
                )
            if head != stamp.patched_sha:
                if repo.has_commit(stamp.patched_sha) and repo.is_ancestor(stamp.patched_sha, head):
                    count = repo.commit_count(f"{stamp.patched_sha}..{head}")
                    head_problem = f"{count} commit(s) on top of the recorded patched commit {stamp.patched_sha[:12]}"
                else:
                    head_problem = f"HEAD is {head[:12]}, not the recorded patched commit {stamp.patched_sha[:12]}"
        elif not _reachable_from_upstream(repo, head):
            head_problem = f"HEAD {head[:12]} holds commits that no upstream ref contains (no skippy stamp)"
    return LocalWork(
        modified=tuple(modified),
        untracked=tuple(untracked),
        in_progress=progress[1] if progress else None,
        in_progress_marker=progress[0] if progress else None,
        head_problem=head_problem,
        tolerated=tuple(ignored_ok),
        unqueued=unqueued,
    )


def resolution_commits(repo: Repo, stamp: Stamp) -> list[str]:
    """The commits of ``stamp``'s patched history that hold a conflict session's resolutions (the
    ``Skippy-Patch`` trailer of each patch resolved by hand; a skipped patch has none), oldest first."""
    found: list[str] = []
    for entry in stamp.resolved:
        label, _, how = entry.rpartition(" (")
        if how != "resolved)":
            continue
        result = repo.git(
            "log",
            "--format=%H",
            "--fixed-strings",
            f"--grep=Skippy-Patch: {label}",
            f"{stamp.base_commit}..{stamp.patched_sha}",
            check=False,
        )
        found += result.stdout.split()[:1] if result.ok else []
    return found


def _reachable_from_upstream(repo: Repo, commit: str) -> bool:
    result = repo.git(
        "for-each-ref",
        "--count=1",
        "--contains",
        commit,
        "--format=%(refname)",
        "refs/remotes/",
        "refs/tags/",
        "refs/skippy/archive/",
        check=False,
    )
    return result.ok and bool(result.stdout.strip())


def save_backup(repo: Repo, git_dir: Path, work: LocalWork, reason: str, *, also: tuple[str, ...] = ()) -> str:
    """Save HEAD, the index/work tree and untracked files under a backup ref; return the ref.

    ``also``: ignored files to save too (ones a forced checkout is about to overwrite).
    Uses a temporary index: the work tree and the real index are not touched.
    """
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    ref = BACKUP_PREFIX + stamp
    n = 1
    while repo.rev_parse(ref) is not None:
        n += 1
        ref = f"{BACKUP_PREFIX}{stamp}-{n}"
    tmp_dir = skippy_dir(git_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    index = tmp_dir / "backup.index"
    with contextlib.suppress(FileNotFoundError):
        index.unlink()
    env = {"GIT_INDEX_FILE": str(index)}
    head = repo.head()
    try:
        if head is not None:
            repo.git("read-tree", "HEAD", env=env)
        repo.git("add", "-A", "--", ".", env=env)
        present = [p for p in also if (repo.path / p).is_file()]
        if present:
            repo.git("add", "--force", "--", *present, env=env)
        tree = repo.git("write-tree", env=env).stdout.strip()
    finally:
        with contextlib.suppress(FileNotFoundError):
            index.unlink()
    message = f"skippy backup before {reason}\n\n" + "\n".join(f"- {f}" for f in work.findings()) + "\n"
    parents = ["-p", head] if head is not None else []
    commit = repo.git("commit-tree", tree, *parents, input=message).stdout.strip()
    repo.git("update-ref", "-m", f"skippy backup: {reason}", ref, commit)
    if work.in_progress_marker is not None:
        marker_dir = (git_dir / work.in_progress_marker.split("/", 1)[0]).resolve()
        if marker_dir.is_dir():
            dest = tmp_dir / "backups" / ref.removeprefix(BACKUP_PREFIX) / marker_dir.name
            shutil.copytree(marker_dir, dest)
    return ref


def abort_in_progress(repo: Repo, git_dir: Path) -> None:
    """Abort an in-progress am/rebase/merge/... (only after a backup, or when it is skippy's own)."""
    progress = in_progress(git_dir)
    if progress is None:
        return
    marker = progress[0]
    commands: dict[str, tuple[str, ...]] = {
        "rebase-apply/applying": ("am", "--abort"),
        "rebase-apply": ("rebase", "--abort"),
        "rebase-merge": ("rebase", "--abort"),
        "MERGE_HEAD": ("merge", "--abort"),
        "CHERRY_PICK_HEAD": ("cherry-pick", "--abort"),
        "REVERT_HEAD": ("revert", "--abort"),
        "BISECT_LOG": ("bisect", "reset"),
    }
    result = repo.git(*commands[marker], check=False)
    if not result.ok and marker.startswith("rebase-apply"):
        # a half-written am session that git itself cannot abort: quit keeps HEAD and the tree
        repo.git("am", "--quit", check=False)
    if in_progress(git_dir) is not None:
        raise WorkdirError(
            f"could not end the {progress[1]} in {repo.path}",
            untouched="the workdir, apart from the abort attempt",
            next_step=f"finish or abort it by hand in {repo.path}, then re-run `invoke prepare`",
            details=result.tail(),
        )


def discard_local_changes(repo: Repo, tolerated: tuple[str, ...]) -> None:
    """Restore tracked files to HEAD and remove untracked, non-ignored, non-tolerated files.

    Only called after :func:`save_backup`.  Ignored files (build outputs) stay.
    """
    if repo.head() is not None:
        repo.git("checkout", "--force", "--detach", "HEAD")
    excludes: list[str] = []
    for pattern in tolerated:
        excludes += ["-e", pattern]
    repo.git("clean", "-fd", *excludes)
