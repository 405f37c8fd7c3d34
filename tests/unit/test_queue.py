"""Queue validation: every violation names the lane, the file, the line and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.core.errors import QueueError
from skippy.queue.model import Lane, load_queue

PATCH = (
    b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    b"From: Dev <dev@example.invalid>\n"
    b"Date: Thu, 2 May 2024 10:00:00 +0200\n"
    b"Subject: [PATCH] %s\n\n---\n"
    b"diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
)


def patch(subject: str = "change") -> bytes:
    return PATCH % subject.encode()


def write(root: Path, rel: str, data: bytes | str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def problems(root: Path) -> str:
    before = snapshot(root)
    with pytest.raises(QueueError) as info:
        load_queue(root)
    assert snapshot(root) == before, "validation must not change the queue"
    assert info.value.untouched and "nothing was applied" in info.value.untouched
    assert info.value.details is not None
    return info.value.details


def test_valid_queue_orders_lanes_and_series(tmp_path: Path) -> None:
    write(tmp_path, "0002-second.patch", patch("second"))
    write(tmp_path, "0001-first.patch", patch("first"))
    write(tmp_path, "model_support/0001-gemma.patch", patch("gemma"))
    write(tmp_path, "model_support/0002-qwen.patch", patch("qwen"))
    write(tmp_path, "model_support/series", "# comment\r\n0001-gemma.patch  \r\n\r\n0002-qwen.patch\r\n")
    write(tmp_path, "generated/0001-family-llama.patch", patch("llama"))
    write(tmp_path, "generated/series", "0001-family-llama.patch\n")
    write(tmp_path, "README.md", "not a patch\n")
    queue = load_queue(tmp_path)
    assert [p.label for p in queue.patches] == [
        "core/0001-first.patch",
        "core/0002-second.patch",
        "model_support/0001-gemma.patch",
        "model_support/0002-qwen.patch",
        "generated/0001-family-llama.patch",
    ]
    assert queue.lane(Lane.CORE)[0].subject == "first"
    assert len(queue.digest) == 64


def test_digest_depends_on_bytes_names_and_order(tmp_path: Path) -> None:
    write(tmp_path, "0001-a.patch", patch("a"))
    write(tmp_path, "0002-b.patch", patch("b"))
    first = load_queue(tmp_path).digest
    assert load_queue(tmp_path).digest == first
    write(tmp_path, "0002-b.patch", patch("b2"))
    changed = load_queue(tmp_path).digest
    assert changed != first
    (tmp_path / "0002-b.patch").rename(tmp_path / "0002-c.patch")
    assert load_queue(tmp_path).digest != changed


def test_empty_queue_is_valid(tmp_path: Path) -> None:
    queue = load_queue(tmp_path)
    assert queue.patches == ()


def test_core_gap_and_duplicate_numbers(tmp_path: Path) -> None:
    write(tmp_path, "0001-a.patch", patch())
    write(tmp_path, "0003-c.patch", patch())
    details = problems(tmp_path)
    assert "[core] 0003-c.patch: 0003-c.patch is number 0003 but position 2 expects 0002" in details
    (tmp_path / "0003-c.patch").rename(tmp_path / "0001-dup.patch")
    details = problems(tmp_path)
    assert "number 0001 is also used by" in details


def test_core_bad_name(tmp_path: Path) -> None:
    write(tmp_path, "fix-things.patch", patch())
    details = problems(tmp_path)
    assert "[core] fix-things.patch: core patch names must look like NNNN-subject.patch" in details
    assert "fix: rename it" in details


def test_not_a_mailbox_patch(tmp_path: Path) -> None:
    write(tmp_path, "0001-plain-diff.patch", b"diff --git a/f b/f\n--- a/f\n+++ b/f\n")
    details = problems(tmp_path)
    assert "[core] 0001-plain-diff.patch:1: not a mailbox patch: header block lacks From: and Subject:" in details
    assert "git format-patch" in details


def test_headers_without_diff(tmp_path: Path) -> None:
    write(tmp_path, "0001-empty.patch", b"From: a <a@b>\nSubject: [PATCH] x\n\nbody only\n")
    assert "has headers but no `diff --git` section" in problems(tmp_path)


def test_lane_without_series(tmp_path: Path) -> None:
    write(tmp_path, "model_support/0001-gemma.patch", patch())
    details = problems(tmp_path)
    assert "[model_support] model_support/series: missing, but the folder holds 1 patch file(s)" in details


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("../0001-escape.patch", "is not a plain file name in generated/"),
        ("/etc/0001-abs.patch", "is not a plain file name in generated/"),
        ("sub/0001-nested.patch", "is not a plain file name in generated/"),
        ("..", "is not a plain file name in generated/"),
        ("-p1 0001-a.patch", "carries options or spaces"),
    ],
)
def test_series_entries_must_be_plain_names(tmp_path: Path, entry: str, message: str) -> None:
    write(tmp_path, "generated/0001-a.patch", patch())
    write(tmp_path, "generated/series", f"0001-a.patch\n{entry}\n")
    details = problems(tmp_path)
    assert f"[generated] generated/series:2: entry {entry!r} {message}" in details


def test_series_duplicates_missing_unlisted_and_order(tmp_path: Path) -> None:
    write(tmp_path, "model_support/0001-a.patch", patch())
    write(tmp_path, "model_support/0002-b.patch", patch())
    write(tmp_path, "model_support/0003-stray.patch", patch())
    write(tmp_path, "model_support/series", "0002-b.patch\n0001-a.patch\n0001-a.patch\n0004-gone.patch\n")
    details = problems(tmp_path)
    assert "model_support/series:3: 0001-a.patch is listed again (first on line 2)" in details
    assert "model_support/series:4: 0004-gone.patch does not exist in model_support/" in details
    assert "[model_support] model_support/0003-stray.patch: is not listed in series" in details
    assert "model_support/series:1: 0002-b.patch is number 0002 but position 1 expects 0001" in details


def test_all_violations_are_reported_at_once(tmp_path: Path) -> None:
    write(tmp_path, "bad.patch", patch())
    write(tmp_path, "generated/0001-x.patch", b"garbage\n")
    write(tmp_path, "generated/series", "0001-x.patch\n")
    details = problems(tmp_path)
    assert "[core] bad.patch" in details
    assert "[generated] generated/0001-x.patch:1: not a mailbox patch" in details


def test_missing_patch_dir(tmp_path: Path) -> None:
    with pytest.raises(QueueError, match="does not exist"):
        load_queue(tmp_path / "nope")


@pytest.mark.parametrize(
    ("rel", "shown", "fix"),
    [
        (
            "model-support/0001-gemma.patch",
            "[core] model-support: unknown folder",
            "git mv model-support model_support",
        ),
        ("Generated/0001-x.patch", "[core] Generated: unknown folder", "git mv Generated generated"),
        ("0002-extra.diff", "[core] 0002-extra.diff: unknown file", "NNNN-subject.patch"),
        ("notes/x.txt", "[core] notes: unknown folder", "move it out of the patch dir"),
        ("model_support/0002-b.diff", "[model_support] model_support/0002-b.diff: unknown file", "only its series"),
        ("generated/old/0001-x.patch", "[generated] generated/old: unknown folder", "only its series"),
        ("model_support/families.toml", "[model_support] model_support/families.toml: unknown file", "only"),
    ],
)
def test_unknown_entries_are_named_not_ignored(tmp_path: Path, rel: str, shown: str, fix: str) -> None:
    write(tmp_path, "0001-core.patch", patch())
    write(tmp_path, "model_support/0001-a.patch", patch())
    write(tmp_path, "model_support/series", "0001-a.patch\n")
    load_queue(tmp_path)  # valid before the stray entry
    write(tmp_path, rel, patch())
    details = problems(tmp_path)
    assert shown + ": it belongs to no lane and would be ignored" in details
    assert fix in details


def test_known_files_beside_the_lanes_are_accepted(tmp_path: Path) -> None:
    write(tmp_path, "0001-core.patch", patch())
    write(tmp_path, "parity-allowlist.toml", "# nothing dropped\n")
    write(tmp_path, "audit-allowlist.toml", "# a configured allowlist name\n")
    write(tmp_path, ".gitattributes", "*.patch -text\n")
    write(tmp_path, "generated/0001-family-x.patch", patch())
    write(tmp_path, "generated/series", "0001-family-x.patch\n")
    write(tmp_path, "generated/families.toml", "schema = 1\n")
    write(tmp_path, "generated/inputs.sha256", "x\n")
    write(tmp_path, "model_support/.gitkeep", "")
    queue = load_queue(tmp_path)
    assert [p.label for p in queue.patches] == ["core/0001-core.patch", "generated/0001-family-x.patch"]


def test_series_entry_linking_out_of_its_lane_is_refused(tmp_path: Path) -> None:
    outside = write(tmp_path / "elsewhere", "0001-a.patch", patch("from elsewhere"))
    write(tmp_path, "queue/model_support/0002-b.patch", patch())
    (tmp_path / "queue" / "model_support" / "0001-a.patch").symlink_to(outside)
    write(tmp_path, "queue/model_support/series", "0001-a.patch\n0002-b.patch\n")
    before = snapshot(tmp_path / "queue")
    with pytest.raises(QueueError) as info:
        load_queue(tmp_path / "queue")
    details = info.value.details or ""
    assert (
        f"[model_support] model_support/series:1: 0001-a.patch is a symlink to {outside}, outside model_support/"
        in details
    )
    assert "copy the patch into model_support/" in details
    assert snapshot(tmp_path / "queue") == before
    assert outside.read_bytes() == patch("from elsewhere")
    # a core patch linking out is refused the same way
    (tmp_path / "queue" / "model_support" / "0001-a.patch").unlink()
    (tmp_path / "queue" / "model_support" / "0001-a.patch").write_bytes(patch())
    (tmp_path / "queue" / "0001-core.patch").symlink_to(outside)
    with pytest.raises(QueueError, match="invalid") as info:
        load_queue(tmp_path / "queue")
    assert "[core] 0001-core.patch: is a symlink to" in (info.value.details or "")


def test_links_inside_the_lane_and_a_linked_patch_dir_are_fine(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write(real, "generated/0001-a.patch", patch("a"))
    (real / "generated" / "0002-b.patch").symlink_to("0001-a.patch")
    write(real, "generated/series", "0001-a.patch\n0002-b.patch\n")
    (tmp_path / "linked").symlink_to(real)
    queue = load_queue(tmp_path / "linked")
    assert [p.name for p in queue.patches] == ["0001-a.patch", "0002-b.patch"]
