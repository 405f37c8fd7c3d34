"""The generated lane at scale on the real pinned tree: every family with a graph builder in src/models/.

A copy of this project (pyproject, tasks, queue; the upstream is the pinned source archive,
offline) is prepared; the at-scale spec (one family per graph-builder file,
:func:`benchmarks.bench_generate.all_families`) is written into the copy's lane.  With every
family, ``invoke generate`` refuses the two the rewrite cannot place, naming each file and the
reason, and leaves the lane as it was; without them it writes one shard per family,
``invoke generate --check`` is clean, the whole queue applies (``invoke prepare``), and each
shard's file in the prepared tree holds the hook once per placement.  Nothing is built.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_generate import all_families, copy_env, project_copy, refused_families
from skippy.core.errors import QueueError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import generate, genfiles, genspec, graphcode, graphedit
from skippy.queue.prepare import Target, prepare

ROOT = Path(__file__).resolve().parents[2]
#: the families of the pinned tree the rewrite refuses: (file, the reason's words)
REFUSED = {
    "eagle3": ("src/models/eagle3.cpp", "no layer loop to place the hook in"),
    "wavtokenizer-dec": ("src/models/wavtokenizer-dec.cpp", 'has 2 layer loops (lines 130, 218) and no "l_out" anchor'),
}
#: the files of the pinned tree's src/models/ holding a family graph builder
BUILDER_FILES = 126
CALL = (graphedit.HOOK + "(").encode()


def invoke(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "invoke", *args]
    return subprocess.run(argv, cwd=root, env=copy_env(os.environ), capture_output=True, text=True, check=False)


def builder_files(tree: Path) -> set[str]:
    """The files of ``tree``'s src/models/ defining a graph builder of their own family (counted
    here with the parser's finder, apart from the spec writer)."""
    return {
        f"src/models/{path.name}"
        for path in (tree / "src" / "models").glob("*.cpp")
        if any(
            cls == graphcode.family_class_for(path.name) for cls, _n, _l in graphcode.find_builders(path.read_bytes())
        )
    }


def lane_snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.timeout(600)
def test_every_family_of_the_pinned_tree_is_generated_applied_and_checked(tmp_path: Path, pinned_sdist: Path) -> None:
    env = copy_env(os.environ)
    root = project_copy(Settings.load(ROOT, env), tmp_path / "project", cache_dir=ROOT / ".deps" / "cache")
    settings = Settings.load(root, env)
    quiet = Console(env={}, stream=io.StringIO())
    prepare(settings, Target.pinned(), console=quiet, offline=True, interactive=False)
    tree = settings.workdir
    files = builder_files(tree)
    assert len(files) == BUILDER_FILES  # the tree is the real one
    scale = all_families(tree)
    assert {f.file for f in scale.families} == files
    lane = settings.patch_dir / "generated"
    spec = lane / genspec.SPEC_NAME

    # every family: the two the rewrite cannot place are refused, each with its file and reason
    spec.write_text(scale.spec(), encoding="utf-8")
    before = lane_snapshot(lane)
    with pytest.raises(QueueError) as info:
        generate.run_generate(settings, console=quiet, offline=True)
    assert "cannot place the layer hook for 2 family(ies)" in info.value.what
    refused = refused_families(info.value.details or "")
    assert set(refused) == set(REFUSED), info.value.details
    for name, (file, reason) in REFUSED.items():
        assert refused[name][0] == file
        assert reason in refused[name][1]
    assert lane_snapshot(lane) == before, "a refusal leaves the lane as it was"

    # without them: one shard per family, idempotent (checked inside generate), --check clean
    spec.write_text(scale.spec(leave_out=REFUSED), encoding="utf-8")
    made, _drift = generate.run_generate(settings, console=quiet, offline=True)
    series = (lane / genfiles.SERIES_NAME).read_text(encoding="utf-8").split()
    assert len(series) == len(files) - len(REFUSED) == len(made.owners)
    assert sorted(f for shard in made.shard_files.values() for f in shard) == sorted(
        files - {f for f, _ in REFUSED.values()}
    )
    assert all(len(shard) == 1 for shard in made.shard_files.values())
    check = invoke(root, "generate", "--check", "--offline", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["drift"]["ok"]

    # the whole queue applies, and each shard's file holds the hook once per placement
    applied = invoke(root, "prepare", "--offline", "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    hooks = 0
    for name in series:
        (file,) = made.shard_files[made.owners[name]]
        patch = (lane / name).read_bytes()
        added = sum(1 for line in patch.splitlines() if line.startswith(b"+") and CALL in line)
        source = (tree / file).read_bytes()
        again = graphedit.place_layer_hooks(source, path=file, family_class=graphcode.family_class_for(file))
        assert not again.changed, file
        assert source.count(CALL) == added == len(again.placements) >= 1, file
        hooks += added
    print(f"\n{len(series)} shards, {hooks} hooks placed; refused: {refused}")
