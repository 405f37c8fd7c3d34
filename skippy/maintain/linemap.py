"""Who added each line of the files the queue touches: the hunks of a ``git diff -U0``, and the map of owners.

A line's owner is None for an upstream line, else the label of the queue patch that added it.
The map (:class:`LineMap`) follows the patches in order, carrying each file's owners through
the hunks of a patch (:func:`carry_owners`): what ``git blame <pin>..`` answers, without walking
the queue's history again for every patch.  The parity audit tells the queue's deletions of
upstream lines from its rewrites of its own lines with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from skippy.core.git import Repo
from skippy.maintain.replay import read_text


@dataclass(frozen=True)
class Hunk:
    file: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    removed: tuple[str, ...]
    new_file: bool = False
    deleted_file: bool = False
    #: the body, one character a line: "-" removed, "+" added, " " context
    ops: str = ""


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


#: the diff of one patch step: every hunk without context, no rename pairing, no external programs
STEP_DIFF = ("diff", "-U0", "--no-renames", "--no-ext-diff", "--no-color", "--no-textconv")


#: who added a line: None for upstream, else the label of the queue patch that added it
Owner = str | None


def parse_hunks(diff: str) -> tuple[list[Hunk], set[str]]:
    """Hunks of a ``git diff -U0`` (removed lines kept) and the files that have no text hunks."""
    hunks: list[Hunk] = []
    no_text: set[str] = set()
    file = ""
    marks: set[str] = set()  # "new", "deleted": the file's header says "new file mode" or "deleted file mode"
    current: dict[str, Any] | None = None
    left = [0, 0]  # old and new lines the current hunk has still to show
    seen_hunk: dict[str, bool] = {}

    def flush() -> None:
        nonlocal current
        if current is not None:
            hunks.append(Hunk(removed=tuple(current.pop("removed")), ops="".join(current.pop("ops")), **current))
            current = None

    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            flush()
            m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
            file = m.group(1) if m else line
            marks = set()
            seen_hunk[file] = False
        elif current is None and line.startswith(("new file mode", "deleted file mode")):
            marks.add(line.split(" ", 1)[0])
        elif current is None and line.startswith("+++ ") and line != "+++ /dev/null":
            file = line[len("+++ b/") :] if line.startswith("+++ b/") else file
        elif line.startswith("@@"):
            flush()
            m = _HUNK.match(line)
            if m is None:
                continue
            seen_hunk[file] = True
            current = {
                "file": file,
                "old_start": int(m.group(1)),
                "old_count": int(m.group(2)) if m.group(2) is not None else 1,
                "new_start": int(m.group(3)),
                "new_count": int(m.group(4)) if m.group(4) is not None else 1,
                "removed": [],
                "ops": [],
                "new_file": "new" in marks,
                "deleted_file": "deleted" in marks,
            }
            left = [current["old_count"], current["new_count"]]
        elif current is not None:
            _body_line(line, current, left)
    flush()
    no_text.update(f for f, seen in seen_hunk.items() if not seen)
    return hunks, no_text


def _body_line(line: str, current: dict[str, Any], left: list[int]) -> None:
    """One line of a hunk's body: every "-" line is a removed line; ``ops`` follows the body within the
    old and new lines the header announced (``left``, counted down): a "\\ No newline" line or the end
    of the diff is no line."""
    ops: list[str] = current["ops"]
    if line.startswith("-"):
        current["removed"].append(line[1:])
    if line.startswith("-") and left[0] > 0:
        ops.append("-")
        left[0] -= 1
    elif line.startswith("+") and left[1] > 0:
        ops.append("+")
        left[1] -= 1
    elif (line == "" or line.startswith(" ")) and left[0] > 0 and left[1] > 0:
        ops.append(" ")  # context, shown when diff.interHunkContext joins two hunks
        left[0] -= 1
        left[1] -= 1


def line_count(text: str | None) -> int:
    """The lines of a file as git counts them (a last line without a newline counts)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def carry_owners(owners: Sequence[Owner], hunks: Sequence[Hunk], label: str) -> list[Owner]:
    """The owners of a file's lines after ``hunks`` (one file's, in order, old side against ``owners``):
    removed lines drop out, added lines belong to ``label``, the others keep their owner.

    Raises ValueError when the hunks do not fit the file ``owners`` describes."""
    out: list[Owner] = []
    at = 0  # old lines consumed
    for h in hunks:
        before = h.old_start if h.old_count == 0 else h.old_start - 1  # old lines before the hunk's first
        ops = h.ops or "-" * h.old_count + "+" * h.new_count
        if before < at or before + h.old_count > len(owners) or ops.count("+") + ops.count(" ") != h.new_count:
            raise ValueError(
                f"{h.file}: hunk -{h.old_start},{h.old_count} +{h.new_start},{h.new_count} does not fit "
                f"a file of {len(owners)} line(s) after line {at}"
            )
        out += owners[at:before]
        at = before
        if len(out) != (h.new_start - 1 if h.new_count else h.new_start):
            raise ValueError(f"{h.file}: hunk +{h.new_start},{h.new_count} lands after line {len(out)}")
        for op in ops:
            if op == " ":
                out.append(owners[at])
                at += 1
            elif op == "-":
                at += 1
            else:
                out.append(label)
    return out + list(owners[at:])


class LineMap:
    """Who added each line of the files the queue touches, patch after patch: None for an upstream
    line, else the label of the patch that added it (what ``git blame <pin>..`` answers, without
    walking the queue's history again for every patch).

    The map follows the patches in order (:meth:`advance`); a file is read once, when a patch first
    touches it (all its lines are upstream's then)."""

    def __init__(self, repo: Repo) -> None:
        self._repo = repo
        self._files: dict[str, list[Owner]] = {}

    def owners(self, commit: str, path: str) -> list[Owner]:
        """The owner of each line of ``path`` in ``commit``, the commit the map has reached (index 0: line 1)."""
        known = self._files.get(path)
        if known is None:
            known = [None] * line_count(read_text(self._repo, commit, path))
            self._files[path] = known
        return known

    def prime(self, path: str, text: str | None) -> None:
        """``path`` as upstream left it, when the map has not met it yet: its text, read by the caller
        (with other files' in one git process) rather than by :meth:`owners`."""
        if path not in self._files:
            self._files[path] = [None] * line_count(text)

    def advance(self, prev: str, commit: str, hunks: Sequence[Hunk], no_text: Iterable[str], *, label: str) -> None:
        """Move the map from ``prev`` to ``commit`` (the step of patch ``label``), given the hunks of
        ``git diff -U0 --no-renames prev commit`` and the files of that diff without text hunks."""
        by_file: dict[str, list[Hunk]] = {}
        for hunk in hunks:
            by_file.setdefault(hunk.file, []).append(hunk)
        binary = sorted(no_text)
        if binary:  # git blame reads every file as text: so does the map (empty and mode-only changes add nothing)
            extra, _ = parse_hunks(self._repo.git(*STEP_DIFF, "--text", prev, commit, "--", *binary).stdout)
            for hunk in extra:
                by_file.setdefault(hunk.file, []).append(hunk)
        added = {p for p, hs in by_file.items() if any(h.new_file for h in hs)}
        gone = {p for p, hs in by_file.items() if any(h.deleted_file for h in hs)} - added
        carried: dict[str, list[Owner]] = {}
        for path, file_hunks in by_file.items():
            if path in gone:
                continue
            if path not in added:
                carried[path] = carry_owners(self.owners(prev, path), file_hunks, label)
                continue
            # a new file (or a new kind of file after the old one's deletion), or the file another
            # one was renamed to: git blame follows a file to a deleted one it looks like
            followed = self._followed(prev, commit, path, label) if gone else None
            carried[path] = (
                followed if followed is not None else carry_owners([], [h for h in file_hunks if h.new_file], label)
            )
        for path in gone:
            self._files.pop(path, None)
        self._files.update(carried)

    def _followed(self, prev: str, commit: str, path: str, label: str) -> list[Owner] | None:
        """The owners of ``path``, new in ``commit``, carried from the file of ``prev`` it was renamed
        from (found as git blame finds it: ``--follow``, rename detection for this path alone); None
        when it is no rename."""
        diff = self._repo.git(
            "diff",
            "-U0",
            "-M",
            "--follow",
            "--text",
            "--no-ext-diff",
            "--no-color",
            "--no-textconv",
            prev,
            commit,
            "--",
            path,
        ).stdout
        source = next(
            (line[len("rename from ") :] for line in diff.split("\n") if line.startswith("rename from ")), None
        )
        if source is None:
            return None
        hunks, _ = parse_hunks(diff)
        return carry_owners(self.owners(prev, source), [h for h in hunks if h.file == path], label)
