"""GitHub annotations: workflow-command escaping and the patch line a finding goes on."""

from __future__ import annotations

import pytest

from skippy.core.annotations import Annotation, patch_line

PATCH = b"""\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
Subject: [PATCH] core: two files

---
diff --git a/src/a.cpp b/src/a.cpp
index 1111111..2222222 100644
--- a/src/a.cpp
+++ b/src/a.cpp
@@ -10,6 +10,7 @@ void f() {
 a();
+b();
 c();
@@ -40,3 +41,4 @@ void g() {
 x();
+y();
diff --git a/src/b.cpp b/src/b.cpp
index 3333333..4444444 100644
--- a/src/b.cpp
+++ b/src/b.cpp
@@ -1,2 +1,3 @@
 z();
+w();
"""


def test_render_escapes_data_and_properties() -> None:
    a = Annotation("queue/patches/0001-a,b.patch", 7, "review: upstream", "50% done\nnext line")
    assert (
        a.render()
        == "::warning file=queue/patches/0001-a%2Cb.patch,line=7,title=review%3A upstream::50%25 done%0Anext line"
    )
    assert Annotation("f.patch", None, "t", "m", level="error").render() == "::error file=f.patch,title=t::m"
    with pytest.raises(ValueError, match="annotation level"):
        Annotation("f", 1, "t", "m", level="fatal")


@pytest.mark.parametrize(
    ("path", "first", "last", "line"),
    [
        ("src/a.cpp", 12, 12, 9),  # inside the first hunk (new lines 10..16)
        ("src/a.cpp", 41, 50, 13),  # overlaps the second (new lines 41..44)
        ("src/a.cpp", 30, 35, 5),  # between the hunks: the file's diff line
        ("src/a.cpp", None, None, 5),
        ("src/b.cpp", 2, 2, 20),  # the second file's only hunk, not the first file's
        ("src/c.cpp", 1, 1, None),  # not in the patch
    ],
)
def test_patch_line(path: str, first: int | None, last: int | None, line: int | None) -> None:
    assert patch_line(PATCH, path, first, last) == line
