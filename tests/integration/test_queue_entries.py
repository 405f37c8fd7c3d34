"""An unknown entry in the patch dir stops `invoke prepare` before anything is touched (no patch is
skipped in silence), and a series entry linking out of its lane is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skippy.core.errors import QueueError
from skippy.core.ui import Console
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)


def state(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refs(path: Path) -> str:
    return git(
        path, "for-each-ref", "--format=%(objectname) %(refname)", env=hermetic_git_env(Path(os.environ["HOME"]))
    )


@pytest.mark.parametrize(
    ("move", "shown"),
    [
        ("model-support", "[core] model-support: unknown folder"),
        ("0003-core-extra.diff", "[core] 0003-core-extra.diff: unknown file"),
    ],
)
def test_prepare_refuses_a_misnamed_lane_or_a_diff_file(queued_project: Project, move: str, shown: str) -> None:
    settings = queued_project.settings()
    first = prepare(settings, Target.pinned(), console=QUIET)
    patches = queued_project.patches
    if move == "model-support":
        (patches / "model_support").rename(patches / move)
    else:
        (patches / move).write_bytes((patches / "0002-core-add-provenance.patch").read_bytes())
    before_queue, before_work = state(patches), state(queued_project.workdir)
    before_refs = refs(queued_project.workdir)
    with pytest.raises(QueueError) as info:
        prepare(settings, Target.pinned(), console=QUIET)
    error = info.value
    assert shown + ": it belongs to no lane and would be ignored" in (error.details or "")
    assert "nothing was applied" in (error.untouched or "")
    assert state(patches) == before_queue
    assert state(queued_project.workdir) == before_work
    assert refs(queued_project.workdir) == before_refs
    assert git(queued_project.workdir, "rev-parse", "HEAD", env=hermetic_git_env(Path(os.environ["HOME"]))).strip() == (
        first.patched_sha
    )


def test_prepare_refuses_a_series_entry_linking_out_of_its_lane(queued_project: Project, tmp_path: Path) -> None:
    settings = queued_project.settings()
    lane = queued_project.patches / "model_support"
    name = "0001-gemma3-runtime-adaptation.patch"
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    (lane / name).rename(outside)
    (lane / name).symlink_to(outside)
    with pytest.raises(QueueError) as info:
        prepare(settings, Target.pinned(), console=QUIET)
    assert f"model_support/series:1: {name} is a symlink to {outside}, outside model_support/" in (
        info.value.details or ""
    )
    assert not queued_project.workdir.exists()  # refused before the clone
