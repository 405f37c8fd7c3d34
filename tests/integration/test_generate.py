"""The generated lane on fixture upstreams: deterministic patches, drift detection, unknown arches,
and `regenerate` regenerating it only when its inputs changed."""

from __future__ import annotations

import hashlib
import json

import pytest

from skippy.cli.entries import generate_main
from skippy.core.errors import QueueError
from skippy.core.ui import Console
from skippy.maintain import generate, genmanifest
from skippy.maintain.regenerate import regenerate
from skippy.queue.model import Lane, load_queue
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.integration.test_parity_fixtures import (
    ADD_HOOK_STEP,
    arch_upstream,
    chain_patches,
    queue_core,
    snapshot,
)

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)

SPEC = """\
schema = 2

[[family]]
name = "llama"
arch = "LLM_ARCH_LLAMA"

[[family]]
name = "gemma3"
arch = "LLM_ARCH_GEMMA3"
"""


def write_spec(project: Project, text: str = SPEC) -> None:
    folder = project.patches / "generated"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "families.toml").write_text(text, encoding="utf-8")


def test_generate_writes_one_patch_per_family_deterministically(project: Project) -> None:
    arch_upstream(project)
    write_spec(project)
    settings = project.settings()
    lane, _drift = generate.run_generate(settings, console=QUIET)
    folder = project.patches / "generated"
    assert (folder / "series").read_text() == "0001-family-llama.patch\n0002-family-gemma3.patch\n"
    queue = load_queue(settings.patch_dir)
    assert [p.name for p in queue.lane(Lane.GENERATED)] == ["0001-family-llama.patch", "0002-family-gemma3.patch"]
    gemma = (folder / "0002-family-gemma3.patch").read_text()
    # computed from the tree: the GGUF name from LLM_ARCH_NAMES, the class from llama_model_mapping,
    # the builder's file from src/models/, the hook placed after the layer's anchor by the parser
    assert 'Arch LLM_ARCH_GEMMA3 (GGUF name "gemma3"), model class llama_model_gemma3' in gemma
    assert "diff --git a/src/models/gemma3.cpp b/src/models/gemma3.cpp" in gemma
    assert '         cb(cur, "l_out", il);\n+        llama_skippy_layer_hook(this, cur, il);\n' in gemma
    assert "src/models/llama.cpp" not in gemma
    assert "Subject: [PATCH] generated: family gemma3" in gemma
    manifest = genmanifest.manifest_lines((folder / "inputs.sha256").read_text())
    assert manifest["pin"] == project.upstream.commits[-1]
    assert len(manifest["sha256"]) == 64
    assert manifest["generator builtin"] == genmanifest.GENERATOR_VERSION
    assert manifest["shard 0002-family-gemma3.patch"] == hashlib.sha256(gemma.encode()).hexdigest()
    first = snapshot(folder)
    assert set(lane.files) == {"0001-family-llama.patch", "0002-family-gemma3.patch", "series"}

    generate.run_generate(settings, console=QUIET)
    assert snapshot(folder) == first
    _lane, drift = generate.run_generate(settings, console=QUIET, check=True)
    assert drift.ok

    # the lane applies: prepare the whole queue
    report = prepare(settings, Target.pinned(), console=QUIET)
    for family in ("gemma3", "llama"):
        assert (project.workdir / f"src/models/{family}.cpp").read_text().count("llama_skippy_layer_hook(") == 1
    assert "llama_skippy_layer_hook" not in (project.workdir / "src/models/gpt2.cpp").read_text()
    assert report.queue_digest == load_queue(settings.patch_dir).digest


def test_check_names_the_families_that_drifted(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    arch_upstream(project)
    write_spec(project)
    settings = project.settings()
    generate.run_generate(settings, console=QUIET)
    folder = project.patches / "generated"
    # hand-edit one family's patch: only that family drifted
    path = folder / "0001-family-llama.patch"
    path.write_text(path.read_text().replace("generated: family llama", "generated: family llama (edited)"))
    before = snapshot(folder)
    with pytest.raises(QueueError) as info:
        generate.run_generate(settings, console=QUIET, check=True)
    assert "llama" in info.value.what and "gemma3" not in info.value.what
    assert snapshot(folder) == before  # --check writes nothing

    # a changed spec: a new family is missing from the lane, and the spec input changed
    write_spec(project, SPEC + '\n[[family]]\nname = "gpt2"\narch = "LLM_ARCH_GPT2"\n')
    code = generate_main(project.env, root=project.root, check=True, json=True)
    assert code == QueueError.exit_code
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert "gpt2" in data["what"] and "llama" in data["what"]
    assert "spec families.toml" in (data["details"] or "")

    assert generate_main(project.env, root=project.root) == 0
    assert generate_main(project.env, root=project.root, check=True) == 0


def test_core_lane_change_is_an_input_change(project: Project) -> None:
    base = arch_upstream(project)
    write_spec(project)
    settings = project.settings()
    generate.run_generate(settings, console=QUIET)
    queue_core(project, chain_patches(project, base, [ADD_HOOK_STEP]), ["core-add-a-hook-point"])
    with pytest.raises(QueueError) as info:
        generate.run_generate(settings, console=QUIET, check=True)
    assert "lanes core+model_support" in (info.value.details or "")


def test_unknown_arch_fails_clearly(project: Project) -> None:
    arch_upstream(project)
    write_spec(project, 'schema = 2\n[[family]]\nname = "gemma"\narch = "LLM_ARCH_GEMMA2"\n')
    with pytest.raises(QueueError) as info:
        generate.run_generate(project.settings(), console=QUIET)
    details = info.value.details or ""
    assert "LLM_ARCH_GEMMA2 is not in LLM_ARCH_NAMES" in details
    assert "closest: LLM_ARCH_GEMMA3" in details
    assert not (project.patches / "generated" / "series").exists()


def test_regenerate_keeps_the_lane_unless_its_inputs_changed(project: Project) -> None:
    from tests.integration.test_regenerate import lanes_v1

    arch_upstream(project)
    write_spec(project)
    lanes_v1(project)
    settings = project.settings()
    first = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert first.generated == "regenerated"
    folder = project.patches / "generated"
    lane = snapshot(folder)
    second = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert second.generated == "kept"
    assert snapshot(folder) == lane
    _lane, drift = generate.run_generate(settings, console=QUIET, check=True)
    assert drift.ok
    # a different core head changes the lanes' digest: the lane is regenerated
    third = regenerate(settings, core_head="core~1", model_support_head="core~1", console=QUIET)
    assert third.generated == "regenerated"
    assert genmanifest.manifest_lines((folder / "inputs.sha256").read_text()) != genmanifest.manifest_lines(
        lane["inputs.sha256"].decode()
    )
