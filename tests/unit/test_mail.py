"""The Skippy-Patch trailer: tag and untag are inverse on format-patch text, in every shape."""

from __future__ import annotations

import pytest

from skippy.queue.mail import label_of, tag, untag

HEAD = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: A <a@b>\nDate: x\n"
DIFF = b"---\n f | 1 +\n\ndiff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+x\n-- \n2.39\n"


def mail(subject: bytes, body: bytes) -> bytes:
    return HEAD + b"Subject: [PATCH] " + subject + b"\n\n" + body + DIFF


CASES = {
    "no body": mail(b"s", b""),
    "one paragraph": mail(b"s", b"A body line.\n"),
    "two paragraphs": mail(b"s", b"First.\n\nSecond, longer\nparagraph.\n"),
    "ends with trailers": mail(b"s", b"Body.\n\nSigned-off-by: A <a@b>\nCo-authored-by: C <c@d>\n"),
    "only trailer-like": mail(b"s", b"Fixes: #12\n"),
    "crlf": mail(b"s", b"Body.\n").replace(b"\n", b"\r\n"),
    "latin-1 body": mail(b"s", b"caf\xe9 au lait\n"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_untag_undoes_tag_byte_for_byte(name: str) -> None:
    original = CASES[name]
    tagged = tag(original, "core/0001-x.patch")
    assert tagged != original
    assert b"Skippy-Patch: core/0001-x.patch" in tagged
    assert untag(tagged) == original


def test_trailer_is_the_last_message_line_and_joins_a_trailer_block() -> None:
    tagged = tag(CASES["ends with trailers"], "model_support/0001-y.patch")
    message = tagged.split(b"\n---\n")[0]
    assert message.endswith(b"Co-authored-by: C <c@d>\nSkippy-Patch: model_support/0001-y.patch")
    alone = tag(CASES["one paragraph"], "core/0002-z.patch").split(b"\n---\n")[0]
    assert alone.endswith(b"A body line.\n\nSkippy-Patch: core/0002-z.patch")


def test_untag_leaves_a_patch_without_trailer_alone_and_only_touches_the_message() -> None:
    diff_mentions = mail(b"s", b"Body.\n").replace(b"+x\n", b"+Skippy-Patch: core/9.patch\n")
    assert untag(diff_mentions) == diff_mentions
    assert untag(b"not a mail at all") == b"not a mail at all"


def test_label_of_reads_the_last_trailer() -> None:
    assert label_of("subject\n\nbody\n\nSkippy-Patch: core/0001-a.patch\n") == "core/0001-a.patch"
    assert label_of("subject\n\nno trailer here\n") is None


def test_the_restore_command_names_only_the_saved_files() -> None:
    from skippy.queue.recover import restore_command

    assert restore_command("wd", "refs/skippy/backups/x", ["a.c", "b/c.h"]) == (
        "git -C wd checkout refs/skippy/backups/x -- a.c b/c.h"
    )
    many = restore_command("wd", "refs/skippy/backups/x", [f"f{i}" for i in range(30)])
    assert "diff --name-only refs/skippy/backups/x^ refs/skippy/backups/x" in many and " -- ." not in many


def test_a_new_commit_joins_the_lane_before_it_and_never_the_generated_one() -> None:
    from skippy.maintain.history import lane_of_new
    from skippy.queue.model import Lane

    assert lane_of_new(None) is Lane.CORE
    assert lane_of_new(Lane.CORE) is Lane.CORE
    assert lane_of_new(Lane.MODEL_SUPPORT) is Lane.MODEL_SUPPORT
    assert lane_of_new(Lane.GENERATED) is Lane.MODEL_SUPPORT
