"""Reading or writing many objects of a repository in one git process each.

A walk over a queue of N patches used to ask git a question per patch and file
(``cat-file blob``, ``diff``, ``diff-tree``): thousands of processes for a
queue of a few hundred. These helpers ask once:

* :func:`read_blobs`: the text of many blobs by id (``cat-file --batch``);
* :func:`tree_blobs`: every file of a commit with its blob id (``ls-tree``);
* :func:`step_diffs`: the diff of each step of a chain of commits
  (``diff-tree --stdin``), with full blob ids, so the files of each step can
  be read with one more :func:`read_blobs`;
* :func:`commit_chain`: a chain of commits, each changing some files to blobs
  the repository holds (``fast-import``), as ``git commit`` would have made them.
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from skippy.core.git import IDENTITY_EMAIL, IDENTITY_NAME, Repo

#: a blob id of the null object: the side of a diff where the file does not exist
NULL_ID = re.compile(r"^0+$")

_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")


def read_blobs(repo: Repo, ids: Iterable[str], *, limit: int | None = None) -> dict[str, str]:
    """The text of each blob in ``ids`` (undecodable bytes replaced), by id; ids git does not have
    are left out, and so are blobs over ``limit`` bytes. One ``git cat-file --batch`` whatever the
    number of blobs."""
    wanted = list(dict.fromkeys(i for i in ids if not NULL_ID.match(i)))
    if not wanted:
        return {}
    # each object's header names a fresh random token (no file holds it by chance, nor by design),
    # so the contents split without their sizes: the output is decoded text, whose length is not
    # the byte size git announces
    token = f"skippy-{uuid.uuid4().hex}"
    header = f"--batch={token} %(objectname) %(objecttype) %(objectsize)"
    out = repo.git("cat-file", header, input="\n".join(wanted) + "\n").stdout
    parts = out.split("\n" + token + " ")
    if len(parts) != len(wanted) or not parts[0].startswith(token + " "):
        # an id git does not have prints a bare "<id> missing" line inside the stream: read one by one
        return _read_each(repo, wanted, limit)
    parts[0] = parts[0][len(token) + 1 :]
    parts[-1] = parts[-1].removesuffix("\n")  # cat-file ends each object with a newline
    texts: dict[str, str] = {}
    for part in parts:
        head, _, body = part.partition("\n")
        name, kind, size = [*head.split(" "), "", ""][:3]
        if kind == "blob" and (limit is None or int(size) <= limit):
            texts[name] = body
    return texts


def _read_each(repo: Repo, ids: Sequence[str], limit: int | None) -> dict[str, str]:
    texts: dict[str, str] = {}
    for blob in ids:
        result = repo.git("cat-file", "blob", blob, check=False)
        if result.ok and (limit is None or len(result.stdout.encode("utf-8", errors="replace")) <= limit):
            texts[blob] = result.stdout
    return texts


def tree_blobs(repo: Repo, commit: str) -> dict[str, str]:
    """Every file of ``commit`` (submodules left out) and its blob id, by path."""
    out = repo.git("ls-tree", "-r", "-z", "--full-tree", commit).stdout
    files: dict[str, str] = {}
    for entry in out.split("\0"):
        meta, _, path = entry.partition("\t")
        parts = meta.split()
        if path and len(parts) == 3 and parts[1] == "blob":
            files[path] = parts[2]
    return files


def step_diffs(repo: Repo, steps: Sequence[tuple[str, str]], *args: str) -> list[str]:
    """The diff of each step ``(old, new)`` (``git diff-tree -p --full-index <args> old new``), in
    order, in one process; ``new`` must be a commit's full id (git prints it before the step's diff,
    which is how the output is split). An empty step gives an empty string."""
    if not steps:
        return []
    # one commit per line followed by the commit to compare it with: git reads that as the commit's
    # parents and prints the commit's id before its diff
    lines = "".join(f"{new} {old}\n" for old, new in steps)
    out = repo.git("diff-tree", "--stdin", "-r", "-p", "--full-index", *args, input=lines).stdout
    by_commit: dict[str, list[str]] = {}
    current: list[str] | None = None
    wanted = {new for _old, new in steps}
    for line in out.split("\n"):
        if line in wanted:
            current = by_commit.setdefault(line, [])
        elif current is not None:
            current.append(line)
    return ["\n".join(by_commit.get(new, [])) for _old, new in steps]


class FileChange(NamedTuple):
    """What a diff says of one file: its blob ids before and after (a null id where the file is
    not; abbreviated unless the diff was made with ``--full-index``) and its mode after
    (``000000`` once deleted; empty when the diff names none)."""

    old: str
    new: str
    mode: str


def diff_files(diff: str) -> dict[str, FileChange]:
    """Each file of a diff in git's patch format that has an ``index`` line, by its path (the new
    one); a patch file's mail around the diff is passed over."""
    found: dict[str, FileChange] = {}
    path: str | None = None  # inside this file's header
    mode = ""
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
            path, mode = (m.group(2) if m else None), ""
        elif path is None:
            continue
        elif line.startswith(("new file mode ", "new mode ", "deleted file mode ")):
            mode = line.rsplit(" ", 1)[-1]
        elif (m := _INDEX.match(line)) is not None:
            old, new, tail = m.group(1), m.group(2), line[m.end() :].strip()
            found[path] = FileChange(old, new, "000000" if NULL_ID.match(new) else tail or mode)
            path = None
        elif line.startswith(("--- ", "+++ ", "@@", "GIT binary patch")):
            path = None  # a header without an index line (a mode change alone)
    return found


def commit_changes(repo: Repo, commits: Sequence[str]) -> dict[str, dict[str, FileChange]]:
    """The files each commit changes against its parent, by full blob id, in one
    ``diff-tree --stdin``; a commit that changes nothing is left out."""
    if not commits:
        return {}
    raw = ("diff-tree", "--stdin", "-r", "--raw", "--no-abbrev", "--no-renames")
    out = repo.git(*raw, input="\n".join(commits) + "\n").stdout
    changes: dict[str, dict[str, FileChange]] = {}
    current: dict[str, FileChange] | None = None
    for line in out.split("\n"):
        if line.startswith(":") and current is not None:
            meta, _, path = line.partition("\t")
            _old_mode, new_mode, old, new, _status = meta[1:].split(" ", 4)
            current[path] = FileChange(old, new, new_mode)
        elif line.strip():
            current = changes.setdefault(line.strip(), {})
    return changes


@dataclass(frozen=True)
class Entry:
    """A file of a tree: its mode (``100644``, ``100755``, ``120000``) and its blob id."""

    mode: str
    blob: str


def tree_entries(repo: Repo, commit: str, paths: Sequence[str]) -> dict[str, Entry]:
    """The files among ``paths`` that ``commit`` holds, by path (one ``ls-tree``)."""
    if not paths:
        return {}
    out = repo.git("ls-tree", "-r", "-z", "--full-tree", commit, "--", *paths).stdout
    found: dict[str, Entry] = {}
    for line in out.split("\0"):
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if path and len(parts) == 3 and parts[1] == "blob":
            found[path] = Entry(parts[0], parts[2])
    return found


@dataclass(frozen=True)
class Change:
    """One commit of a chain: its message, and each file it sets (an :class:`Entry`) or deletes (None)."""

    message: str
    files: Mapping[str, Entry | None]


def commit_chain(repo: Repo, parent: str, changes: Sequence[Change], *, date: str, scratch: Path) -> list[str]:
    """Commit ``changes`` one on top of the other from ``parent``, in one ``git fast-import``: the
    commits ``git commit -m`` would make (skippy's identity, ``date`` for author and committer, the
    message's whitespace cleaned up as git does), without a work tree or an index. Their ids, in
    order. ``scratch``: a folder of the caller's for the marks file."""
    if not changes:
        return []
    when = datetime.datetime.fromisoformat(date)
    offset = when.strftime("%z") or "+0000"
    stamp = f"{IDENTITY_NAME} <{IDENTITY_EMAIL}> {int(when.timestamp())} {offset}"
    ref = f"refs/skippy/chain-{uuid.uuid4().hex}"  # fast-import commits onto a ref: this one is removed after
    stream = ["feature done\n"]
    for mark, change in enumerate(changes, start=1):
        message = cleanup_message(change.message)
        stream += [
            f"commit {ref}\nmark :{mark}\nauthor {stamp}\ncommitter {stamp}\n",
            f"data {len(message.encode('utf-8'))}\n{message}\n",
        ]
        if mark == 1:
            stream.append(f"from {parent}\n")
        for path, entry in change.files.items():
            stream.append(f"D {_quoted(path)}\n" if entry is None else f"M {entry.mode} {entry.blob} {_quoted(path)}\n")
        stream.append("\n")
    stream.append("done\n")
    marks = scratch / f"marks-{uuid.uuid4().hex}"
    try:
        repo.git("fast-import", "--quiet", f"--export-marks={marks}", input="".join(stream), what="git fast-import")
        ids = dict(line.split(" ", 1) for line in marks.read_text(encoding="utf-8").splitlines() if line)
    finally:
        repo.git("update-ref", "-d", ref, check=False)
        marks.unlink(missing_ok=True)
    return [ids[f":{mark}"].strip() for mark in range(1, len(changes) + 1)]


def cleanup_message(message: str) -> str:
    """A commit message as ``git commit -m`` stores it (``--cleanup=whitespace``): trailing spaces
    gone, runs of empty lines made one, no empty line first or last, one newline at the end."""
    lines: list[str] = []
    for raw in message.split("\n"):
        line = raw.rstrip()
        if line or (lines and lines[-1]):
            lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def _quoted(path: str) -> str:
    """A path as fast-import reads it: C-style quoted when it starts with a quote or holds a newline."""
    if not path.startswith('"') and "\n" not in path and "\\" not in path:
        return path
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
