"""Splitting a patch into its hunks (one file's header and one hunk a unit), and the diff options
of upstream's patch-ids against the queue's exports."""

from __future__ import annotations

from skippy.maintain.carried import LOG_DIFF_ARGS, LOG_DIFF_CONFIG, Carried, split_hunks
from skippy.maintain.replay import EXPORT_ARGS, EXPORT_CONFIG

MAIL = b"""\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: Downstream Dev <down@stream.invalid>
Date: Thu, 2 May 2024 10:00:00 +0200
Subject: [PATCH] core: two files

diff, at the start of a message line, is no file header.
---
 src/a.cpp | 4 ++--
 src/b.cpp | 2 +-
 2 files changed, 3 insertions(+), 3 deletions(-)

diff --git a/src/a.cpp b/src/a.cpp
index 1111111..2222222 100644
--- a/src/a.cpp
+++ b/src/a.cpp
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
@@ -10,3 +10,3 @@ int f()
 ten

--\x20
+-- changed
diff --git a/src/b.cpp b/src/b.cpp
index 3333333..4444444 100644
--- a/src/b.cpp
+++ b/src/b.cpp
@@ -5 +5 @@
-last
\\ No newline at end of file
+LAST
\\ No newline at end of file
--\x20
2.39.5

"""

A_HEADER = b"diff --git a/src/a.cpp b/src/a.cpp\nindex 1111111..2222222 100644\n--- a/src/a.cpp\n+++ b/src/a.cpp\n"


def test_each_hunk_is_a_patch_with_its_file_header() -> None:
    units = split_hunks(MAIL)
    assert [(u.path, u.textual) for u in units] == [("src/a.cpp", True), ("src/a.cpp", True), ("src/b.cpp", True)]
    assert units[0].text == A_HEADER + b"@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    # a removed line reading "- " (it looks like a mail signature) and an empty context line are
    # counted by the hunk header, not taken for the end of the patch
    assert units[1].text == A_HEADER + b"@@ -10,3 +10,3 @@ int f()\n ten\n\n-- \n+-- changed\n"
    # a header without counts is one line each side; the no-newline markers stay with the hunk,
    # the signature after it is left out
    assert units[2].text.endswith(
        b"@@ -5 +5 @@\n-last\n\\ No newline at end of file\n+LAST\n\\ No newline at end of file\n"
    )
    assert b"2.39.5" not in b"".join(u.text for u in units)


def test_parts_without_a_text_hunk_are_units_never_carried() -> None:
    patch = (
        b"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
        b"diff --git a/model.bin b/model.bin\nindex 5555555..6666666 100644\nGIT binary patch\nliteral 3\n"
        b"KcmZ?wWB>pF0RRCP\n\nliteral 0\nKcmV+b0RR6000031\n\n"
        b"diff --git a/empty.txt b/empty.txt\nnew file mode 100644\nindex 0000000..e69de29\n"
        b"diff --git a/c.txt b/c.txt\nnew file mode 100644\nindex 0000000..7777777\n--- /dev/null\n+++ b/c.txt\n"
        b"@@ -0,0 +1 @@\n+c\n"
    )
    units = split_hunks(patch)
    assert [(u.path, u.textual) for u in units] == [
        ("run.sh", False),
        ("model.bin", False),
        ("empty.txt", False),
        ("c.txt", True),
    ]
    assert units[1].text.startswith(b"diff --git a/model.bin") and b"literal 0" in units[1].text
    assert units[3].text.endswith(b"@@ -0,0 +1 @@\n+c\n")


def test_a_patch_without_a_diff_has_no_units() -> None:
    assert split_hunks(b"Subject: [PATCH] nothing\n\njust words\n") == ()


def test_describe_and_as_dict() -> None:
    from pathlib import Path

    found = Carried("core/0002-x.patch", Path("queue/0002-x.patch"), "applied", "1a2b3c4d5e6f7a8b", "arch: ten", 2, 2)
    assert (
        found.describe()
        == 'core/0002-x.patch: upstream 1a2b3c4d5e6f "arch: ten" carries its change (not as the same patch-id)'
    )
    unnamed = Carried("core/0003-y.patch", Path("queue/0003-y.patch"), "partly", None, None, 1, 3)
    assert unnamed.describe() == "core/0003-y.patch: the new upstream commit carries 1 of its 3 hunks"
    assert unnamed.as_dict() == {
        "patch": "core/0003-y.patch",
        "path": "queue/0003-y.patch",
        "how": "partly",
        "commit": None,
        "commit_subject": None,
        "hunks_carried": 1,
        "hunks": 3,
    }


def test_upstream_diffs_are_shaped_as_the_queue_exports() -> None:
    """Equal changes hash to equal patch-ids only when both sides are diffed alike."""
    assert set(LOG_DIFF_ARGS) <= set(EXPORT_ARGS)
    assert set(LOG_DIFF_CONFIG) <= set(EXPORT_CONFIG)
