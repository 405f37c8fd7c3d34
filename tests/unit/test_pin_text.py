"""The pin file rewrite keeps everything but the SHA (pure)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from skippy.flows.pinbump.pinfile import pin_text, write_pin_atomic

OLD, NEW = "a" * 40, "b" * 40


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (f"{OLD}\n", f"{NEW}\n"),
        (f"# pinned upstream\n\n{OLD}\n# note\n", f"# pinned upstream\n\n{NEW}\n# note\n"),
        (f"# crlf\r\n  {OLD}  \r\n", f"# crlf\r\n  {NEW}\r\n"),
        (f"{OLD}", f"{NEW}"),
        ("# only a comment", f"# only a comment\n{NEW}\n"),
        ("", f"{NEW}\n"),
    ],
)
def test_pin_text_replaces_only_the_sha_line(old: str, new: str) -> None:
    assert pin_text(old, NEW) == new


def test_write_keeps_the_mode_and_a_new_file_gets_the_umask_default(tmp_path: Path) -> None:
    pin = tmp_path / "upstream.txt"
    pin.write_text(f"# keep me\n{OLD}\n", encoding="utf-8")
    pin.chmod(0o644)
    write_pin_atomic(pin, NEW)
    assert pin.read_text(encoding="utf-8") == f"# keep me\n{NEW}\n"
    assert stat.S_IMODE(pin.stat().st_mode) == 0o644
    fresh = tmp_path / "new-pin.txt"
    mask = os.umask(0o027)
    try:
        write_pin_atomic(fresh, NEW)
    finally:
        os.umask(mask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new-pin.txt", "upstream.txt"]
