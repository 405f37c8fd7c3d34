"""fetch_once: the one made-once pattern of the CUDA wheels, the Vulkan headers and the ROCm root."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from skippy.compile.fetched import MARKER, fetch_once, read_marker
from skippy.core.errors import ToolchainMissing


def _done(home: Path, record: Mapping[str, Any]) -> str | None:
    return f"kit {record['version']}" if record.get("version") == "1.0" and (home / "made").is_file() else None


def _make(calls: list[Path]) -> Any:
    def make(folder: Path) -> Mapping[str, Any]:
        calls.append(folder)
        assert folder.name.startswith("kit.partial-") and folder.stat().st_mode & 0o777 == 0o755
        (folder / "made").write_text("x", encoding="utf-8")
        return {"version": "1.0"}

    return make


def test_made_in_a_folder_beside_marked_last_then_reused(tmp_path: Path) -> None:
    home = tmp_path / "cache" / "kit"
    calls: list[Path] = []
    assert fetch_once(home, done=_done, make=_make(calls), what="making the kit", timeout=5) == ("kit 1.0", True)
    assert read_marker(home) == {"version": "1.0"}
    assert json.loads((home / MARKER).read_text(encoding="utf-8"))["schema"] == 1
    assert not calls[0].exists(), "renamed into place"
    assert fetch_once(home, done=_done, make=_make(calls), what="making the kit", timeout=5) == ("kit 1.0", False)
    assert len(calls) == 1


def test_leftovers_are_removed_and_a_home_without_its_marker_is_never_used(tmp_path: Path) -> None:
    home = tmp_path / "kit"
    (home / "made").parent.mkdir(parents=True)
    (home / "made").write_text("half", encoding="utf-8")  # no marker: an interrupted run
    stale = tmp_path / "kit.partial-killed"
    stale.mkdir()
    removed: list[Path] = []

    def remove(folder: Path) -> None:
        removed.append(folder)
        shutil.rmtree(folder)

    calls: list[Path] = []
    kit, made = fetch_once(home, done=_done, make=_make(calls), what="making the kit", timeout=5, remove=remove)
    assert (kit, made) == ("kit 1.0", True)
    assert set(removed) == {home, stale}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kit", "kit.lock"]


def test_a_failed_check_touches_nothing_and_a_failed_make_leaves_no_empty_folder(tmp_path: Path) -> None:
    home = tmp_path / "kit"
    stale = tmp_path / "kit.partial-killed"
    stale.mkdir()

    def refuse() -> None:
        raise ToolchainMissing("no mmdebstrap", untouched="everything", next_step="apt-get install mmdebstrap")

    with pytest.raises(ToolchainMissing):
        fetch_once(home, done=_done, make=_make([]), what="making the kit", timeout=5, check=refuse)
    assert stale.is_dir(), "the check runs before anything is removed"

    def fail(_folder: Path) -> Mapping[str, Any]:
        raise ToolchainMissing("mirror down", untouched="everything", next_step="try again")

    with pytest.raises(ToolchainMissing):
        fetch_once(home, done=_done, make=fail, what="making the kit", timeout=5)
    assert not home.exists()
    assert not list(tmp_path.glob("kit.partial-*")), "the empty folder of a failed make is gone"
