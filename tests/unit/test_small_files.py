"""The one reader of the project's own files (issue "Hostile input, round 4", item 1): bounded
by the bytes read, not the size reported; a link out of the folder it must stay in is refused
before anything is opened; an excerpt quoted in a message is short and masks secrets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skippy.core.paths import NotSmallFile, is_link_loop, outside_why, read_small_bytes, read_small_text
from skippy.core.redact import excerpt


def test_a_proc_file_reporting_size_zero_is_still_read_with_a_bound() -> None:
    environ = Path("/proc/self/environ")
    assert environ.stat().st_size == 0
    with pytest.raises(NotSmallFile, match="holds more than it reports, over the 8-byte limit"):
        read_small_bytes(environ, 8)


def test_a_link_out_of_the_folder_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n", encoding="utf-8")
    secret.chmod(0o640)
    (project / "series").symlink_to(secret)
    (project / "environ").symlink_to("/proc/self/environ")
    for name, target in (("series", str(secret)), ("environ", os.path.realpath("/proc/self/environ"))):
        with pytest.raises(NotSmallFile) as info:
            read_small_bytes(project / name, 1024, inside=project)
        assert info.value.why == f"a symbolic link to {target}, outside the project ({project})"
        assert "s3cr3t" not in str(info.value)
    # a link that stays inside is read; a folder link leading out is named as such
    (project / "kept").write_text("ok\n", encoding="utf-8")
    (project / "inside").symlink_to("kept")
    assert read_small_text(project / "inside", 1024, inside=project) == "ok\n"
    (project / "out").symlink_to(tmp_path)
    assert outside_why(project / "out" / "secret", project) == (
        f"{secret} once its links are followed, outside the project ({project})"
    )


def test_a_link_loop_is_named_not_raised(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert is_link_loop(tmp_path / "a") and is_link_loop(tmp_path / "a" / "x")
    assert not is_link_loop(tmp_path / "missing")
    with pytest.raises(NotSmallFile, match="a symbolic link loop"):
        read_small_bytes(tmp_path / "a", 10, inside=tmp_path)


def test_an_excerpt_is_short_and_masks_secrets() -> None:
    assert excerpt("0001-a.patch") == "'0001-a.patch'"
    assert excerpt("x" * 200) == "'" + "x" * 48 + "...'"
    line = "PATH=/usr/bin\x00GITHUB_TOKEN=ghs_abc\x00AWS_SECRET_ACCESS_KEY=xyz"
    shown = excerpt(line, limit=200)
    assert "ghs_abc" not in shown and "xyz" not in shown
    assert shown == "'PATH=/usr/bin\\x00GITHUB_TOKEN=***\\x00AWS_SECRET_ACCESS_KEY=***'"
    assert excerpt("see https://user:tok@host/x") == "'see https://***@host/x'"
