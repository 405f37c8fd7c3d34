"""Cache entries made once: reused when done, made under the lock otherwise, a held lock named."""

from __future__ import annotations

from pathlib import Path

import filelock
import pytest

from skippy.core.errors import ToolchainMissing
from skippy.core.files import made_once


def test_made_once_reuses_makes_under_the_lock_and_names_a_held_lock(tmp_path: Path) -> None:
    home = tmp_path / "cache" / "kit"
    made: list[str] = []

    def make() -> str:
        made.append("made")
        home.mkdir(parents=True)
        return "fresh"

    def done() -> str | None:
        return "reused" if home.is_dir() else None

    assert made_once(home, done=done, make=make, what="making the kit", timeout=5) == "fresh"
    assert made_once(home, done=done, make=make, what="making the kit", timeout=5) == "reused"
    assert made == ["made"]
    other = tmp_path / "cache" / "other"
    # the lock held through another open of its file, as another process would hold it
    with filelock.FileLock(str(other) + ".lock"), pytest.raises(ToolchainMissing) as info:
        made_once(other, done=lambda: None, make=lambda: "x", what="making the kit", timeout=0.1)
    assert info.value.what == f"another process is making the kit (lock {other}.lock)"
    assert not other.exists(), "nothing was made"


def test_an_atomic_write_replaces_a_symlink_and_never_writes_through(tmp_path: Path) -> None:
    from skippy.core.files import write_bytes_atomic, write_text_atomic

    target = tmp_path / "elsewhere.txt"
    target.write_text("theirs\n", encoding="utf-8")
    target.chmod(0o600)
    link = tmp_path / "lane" / "inputs.sha256"
    link.parent.mkdir()
    link.symlink_to(target)
    write_text_atomic(link, "ours\n")
    assert not link.is_symlink() and link.read_text(encoding="utf-8") == "ours\n"
    assert target.read_text(encoding="utf-8") == "theirs\n"
    assert link.stat().st_mode & 0o777 != 0o600, "the link's target's mode is not taken"
    dangling = tmp_path / "lane" / "series"
    dangling.symlink_to(tmp_path / "nowhere")
    write_bytes_atomic(dangling, b"x\n")
    assert not dangling.is_symlink() and dangling.read_bytes() == b"x\n"
    assert not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in link.parent.iterdir()) == ["inputs.sha256", "series"]
