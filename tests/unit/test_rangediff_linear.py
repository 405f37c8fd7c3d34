"""range_diff reads each patch once (issue 42) and pairs the queues as it did when it searched the old
queue again for every new patch (that search is kept here as the reference)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from skippy.maintain import rangediff
from skippy.maintain.rangediff import Entry, Item, change, classify
from skippy.queue.model import mail_subject
from tests.unit.test_parity_rangediff import mbox


def reference(old: Sequence[Item], new: Sequence[Item]) -> tuple[Entry, ...]:
    """The pairing as it was: every old subject parsed again for every new patch."""
    unmatched_old = list(old)
    pairs: dict[int, Item] = {}
    for index, item in enumerate(new):
        subject = mail_subject(item.data)
        candidates = [o for o in unmatched_old if mail_subject(o.data) == subject]
        candidates.sort(key=lambda o: (o.lane != item.lane, 0))
        if candidates:
            pairs[index] = candidates[0]
            unmatched_old.remove(candidates[0])
    for index, item in enumerate(new):
        if index in pairs:
            continue
        same = [o for o in unmatched_old if change(o.data) == change(item.data)]
        if same:
            pairs[index] = same[0]
            unmatched_old.remove(same[0])
    entries: list[Entry] = []
    for index, item in enumerate(new):
        subject = mail_subject(item.data)
        if index not in pairs:
            entries.append(Entry("new", subject, None, item.label))
            continue
        before = pairs[index]
        status, detail = classify(before.data, item.data)
        if before.lane != item.lane:
            detail = f"{detail}; was {before.label}" if detail else f"was {before.label}"
        entries.append(Entry(status, subject, before.label, item.label, detail))
    entries += [Entry("dropped", mail_subject(o.data), o.label, None) for o in unmatched_old]
    return tuple(entries)


def queue(rng: random.Random, size: int, tag: str) -> list[Item]:
    """Patches whose subjects, lanes and changes repeat, so that every rule of the pairing is used."""
    items = []
    for n in range(1, size + 1):
        subject = rng.choice(["a", "b", "c", "d"])
        hunk = rng.choice(["-x\n+y\n", "-x\n+z\n", "-q\n+r\n"])
        data = mbox(subject, hunk, body=rng.choice(["", "why"]), start=rng.choice([3, 9]))
        items.append(Item(rng.choice(["core", "model_support"]), f"{n:04d}-{tag}.patch", data))
    return items


@pytest.mark.parametrize("seed", range(40))
def test_the_pairing_is_the_reference_s(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test data, not a secret
    old, new = queue(rng, rng.randint(0, 12), "old"), queue(rng, rng.randint(0, 12), "new")
    assert rangediff.range_diff(old, new) == reference(old, new)


def test_each_subject_and_change_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    old = [Item("core", f"{n:04d}-o.patch", mbox(f"old {n}", f"-o{n}\n+p{n}\n")) for n in range(60)]
    new = [Item("core", f"{n:04d}-n.patch", mbox(f"new {n}", f"-n{n}\n+m{n}\n")) for n in range(60)]
    subjects: list[bytes] = []
    changes: list[bytes] = []

    def counted_subject(data: bytes) -> str:
        subjects.append(data)
        return mail_subject(data)

    def counted_change(data: bytes) -> tuple[tuple[str, tuple[str, ...]], ...]:
        changes.append(data)
        return change(data)

    monkeypatch.setattr(rangediff, "mail_subject", counted_subject)
    monkeypatch.setattr(rangediff, "change", counted_change)
    entries = rangediff.range_diff(old, new)
    assert rangediff.counts(entries)["new"] == 60 and rangediff.counts(entries)["dropped"] == 60
    # nothing pairs: every patch read once for its subject and once for its change (120 each, not 60 x 60)
    assert len(subjects) == len(changes) == 120
