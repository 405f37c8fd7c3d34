"""The range-diff classes (pure: patch bytes in, entries out)."""

from __future__ import annotations

from skippy.maintain import rangediff
from skippy.maintain.rangediff import Item


def mbox(subject: str, hunk: str, *, body: str = "", start: int = 3, index: str = "1111..2222") -> bytes:
    text = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Dev <dev@x>\nDate: Thu, 2 May 2024 10:00:00 +0200\n"
        f"Subject: [PATCH] {subject}\n\n"
        + (body + "\n" if body else "")
        + "---\n src/a.cpp | 2 +-\n 1 file changed\n\n"
        f"diff --git a/src/a.cpp b/src/a.cpp\nindex {index} 100644\n--- a/src/a.cpp\n+++ b/src/a.cpp\n"
        f"@@ -{start},3 +{start},3 @@\n ctx\n{hunk} ctx2\n"
    )
    return text.encode()


def test_classes() -> None:
    same = mbox("same", "-a\n+b\n")
    old = [
        Item("core", "0001-same.patch", same),
        Item("core", "0002-moved.patch", mbox("moved", "-c\n+d\n")),
        Item("core", "0003-edited.patch", mbox("edited", "-e\n+f\n")),
        Item("core", "0004-gone.patch", mbox("gone", "-g\n+h\n")),
        Item("core", "0005-reworded.patch", mbox("reworded", "-i\n+j\n", body="old words")),
    ]
    new = [
        Item("core", "0001-fresh.patch", mbox("fresh", "-x\n+y\n")),
        Item("core", "0002-same.patch", same),
        Item("core", "0003-moved.patch", mbox("moved", "-c\n+d\n", start=9, index="3333..4444")),
        Item("core", "0004-edited.patch", mbox("edited", "-e\n+F\n")),
        Item("model_support", "0001-reworded.patch", mbox("reworded", "-i\n+j\n", body="new words")),
    ]
    entries = rangediff.range_diff(old, new)
    assert [(e.subject, e.status) for e in entries] == [
        ("fresh", "new"),
        ("same", "unchanged"),
        ("moved", "context"),
        ("edited", "changed"),
        ("reworded", "changed"),
        ("gone", "dropped"),
    ]
    assert entries[3].detail == "diff changed"
    assert entries[4].detail == "message changed; was core/0005-reworded.patch"
    assert rangediff.counts(entries) == {"unchanged": 1, "context": 1, "changed": 2, "new": 1, "dropped": 1}
    assert "summary: 1 unchanged, 1 context, 2 changed, 1 new, 1 dropped" in rangediff.render(entries)


def test_a_renamed_subject_with_the_same_change_is_matched() -> None:
    old = [Item("core", "0001-a.patch", mbox("old subject", "-a\n+b\n"))]
    new = [Item("core", "0001-b.patch", mbox("new subject", "-a\n+b\n"))]
    (entry,) = rangediff.range_diff(old, new)
    assert (entry.status, entry.detail, entry.old) == ("changed", "message changed", "core/0001-a.patch")


def test_signature_lines_are_not_removed_lines() -> None:
    plain = mbox("s", "-a\n+b\n")
    signed = plain + b"-- \n2.39.5\n\n"
    assert rangediff.change(plain) == rangediff.change(signed)
