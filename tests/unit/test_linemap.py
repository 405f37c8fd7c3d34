"""The parity audit's line map, pure parts: hunk bodies read from a diff, owners carried through them."""

from __future__ import annotations

import pytest

from skippy.maintain.linemap import Hunk, carry_owners, line_count, parse_hunks


def hunk(old_start: int, old_count: int, new_start: int, new_count: int, ops: str = "") -> Hunk:
    return Hunk("src/m.cpp", old_start, old_count, new_start, new_count, removed=(), ops=ops)


def test_line_count_is_git_s() -> None:
    assert [line_count(t) for t in (None, "", "a", "a\n", "a\nb", "a\r\nb\n", "a\fb\rc\n")] == [0, 0, 1, 1, 2, 2, 1]


def test_removed_lines_drop_out_added_lines_get_the_patch_and_the_rest_keep_their_owner() -> None:
    owners = [None, "core/0001-a.patch", None, None, "core/0001-a.patch"]
    hunks = [
        hunk(0, 0, 1, 1),  # a line inserted before line 1
        hunk(2, 1, 3, 2),  # line 2 (0001's) replaced by two lines
        hunk(4, 0, 7, 1),  # a line inserted after line 4
        hunk(5, 1, 7, 0),  # the last line deleted
    ]
    assert carry_owners(owners, hunks, "core/0002-b.patch") == [
        "core/0002-b.patch",
        None,
        "core/0002-b.patch",
        "core/0002-b.patch",
        None,
        None,
        "core/0002-b.patch",
    ]


def test_context_lines_inside_a_hunk_keep_their_owner() -> None:
    # diff.interHunkContext joins two changes around an unchanged line into one hunk
    owners = ["up1", "core/0001-a.patch", "up3"]
    joined = hunk(1, 3, 1, 3, ops="-+ -+")
    assert carry_owners(owners, [joined], "P") == ["P", "core/0001-a.patch", "P"]


def test_a_new_file_and_a_deleted_file() -> None:
    assert carry_owners([], [hunk(0, 0, 1, 3)], "P") == ["P", "P", "P"]
    assert carry_owners([None, "Q"], [hunk(1, 2, 0, 0)], "P") == []


def test_hunks_that_do_not_fit_the_map_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit a file of 2 line"):
        carry_owners([None, None], [hunk(2, 2, 2, 0)], "P")  # removes a line the file does not have
    with pytest.raises(ValueError, match="lands after line 2"):
        carry_owners([None] * 5, [hunk(3, 1, 7, 1)], "P")  # the new side is not where the old side says
    with pytest.raises(ValueError, match="does not fit"):
        carry_owners([None] * 5, [hunk(4, 1, 4, 1), hunk(2, 1, 2, 1)], "P")  # out of order


def test_parse_hunks_reads_the_body_and_deleted_files() -> None:
    diff = (
        "diff --git a/src/m.cpp b/src/m.cpp\nindex 1..2 100644\n--- a/src/m.cpp\n+++ b/src/m.cpp\n"
        "@@ -3,2 +3 @@ fn\n-a\n-b\n+c\n"
        "@@ -9,4 +8,4 @@\n-d\n+e\n ctx\n\n-f\n+g\n"  # joined by interHunkContext; a blank context line bare
        "@@ -20 +19 @@\n-last\n\\ No newline at end of file\n+last\n"
        "diff --git a/gone.h b/gone.h\ndeleted file mode 100644\nindex 3..0\n--- a/gone.h\n+++ /dev/null\n"
        "@@ -1,2 +0,0 @@\n-x\n-y\n"
    )
    hunks, no_text = parse_hunks(diff)
    assert [(h.file, h.ops, h.removed, h.deleted_file) for h in hunks] == [
        ("src/m.cpp", "--+", ("a", "b"), False),
        ("src/m.cpp", "-+  -+", ("d", "f"), False),
        ("src/m.cpp", "-+", ("last",), False),
        ("gone.h", "--", ("x", "y"), True),
    ]
    assert no_text == set()
