"""`invoke status` says when the workdir moved on since the newest build it shows (issue 43,
item 7): an old `--workdir-as-is` build is not the workdir as it stands once HEAD moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skippy.cli.entries import status_main
from skippy.compile.plan import STAMP_NAME
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.integration.test_change_loop import QUIET, run_git

pytestmark = pytest.mark.integration


def built(project: Project, name: str, patched_sha: str, mode: str) -> Path:
    """A build dir of the CPU backend with its stamp and llama-server, as a build leaves it."""
    d = project.settings().build_root / name
    (d / "bin").mkdir(parents=True)
    stamp = {"backend": "cpu", "patched_sha": patched_sha, "mode": mode, "source_dir": str(project.workdir)}
    (d / STAMP_NAME).write_text(json.dumps(stamp))
    (d / "bin" / "llama-server").write_bytes(b"")
    return d


def status(project: Project, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, object]]:
    assert status_main(project.env, root=project.root) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("build cpu:"))
    assert status_main(project.env, root=project.root, json=True) == 0
    return line, json.loads(capsys.readouterr().out)["builds"]["cpu"]


def test_a_workdir_as_is_build_of_an_older_head_says_head_moved(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    head = run_git(wdir, "rev-parse", "HEAD").strip()
    built(queued_project, "cpu-1-local-aaaaaaaaaaaa", head, "local")
    line, data = status(queued_project, capsys)
    assert "as it stood at HEAD" in line and "moved" not in line and data["moved_on"] is None

    (wdir / "src" / "provenance.h").write_text("#define SKIPPY 2\n")
    run_git(wdir, "commit", "-q", "-a", "-m", "core: provenance 2")
    now = run_git(wdir, "rev-parse", "HEAD").strip()
    line, data = status(queued_project, capsys)
    said = f"HEAD has moved since (now {now[:12]}): this is not the workdir as it stands"
    assert f"as it stood at HEAD {head[:12]} (--workdir-as-is)" in line and said in line
    assert "`nox -s build-cpu -- --workdir-as-is` builds that" in line
    assert str(data["moved_on"]).startswith(said)


def test_a_build_of_an_earlier_prepare_says_so(queued_project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    settings = queued_project.settings()
    first = prepare(settings, Target.pinned(), console=QUIET).patched_sha
    built(queued_project, "cpu-1", first, "prepared")
    assert "prepared again" not in status(queued_project, capsys)[0]
    # the queue changes: the next prepare gives another patched commit
    base = queued_project.upstream.commits[1]
    queued_project.add_patch("core", "0003-core-c.patch", queued_project.patch(base, "core: c", {"src/c.h": "c\n"}))
    again = prepare(settings, Target.pinned(), console=QUIET).patched_sha
    assert again != first
    line, _ = status(queued_project, capsys)
    assert f"the workdir was prepared again since (patched now {again[:12]}): `nox -s build-cpu` builds it" in line
