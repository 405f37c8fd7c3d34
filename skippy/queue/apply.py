"""Steps that apply the queue and move the workdir: ``git am --3way`` lane by lane, in a
temporary worktree or a fresh checkout; the switch to the patched commit; the stamp.

Patched commits are deterministic: the same commit and the same patch (fixed identity and
dates, the ``Skippy-Patch`` trailer) give the same commit.  The stamp records each patch's
commit with a digest of what made it (:func:`recipe_digests`), so a later prepare starts from
the commit of the last patch that did not change (:func:`reuse_point`) and applies only the
rest, with the very SHA a whole apply gives.  The temporary worktree holds only the files the
patches to apply touch (the others are marked skip-worktree): ``git am`` commits the index,
never reads the rest of the tree, so the commits are the same as in a full checkout.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from skippy.core.annotations import Annotation, patch_line
from skippy.core.errors import ConflictError
from skippy.core.git import AM_ARGS, AM_ENV, Repo
from skippy.queue import workdir as wd
from skippy.queue.am_output import failed_paths, unmerged_paths, without_am_hints
from skippy.queue.imports import shown_sha
from skippy.queue.mail import label_of, tag, tagged
from skippy.queue.model import LANES, Lane, Patch, Queue
from skippy.queue.patchpaths import header_paths
from skippy.queue.run import Run
from skippy.queue.upstream import Resolved


def _plural(n: int) -> str:
    return f"{n} patch{'es' if n != 1 else ''}"


def apply_lanes(run: Run, queue: Queue, repo: Repo, git_dir: Path, where: str, *, first: int = 0) -> str:
    """Apply the lanes in order on ``repo``'s HEAD (one ``git am`` for them all: the same commits
    as one per lane, without reading the tree again between lanes); the patched commit.  Raises
    ConflictError (the ``git am`` aborted: ``repo`` is back at its HEAD).

    ``first``: HEAD already holds ``queue.patches[:first]`` (their commits were reused); the
    patches from there on are applied."""
    patches = queue.patches[first:]
    if not patches:
        head = repo.head()
        assert head is not None
        return head
    counts = []
    for lane in LANES:
        whole = len(queue.lane(lane))
        n = sum(1 for p in patches if p.lane is lane)
        if n:
            counts.append(
                f"{lane.value} {n}" + (f" of {whole}, from {_first_of(patches, lane).name}" if n < whole else "")
            )
    with (
        run.console.step(f"git am --3way: {_plural(len(patches))} ({'; '.join(counts)}) in {where}"),
        tagged(git_dir, patches) as mails,
    ):
        result = repo.git(*AM_ARGS, *map(str, mails), env=AM_ENV, check=False)
    if not result.ok:
        raise failed_lane(run, repo, git_dir, patches=patches, output=result.tail())
    head = wd.head_of(repo, git_dir)
    assert head is not None
    return head


#: ``git am``'s own line for the mail it stopped at, numbered within that ``git am`` run
_AM_STOPPED = re.compile(r"^Patch failed at (\d+) (.*)$", re.MULTILINE)


def am_said(output: str, patches: Sequence[Patch]) -> str:
    """What a stopped ``git am`` of ``patches`` said, for skippy's messages: git's next-step hints
    dropped, and its "Patch failed at 0001 <subject>" naming the patch by its label (git counts the
    mails of its own run, which is not the queue's numbering: a session applies one patch per run,
    a re-prepare starts after the patches it reuses)."""

    def label(match: re.Match[str]) -> str:
        index = int(match[1])
        if not 1 <= index <= len(patches):
            return f"Patch failed: {match[2]}"
        return f"Patch failed at {patches[index - 1].label} ({match[2]})"

    return _AM_STOPPED.sub(label, without_am_hints(output))


def _first_of(patches: Sequence[Patch], lane: Lane) -> Patch:
    return next(p for p in patches if p.lane is lane)


def failed_lane(run: Run, repo: Repo, git_dir: Path, *, patches: Sequence[Patch], output: str) -> ConflictError:
    """The error of a ``git am`` of ``patches`` that stopped, naming the patch and its paths;
    aborts the am."""
    failed: Patch | None = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        index = int((git_dir / "rebase-apply" / "next").read_text().strip())
        failed = patches[index - 1]
    conflicts = unmerged_paths(repo)
    failed_here = () if conflicts else failed_paths(output)
    repo.git("am", "--abort", check=False)
    name = failed.label if failed else "a patch of the queue"
    where = ""
    if conflicts:
        where = f" (conflicts in {', '.join(conflicts)})"
    elif failed_here:
        where = f" (git could not apply it to {', '.join(failed_here)}; no conflict markers)"
    what = f"{name} does not apply" + (f": {failed.subject}" if failed and failed.subject else "") + where
    annotations = []
    if failed is not None:
        files = conflicts or failed_here
        line = patch_line(failed.data, files[0]) if files else None
        annotations.append(Annotation(run.rel(failed.path), line, "does not apply", what, level="error"))
    return ConflictError(
        what,
        details=am_said(output, patches),
        untouched=f"{run.rel(run.workdir)} was left as it was before this run; no stamp was written",
        next_step="refresh that patch against the new upstream (edit it, or carry the fix on a branch and "
        "run `invoke regenerate`), then re-run `invoke prepare`",
        annotations=annotations,
    )


#: ``git --version`` by the PATH it was found on (asked once per process and PATH)
_GIT_VERSIONS: dict[str, str] = {}


def _git_version(repo: Repo) -> str:
    key = repo.env.get("PATH", "")
    if key not in _GIT_VERSIONS:
        _GIT_VERSIONS[key] = repo.out("--version")
    return _GIT_VERSIONS[key]


def recipe_digests(repo: Repo, patches: Sequence[Patch]) -> list[str]:
    """For each patch, a digest of everything its commit depends on besides its parent: the mail
    ``git am`` reads (the patch with its trailer), how it is applied (arguments, dates) and the
    git that applies it.  Equal digests on the same parent give the same commit."""
    version = _git_version(repo)
    recipe = "\0".join([version, *AM_ARGS, *(f"{k}={v}" for k, v in sorted(AM_ENV.items()))]).encode()
    return [hashlib.sha256(recipe + b"\0" + tag(p.data, p.label)).hexdigest() for p in patches]


def reuse_point(queue: Queue, repo: Repo, base: str, since: wd.Stamp | None) -> tuple[int, str]:
    """``(n, commit)``: the first ``n`` patches of ``queue`` are unchanged since the prepare that
    wrote ``since`` (same lane, file, bytes, git and way of applying), on the same base, and
    ``commit`` (``base`` when ``n`` is 0) is the commit of the n-th.  Only a stamp of the queue's
    own commits counts (trailers, no hand-made resolution)."""
    if since is None or not since.applied or not since.marked or since.resolved or since.base_commit != base:
        return 0, base
    digests = recipe_digests(repo, queue.patches)
    n = 0
    for patch, digest, (label, recorded, _commit) in zip(queue.patches, digests, since.applied, strict=False):
        if (patch.label, digest) != (label, recorded):
            break
        n += 1
    if n == 0:
        return 0, base
    commit = since.applied[n - 1][2]
    if not repo.has_commit(commit):
        return 0, base  # pruned since (a `git gc` of the workdir): apply the whole queue
    return n, commit


def apply_aside(run: Run, queue: Queue, repo: Repo, git_dir: Path, base: str, *, since: wd.Stamp | None = None) -> str:
    """The patched commit of ``queue`` on ``base``, built in a temporary worktree sharing the
    object store; ``repo``'s own checkout is not touched.

    With ``since`` (the stamp of an earlier prepare), the commits of the patches that did not
    change are reused (:func:`reuse_point`): the result is the same commit a whole apply gives.
    The worktree first holds only the files the patches touch; when ``git am`` stops there, the
    patches are applied again in a full checkout, which says what conflicts as it always has."""
    first, start = reuse_point(queue, repo, base, since)
    if first:
        run.console.info(
            f"reusing the commits of the {first} unchanged patch(es) before the first change: "
            f"{queue.patches[first - 1].label} is {start[:12]}"
        )
    if first == len(queue.patches):
        return start
    try:
        return _apply_in_worktree(run, queue, repo, git_dir, start, first=first, sparse=True)
    except ConflictError:
        run.console.info("applying again in a full checkout, to say what does not apply")
        return _apply_in_worktree(run, queue, repo, git_dir, start, first=first, sparse=False)


def _apply_in_worktree(
    run: Run, queue: Queue, repo: Repo, git_dir: Path, start: str, *, first: int, sparse: bool
) -> str:
    aside_root = wd.skippy_dir(git_dir) / "aside"
    aside_root.mkdir(parents=True, exist_ok=True)
    aside = aside_root / uuid.uuid4().hex[:8]
    # a reused patch commit is shown as itself, an upstream base as the upstream SHA it stands for
    shown = (start if first else shown_sha(repo, start))[:12]
    try:
        if sparse:
            with run.console.step(f"check out the files the patches touch of {shown} in a temporary worktree"):
                aside_repo = run.repo(aside)
                aside_git = add_sparse_worktree(repo, aside_repo, start, touched_paths(queue.patches[first:]))
        else:
            with run.console.step(f"check out {shown} in a temporary worktree"):
                repo.git("worktree", "add", "--detach", "--quiet", str(aside), start)
                aside_repo = run.repo(aside)
                aside_git = Path(aside_repo.out("rev-parse", "--absolute-git-dir"))
        return apply_lanes(run, queue, aside_repo, aside_git, "a temporary worktree", first=first)
    finally:
        # the folder first: prune then drops git's entry of a worktree whose folder is gone
        shutil.rmtree(aside, ignore_errors=True)
        repo.git("worktree", "prune", check=False)


def linked_git_dir(worktree: Path) -> Path:
    """The git dir of a linked worktree, as its ``.git`` file names it (``gitdir: <path>``)."""
    named = (worktree / ".git").read_text(encoding="utf-8").strip().removeprefix("gitdir:").strip()
    return (worktree / named).resolve()


_C_ESCAPE = re.compile(r"\\([0-7]{3}|.)")
_C_NAMED = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r"}


def _c_unescape(path: str) -> str:
    """A path git C-quoted in a patch header, its escapes decoded (octal bytes as UTF-8)."""
    if "\\" not in path:
        return path
    out = bytearray()
    last = 0
    for match in _C_ESCAPE.finditer(path):
        out += path[last : match.start()].encode()
        code = match.group(1)
        out += bytes([int(code, 8)]) if len(code) == 3 else _C_NAMED.get(code, code).encode()
        last = match.end()
    out += path[last:].encode()
    return out.decode("utf-8", errors="surrogateescape")


def touched_paths(patches: Sequence[Patch]) -> set[str]:
    """Every path the diffs of ``patches`` name (either side of a rename or copy)."""
    return {_c_unescape(path) for p in patches for _line, path in header_paths(p.data.decode("utf-8", "replace"))}


_PATTERN_SPECIAL = re.compile(r"([\\*?\[\]!# ])")


def add_sparse_worktree(repo: Repo, aside: Repo, commit: str, wanted: set[str]) -> Path:
    """A linked worktree of ``repo`` at ``aside.path``, detached at ``commit``, with only the
    ``wanted`` paths written (:func:`sparse_checkout`); its git dir."""
    repo.git("worktree", "add", "--detach", "--no-checkout", "--quiet", str(aside.path), commit)
    aside_git = linked_git_dir(aside.path)
    sparse_checkout(aside, aside_git, commit, wanted)
    return aside_git


def sparse_checkout(aside: Repo, aside_git: Path, commit: str, wanted: set[str]) -> None:
    """Fill the index of a worktree added with ``--no-checkout`` from ``commit``, writing only the
    ``wanted`` files that ``commit`` has; every other entry is marked skip-worktree, so git takes
    it as it is in the index (``git am`` commits the index: the rest of the tree is never read).

    The patterns are the worktree's own (its git dir's ``info/sparse-checkout``, gone with it);
    the sparse checkout is switched on for this one command, never in the repository's config."""
    patterns = "".join("/" + _PATTERN_SPECIAL.sub(r"\\\1", path) + "\n" for path in sorted(wanted))
    (aside_git / "info").mkdir(parents=True, exist_ok=True)
    (aside_git / "info" / "sparse-checkout").write_text(patterns, encoding="utf-8", errors="surrogateescape")
    aside.git("-c", "core.sparseCheckout=true", "-c", "core.sparseCheckoutCone=false", "read-tree", "-mu", commit)


def changed_paths(repo: Repo, old: str, new: str) -> list[str]:
    out = repo.git("diff", "--name-only", "--no-renames", "-z", old, new).stdout
    return [p for p in out.split("\0") if p]


def switch(
    run: Run, queue: Queue, repo: Repo, git_dir: Path, *, head: str | None, patched: str, at: Resolved
) -> int | None:
    """Move the workdir to ``patched``; git rewrites only files whose content differs.

    The journal records everything the stamp needs, so an interrupted switch is finished
    and stamped by the next run.  The number of files that differ (None without a HEAD)."""
    changed = changed_paths(repo, head, patched) if head else None
    entry = wd.Journal(
        "switch", head, patched, at.upstream_sha, base=at.base, queue_digest=queue.digest, source=at.source
    )
    said = [f"{len(changed)} file(s) differ"] if changed is not None else []
    if run.reverted:
        said.append(f"--force reverted {len(run.reverted)} file(s) before")
    with (
        wd.journal(git_dir, entry),
        run.console.step(f"move {run.rel(run.workdir)} to {patched[:12]}" + (f" ({'; '.join(said)})" if said else "")),
    ):
        # an ignored file in the way stops the switch (the next run then refuses or backs it up)
        repo.git("checkout", "--detach", "--quiet", "--no-overwrite-ignore", patched)
    return len(changed) if changed is not None else None


def applied_commits(repo: Repo, queue: Queue, base: str, patched: str) -> tuple[tuple[str, str, str], ...]:
    """``(label, recipe digest, commit)`` of each patch, read from ``base..patched`` (one commit per
    patch, in order, each with its patch's trailer); () when the history is not that."""
    if not queue.patches:
        return ()
    out = repo.git("log", "-z", "--first-parent", "--reverse", "--format=%H%n%B", f"{base}..{patched}", check=False)
    if not out.ok:
        return ()
    commits = [item.partition("\n") for item in out.stdout.split("\0") if item.strip()]
    if len(commits) != len(queue.patches):
        return ()
    if any(label_of(message) != p.label for p, (_sha, _nl, message) in zip(queue.patches, commits, strict=True)):
        return ()
    digests = recipe_digests(repo, queue.patches)
    return tuple(
        (p.label, digest, sha.strip())
        for p, digest, (sha, _nl, _msg) in zip(queue.patches, digests, commits, strict=True)
    )


def stamp(git_dir: Path, queue: Queue, at: Resolved, patched: str, *, repo: Repo) -> wd.Stamp:
    """Record what was prepared, with each patch's commit (:func:`applied_commits`): written last,
    atomically."""
    new = wd.Stamp(
        upstream_sha=at.upstream_sha,
        patched_sha=patched,
        queue_digest=queue.digest,
        base_commit=at.base,
        source=at.source,
        applied=applied_commits(repo, queue, at.base, patched),
    )
    wd.write_stamp(git_dir, new)
    return new
