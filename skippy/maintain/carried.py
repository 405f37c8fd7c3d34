"""Patches upstream already carries: for each patch of the queue, whether the new upstream commit
already contains its change, told before any conflict is met.

Three findings, tried in this order for each patch (a patch with none is not listed):

* ``patch-id``: the patch's ``git patch-id --stable`` equals that of an upstream commit of
  ``OLD..NEW`` (upstream took it as it is).  The upstream side is computed once: one
  ``git log -p`` of the commits whose files all belong to the queue's (a commit touching another
  file cannot have a patch's patch-id), diffed with the queue's export options, and one
  ``git patch-id`` run over it; merges, the queue's own commits (``Skippy-Patch`` trailer) and
  this repository's imports of source archives are left out (:mod:`skippy.maintain.upstream_log`,
  as for every pin-move report).  Both sides reach ``git patch-id`` as UTF-8 text (a byte
  that is not becomes U+FFFD on both).  When several commits match, the oldest is named; a later
  revert is not looked for.
* ``applied``: the change is in ``NEW``, though not as a commit of its own (upstream took it
  inside a larger commit, or with other lines around it).  A patch (or one of its hunks) is
  *carried* by a tree when it does not apply to it as it is, and either
  ``git apply --reverse --check`` succeeds (its postimage is there verbatim) or
  ``git apply --3way`` succeeds and leaves the tree as it was (upstream made the same change,
  with different lines around it).  The two answer different cases: the reverse check needs the
  patch's own context around the change and nothing else, so it answers for a new file upstream
  added verbatim, or for a patch whose preimage blob this repository lacks (a patch on top of
  another one, made elsewhere); the 3-way merge needs the preimage blob (OLD has it for a patch
  made on the pin) but not the context, so it answers when upstream changed the lines around the
  change.  Neither sees a change whose neighbouring lines upstream changed too (an adjacent
  change is a conflict for git's merge), nor one upstream took and then edited further.  Whole
  patches are tried first, then each hunk: a patch whose every hunk is carried is ``applied``.
* ``partly``: some of its hunks are carried, others not (``hunks_carried`` of ``hunks``).

Hunks are split per file, one hunk a unit (:func:`split_hunks`); a file's part without a text hunk
(binary, a mode change alone, an empty new file) is a unit that is never carried: such a patch is
carried only by its patch-id.

For ``applied`` and ``partly`` the upstream commit named is the first of
``git rev-list --first-parent --reverse OLD..NEW -- <the patch's files>`` at which the same hunks
are carried, found by binary search: it assumes, as ``git bisect`` does, that once upstream
carries a change it keeps carrying it, and that the pin does not.

Everything runs in temporary indexes (``GIT_INDEX_FILE``) under the caller's scratch folder:
nothing is checked out, no ref moves (``git apply --3way`` may leave unreferenced blobs in the
object store, as ``invoke bisect`` does).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippy.core.errors import SettingsError
from skippy.core.git import Repo, config_args
from skippy.maintain.upstream_log import LITERAL_PATHSPECS, UpstreamCommit, upstream_commits
from skippy.queue.model import Patch, Queue

#: the diff of an upstream commit shaped as the queue's exports are (``skippy.maintain.replay``'s
#: ``EXPORT_ARGS`` and the ``diff.*`` keys of its ``EXPORT_CONFIG``), so that equal changes hash equal
LOG_DIFF_ARGS: Final[tuple[str, ...]] = (
    "--no-renames",
    "--diff-algorithm=myers",
    "--unified=3",
    "--binary",
    "--full-index",
    "--no-relative",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
)
LOG_DIFF_CONFIG: Final[tuple[tuple[str, str], ...]] = (
    ("diff.interHunkContext", "0"),
    ("diff.indentHeuristic", "true"),
    ("diff.suppressBlankEmpty", "false"),
)
#: a line ``git patch-id`` reads as the start of another commit
_COMMIT_LINE: Final = re.compile(r"^(?:commit |From )[0-9a-fA-F]{40}")
_HUNK_HEADER: Final = re.compile(rb"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@dataclass(frozen=True)
class Carried:
    """A patch whose change the new upstream commit already holds, all of it or some hunks."""

    patch: str  # Patch.label
    path: Path  # the patch file
    how: str  # "patch-id" | "applied" | "partly"
    commit: str | None  # the upstream commit of OLD..NEW that brought the change (None: not found)
    commit_subject: str | None
    hunks_carried: int
    hunks: int

    def as_dict(self) -> dict[str, object]:
        return {
            "patch": self.patch,
            "path": str(self.path),
            "how": self.how,
            "commit": self.commit,
            "commit_subject": self.commit_subject,
            "hunks_carried": self.hunks_carried,
            "hunks": self.hunks,
        }

    def describe(self) -> str:
        """One line for reports."""
        who = f'upstream {self.commit[:12]} "{self.commit_subject}"' if self.commit else "the new upstream commit"
        if self.how == "patch-id":
            return f"{self.patch}: {who} carries it (same patch-id)"
        if self.how == "applied":
            return f"{self.patch}: {who} carries its change (not as the same patch-id)"
        return f"{self.patch}: {who} carries {self.hunks_carried} of its {self.hunks} hunks"


@dataclass(frozen=True)
class Hunk:
    """One unit of a patch: a file's header and one of its hunks, a patch of its own."""

    path: str  # the file, as its ``diff --git`` line names it (a/ side)
    text: bytes
    #: a text hunk; False for a file's part without one (binary, mode change, empty new file)
    textual: bool


def split_hunks(data: bytes) -> tuple[Hunk, ...]:
    """The units of a patch (mail or plain diff): per file, each hunk with the file's header.

    The message before the first ``diff --git`` line and anything after the last hunk of a file
    (a mail's signature) are left out; hunk lengths come from their ``@@`` headers."""
    lines = data.splitlines(keepends=True)
    units: list[Hunk] = []
    i = _next_file(lines, 0)
    while i < len(lines):
        path = _diff_path(lines[i])
        header = [lines[i]]
        i += 1
        while i < len(lines) and not lines[i].startswith((b"@@ ", b"diff --git ", b"GIT binary patch")):
            header.append(lines[i])
            i += 1
        found = False
        while i < len(lines) and _HUNK_HEADER.match(lines[i]):
            end = _hunk_end(lines, i)
            units.append(Hunk(path, b"".join(header + lines[i:end]), textual=True))
            found = True
            i = end
        if not found:
            if i < len(lines) and lines[i].startswith(b"GIT binary patch"):
                end = _next_file(lines, i)
                header += lines[i:end]
                i = end
            units.append(Hunk(path, b"".join(header), textual=False))
        i = _next_file(lines, i)
    return tuple(units)


def _next_file(lines: Sequence[bytes], i: int) -> int:
    while i < len(lines) and not lines[i].startswith(b"diff --git "):
        i += 1
    return i


def _diff_path(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace").rstrip("\n")[len("diff --git ") :]
    if text.startswith("a/"):
        return text[2:].partition(" b/")[0]
    return text  # a quoted name: shown as git wrote it


def _hunk_end(lines: Sequence[bytes], start: int) -> int:
    """The index after the hunk starting at ``start`` (its ``\\ No newline`` markers included)."""
    match = _HUNK_HEADER.match(lines[start])
    assert match is not None
    old = int(match[1]) if match[1] is not None else 1
    new = int(match[2]) if match[2] is not None else 1
    i = start + 1
    while i < len(lines) and (old > 0 or new > 0):
        line = lines[i]
        if line.startswith(b"\\"):
            pass
        elif line.startswith(b"-"):
            old -= 1
        elif line.startswith(b"+"):
            new -= 1
        elif line.startswith((b" ", b"\n", b"\r\n")):  # an empty line: context whose space was lost
            old -= 1
            new -= 1
        else:
            break  # a short hunk: git apply says what is wrong with it
        i += 1
    while i < len(lines) and lines[i].startswith(b"\\"):
        i += 1
    return i


# --------------------------------------------------------------------------- upstream's patch-ids


def _queue_paths(patches: Sequence[Patch]) -> frozenset[str] | None:
    """Every file the queue touches (both names of a rename), or None when a name is quoted."""
    paths: set[str] = set()
    for patch in patches:
        for line in patch.data.splitlines():
            if line.startswith(b"diff --git "):
                a_side, sep, b_side = line.decode("utf-8", errors="replace")[len("diff --git ") :].partition(" b/")
                if not (sep and a_side.startswith("a/")):
                    return None
                paths.update((a_side[2:], b_side))
    return frozenset(paths)


def _upstream_patch_ids(repo: Repo, old: str, new: str, patches: Sequence[Patch]) -> dict[str, UpstreamCommit]:
    """patch-id -> the oldest upstream commit of ``old..new`` with it.

    A commit can have a patch's patch-id only if it touches that patch's files and no other: only
    the commits whose files all belong to the queue's are diffed (one ``git log -p`` of them, one
    ``git patch-id`` run), so that a large upstream move costs a list of names, not its diff."""
    paths = _queue_paths(patches)
    if paths is not None and not paths:
        return {}
    listed = upstream_commits(repo, old, new, touching=paths)
    commits = {c.sha: c for c in listed if paths is None or set(c.paths) <= paths}
    if not commits:
        return {}
    log = repo.git(
        *config_args(LOG_DIFF_CONFIG),
        "log",
        "-p",
        "--stdin",
        "--no-walk=unsorted",
        *LOG_DIFF_ARGS,
        "--format=commit %H",
        input="".join(sha + "\n" for sha in commits),
        what="git log -p",
    ).stdout
    ids: dict[str, UpstreamCommit] = {}
    for line in repo.git("patch-id", "--stable", input=log).stdout.splitlines():
        patch_id, _, sha = line.partition(" ")
        if sha in commits:
            ids[patch_id] = commits[sha]  # newest first: the oldest one stays
    return ids


def patch_ids(repo: Repo, patches: Sequence[Patch]) -> tuple[str | None, ...]:
    """Each patch's ``git patch-id --stable`` (None for a patch without a diff), in one run.

    Each patch is given a commit line of its own: the mails' ``From <sha>`` lines (all zeros with
    ``--zero-commit``) could not tell them apart."""
    parts: list[str] = []
    for index, patch in enumerate(patches):
        text = patch.data.decode("utf-8", errors="replace")
        kept = "".join(line for line in text.splitlines(keepends=True) if not _COMMIT_LINE.match(line))
        parts.append(f"commit {index:040x}\n{kept}" + ("" if kept.endswith("\n") else "\n"))
    found: dict[int, str] = {}
    if parts:
        for line in repo.git("patch-id", "--stable", input="".join(parts)).stdout.splitlines():
            patch_id, _, tag = line.partition(" ")
            found[int(tag, 16)] = patch_id
    return tuple(found.get(index) for index in range(len(patches)))


# --------------------------------------------------------------------------- carried by a tree


class _Trees:
    """Upstream trees in temporary indexes (each commit read once) and the carried test in them."""

    def __init__(self, repo: Repo, folder: Path) -> None:
        self.repo = repo
        self.folder = folder
        self.work = folder / "work.index"
        self.env = {"GIT_INDEX_FILE": str(self.work)}
        self.pristine: dict[str, Path] = {}
        self.trees: dict[str, str] = {}
        self.loaded: str | None = None
        self.dirty = False
        self.cache: dict[tuple[str, Path], bool] = {}

    def _load(self, commit: str) -> None:
        if self.loaded == commit and not self.dirty:
            return
        saved = self.pristine.get(commit)
        if saved is None:
            saved = self.folder / f"{commit}.index"
            self.repo.git("read-tree", commit, env={"GIT_INDEX_FILE": str(saved)})
            self.pristine[commit] = saved
            self.trees[commit] = self.repo.out("rev-parse", f"{commit}^{{tree}}")
        shutil.copyfile(saved, self.work)
        self.loaded, self.dirty = commit, False

    def _apply(self, *args: str | Path) -> bool:
        return self.repo.git("apply", "--cached", *args, env=self.env, check=False).ok

    def carries(self, commit: str, patch_file: Path) -> bool:
        """Whether ``commit``'s tree already holds the change of ``patch_file`` (see the module)."""
        key = (commit, patch_file)
        if key not in self.cache:
            self.cache[key] = self._carries(commit, patch_file)
        return self.cache[key]

    def _carries(self, commit: str, patch_file: Path) -> bool:
        self._load(commit)
        if self._apply("--check", patch_file):
            return False  # it still changes the tree
        if self._apply("--reverse", "--check", patch_file):
            return True
        self.dirty = True
        if not self._apply("--3way", patch_file):
            return False
        tree = self.repo.git("write-tree", env=self.env, check=False)
        return tree.ok and tree.stdout.strip() == self.trees[commit]


def _first_holding(line: Sequence[str], holds: Callable[[str], bool]) -> str | None:
    """The first commit of ``line`` where ``holds`` is true, given that it holds at the last one,
    not before ``line``, and never stops holding once it does."""
    if not line:
        return None
    lo, hi = -1, len(line) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(line[mid]):
            hi = mid
        else:
            lo = mid
    return line[hi]


# --------------------------------------------------------------------------- the whole finding


def carried_patches(repo: Repo, queue: Queue, old: str, new: str, *, scratch: Path) -> tuple[Carried, ...]:
    """The patches of ``queue`` that ``new`` already carries, in queue order (see the module).

    ``old`` and ``new`` are local commits, ``old`` (the pin) an ancestor of ``new``; ``scratch`` is a
    folder of the caller's, where a temporary folder of this run is made and removed."""
    old_sha, new_sha = _commit(repo, old), _commit(repo, new)
    if not repo.is_ancestor(old_sha, new_sha):
        raise SettingsError(
            f"{new_sha[:12]} does not descend from {old_sha[:12]}: no upstream commits lie between them",
            untouched="everything",
            next_step="look for carried patches towards a descendant of the pin (`invoke bisect --to <ref>`)",
        )
    patches = queue.patches
    upstream_ids = _upstream_patch_ids(repo, old_sha, new_sha, patches)
    own_ids = patch_ids(repo, patches) if upstream_ids else (None,) * len(patches)
    folder = Path(tempfile.mkdtemp(prefix="carried-", dir=scratch))
    try:
        trees = _Trees(repo, folder)
        found: list[Carried] = []
        for index, (patch, patch_id) in enumerate(zip(patches, own_ids, strict=True)):
            units = split_hunks(patch.data)
            by = upstream_ids.get(patch_id) if patch_id is not None else None
            if by is not None:
                found.append(Carried(patch.label, patch.path, "patch-id", by.sha, by.subject, len(units), len(units)))
                continue
            carried = _by_tree(trees, folder / f"{index:04d}", patch, units, old=old_sha, new=new_sha)
            if carried is not None:
                found.append(carried)
        return tuple(found)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _commit(repo: Repo, rev: str) -> str:
    sha = repo.rev_parse(rev + "^{commit}")
    if sha is None:
        raise SettingsError(
            f"{rev!r} is not a commit of {repo.path}",
            untouched="everything",
            next_step="fetch it first (`invoke prepare --to <ref>` fetches a target)",
        )
    return sha


def _by_tree(
    trees: _Trees, folder: Path, patch: Patch, units: tuple[Hunk, ...], *, old: str, new: str
) -> Carried | None:
    """``applied`` or ``partly`` at ``new``, with the commit that brought it; None when not carried."""
    files = _carried_files(trees, folder, patch, units, new)
    if not files:
        return None
    count = len(units) if files == [folder / "whole.patch"] else len(files)
    paths = sorted({u.path for u in units})
    log = trees.repo.git(
        "log", "--first-parent", "--reverse", "--format=%H%x00%s", f"{old}..{new}", "--", *paths, env=LITERAL_PATHSPECS
    ).stdout
    subjects: dict[str, str] = {}
    for line in log.splitlines():
        sha, _, subject = line.partition("\0")
        subjects[sha] = subject
    commit = _first_holding(list(subjects), lambda sha: all(trees.carries(sha, f) for f in files))
    return Carried(
        patch.label,
        patch.path,
        "applied" if count == len(units) else "partly",
        commit,
        subjects[commit] if commit else None,
        count,
        len(units),
    )


def _carried_files(trees: _Trees, folder: Path, patch: Patch, units: tuple[Hunk, ...], new: str) -> list[Path]:
    """The patch files ``new`` carries: the whole patch, else those of the hunks it carries."""
    folder.mkdir()
    whole = folder / "whole.patch"
    whole.write_bytes(patch.data)
    if units and all(u.textual for u in units) and trees.carries(new, whole):
        return [whole]
    if len(units) < 2:
        return []  # its one hunk is the whole patch
    files: list[Path] = []
    for number, unit in enumerate(units, start=1):
        if unit.textual:
            piece = folder / f"hunk-{number:03d}.patch"
            piece.write_bytes(unit.text)
            if trees.carries(new, piece):
                files.append(piece)
    return files
