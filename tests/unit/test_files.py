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
