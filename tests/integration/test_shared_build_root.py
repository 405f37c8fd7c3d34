"""Two workdirs (LLAMA_WORKDIR) under one build root: each has its own build dirs, and
`invoke status` lists only the builds of its own workdir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skippy.cli.entries import status_main
from skippy.compile.plan import STAMP_NAME
from skippy.core.ui import Console
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project

pytestmark = pytest.mark.integration


def fake_build(build_root: Path, name: str, source_dir: Path, patched: str, when: int) -> Path:
    """A build dir as a build leaves it (stamp, llama-server), dated ``when``: status only reads these."""
    d = build_root / name
    (d / "bin").mkdir(parents=True)
    stamp = {"schema": 1, "backend": "cpu", "patched_sha": patched, "source_dir": str(source_dir)}
    (d / STAMP_NAME).write_text(json.dumps(stamp), encoding="utf-8")
    (d / "bin" / "llama-server").write_bytes(b"")
    for path in (d / STAMP_NAME, d / "bin" / "llama-server"):
        os.utime(path, (when, when))
    return d


def status(project: Project, capsys: pytest.CaptureFixture[str], **env: str) -> tuple[dict[str, object], str]:
    assert status_main({**project.env, **env}, root=project.root, json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert status_main({**project.env, **env}, root=project.root) == 0
    return report, capsys.readouterr().out


def test_status_lists_only_the_builds_of_its_own_workdir(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    other = queued_project.root / ".deps" / "other-llama.cpp"
    quiet = Console(quiet=True)
    mine = prepare(queued_project.settings(), Target.pinned(), console=quiet)
    theirs = prepare(queued_project.settings(LLAMA_WORKDIR=str(other)), Target.pinned(), console=quiet)
    build_root = queued_project.settings().build_root
    assert queued_project.settings(LLAMA_WORKDIR=str(other)).build_root == build_root
    own = fake_build(build_root, "cpu-1111111111", queued_project.workdir, mine.patched_sha, 1_000)
    # the other workdir built later: the newest cpu build under the shared root is not ours
    newer = fake_build(build_root, "cpu-2222222222", other, theirs.patched_sha, 2_000)

    report, text = status(queued_project, capsys)
    builds = report["builds"]
    assert isinstance(builds, dict)
    assert builds["cpu"]["build_dir"] == str(own)
    assert "cpu-1111111111" in text and "cpu-2222222222" not in text

    report, text = status(queued_project, capsys, LLAMA_WORKDIR=str(other))
    builds = report["builds"]
    assert isinstance(builds, dict)
    assert builds["cpu"]["build_dir"] == str(newer)
    assert "cpu-2222222222" in text and "cpu-1111111111" not in text

    # a third workdir with no build of its own lists none
    third = queued_project.root / ".deps" / "third"
    report, text = status(queued_project, capsys, LLAMA_WORKDIR=str(third))
    assert report["builds"] == {}
    assert "build cpu:" not in text
