"""A range-diff of two queues, patch by patch (pure; no git).

Each patch of the old and the new queue is matched (by subject, then by an
identical change), and classified:

* ``unchanged``: the same bytes;
* ``context``: the same message and the same added/removed lines per file;
  only context, line numbers, index lines or the diffstat moved;
* ``changed``: the message or the change itself differs (``detail`` says which);
* ``new``: only in the new queue; ``dropped``: only in the old one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from skippy.queue.model import mail_subject

CLASSES = ("unchanged", "context", "changed", "new", "dropped")


@dataclass(frozen=True)
class Item:
    lane: str
    name: str
    data: bytes

    @property
    def label(self) -> str:
        return f"{self.lane}/{self.name}"


@dataclass(frozen=True)
class Entry:
    status: str
    subject: str
    old: str | None
    new: str | None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "subject": self.subject, "old": self.old, "new": self.new, "detail": self.detail}


def message(data: bytes) -> str:
    """Subject and body (up to the ``---`` line), without the mail headers."""
    text = data.decode("utf-8", errors="replace")
    _head, _, rest = text.partition("\n\n")
    body: list[str] = []
    for line in rest.split("\n"):
        if line == "---" or line.startswith("diff --git "):
            break
        body.append(line)
    return mail_subject(data) + "\n" + "\n".join(body).strip()


def change(data: bytes) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Per file (in order): the added and removed lines, without context, hunk headers or index lines."""
    text = data.decode("utf-8", errors="replace")
    files: list[tuple[str, list[str]]] = []
    in_hunk = False
    for line in text.split("\n"):
        if line == "-- ":
            break  # the signature: the diff is over
        if line.startswith("diff --git "):
            files.append((line, []))
            in_hunk = False
        elif not files:
            continue
        elif line.startswith("@@"):
            in_hunk = True
        elif (in_hunk and line.startswith(("+", "-"))) or line.startswith(
            ("new file mode", "deleted file mode", "old mode", "new mode", "Binary files", "GIT binary")
        ):
            files[-1][1].append(line)
    return tuple((name, tuple(lines)) for name, lines in files)


def classify(old: bytes, new: bytes) -> tuple[str, str]:
    if old == new:
        return "unchanged", ""
    same_message = message(old) == message(new)
    same_change = change(old) == change(new)
    if same_message and same_change:
        return "context", "only context, line numbers or index lines moved"
    what = [w for w, same in (("message", same_message), ("diff", same_change)) if not same]
    return "changed", " and ".join(what) + " changed"


def range_diff(old: Sequence[Item], new: Sequence[Item]) -> tuple[Entry, ...]:
    """One entry per patch, in the new queue's order, dropped patches last.

    A new patch is paired with the first unpaired old patch of the same subject (one of its own lane
    first), then the rest with the first unpaired old patch of the same change.  Each patch is read
    once, and the old ones are looked up by subject and change: linear in the queues' lengths."""
    old_subjects = [mail_subject(o.data) for o in old]
    new_subjects = [mail_subject(n.data) for n in new]
    pairs = _pairs(old, new, old_subjects, new_subjects)
    entries: list[Entry] = []
    for index, item in enumerate(new):
        subject = new_subjects[index]
        if index not in pairs:
            entries.append(Entry("new", subject, None, item.label))
            continue
        before = old[pairs[index]]
        status, detail = classify(before.data, item.data)
        if before.lane != item.lane:
            moved = f"was {before.label}"
            detail = f"{detail}; {moved}" if detail else moved
        entries.append(Entry(status, subject, before.label, item.label, detail))
    paired = set(pairs.values())
    for position, item in enumerate(old):
        if position not in paired:
            entries.append(Entry("dropped", old_subjects[position], item.label, None))
    return tuple(entries)


def _pairs(
    old: Sequence[Item], new: Sequence[Item], old_subjects: Sequence[str], new_subjects: Sequence[str]
) -> dict[int, int]:
    """new position -> old position of the patches paired (by subject, then by change)."""
    taken: set[int] = set()
    by_subject = _Index(((s,) for s in old_subjects), taken)
    by_subject_lane = _Index(((s, o.lane) for s, o in zip(old_subjects, old, strict=True)), taken)
    pairs: dict[int, int] = {}
    for index, item in enumerate(new):
        found = by_subject_lane.first((new_subjects[index], item.lane))
        if found is None:
            found = by_subject.first((new_subjects[index],))
        if found is not None:
            pairs[index] = found
            taken.add(found)
    if len(pairs) == len(new) or len(taken) == len(old):
        return pairs
    by_change = _Index(((change(o.data),) for o in old), taken)
    for index, item in enumerate(new):
        if index not in pairs:
            found = by_change.first((change(item.data),))
            if found is not None:
                pairs[index] = found
                taken.add(found)
    return pairs


class _Index:
    """The positions of the old patches by a key, in order; :meth:`first` skips the ones paired since."""

    def __init__(self, keys: Iterable[tuple[object, ...]], taken: set[int]) -> None:
        self._taken = taken
        self._queues: dict[tuple[object, ...], deque[int]] = {}
        for position, key in enumerate(keys):
            self._queues.setdefault(key, deque()).append(position)

    def first(self, key: tuple[object, ...]) -> int | None:
        queue = self._queues.get(key)
        while queue and queue[0] in self._taken:
            queue.popleft()
        return queue[0] if queue else None


def counts(entries: Sequence[Entry]) -> dict[str, int]:
    return {c: sum(1 for e in entries if e.status == c) for c in CLASSES}


def render(entries: Sequence[Entry]) -> str:
    if not entries:
        return "range-diff: both queues are empty"
    width = max(len(e.new or e.old or "") for e in entries)
    lines = ["range-diff (old queue -> new queue):"]
    for e in entries:
        shown = (e.new or e.old or "").ljust(width)
        lines.append(f"  {e.status:<9} {shown}  {e.subject}" + (f"  ({e.detail})" if e.detail else ""))
    summary = ", ".join(f"{n} {c}" for c, n in counts(entries).items() if n)
    lines.append(f"summary: {summary}")
    return "\n".join(lines)
