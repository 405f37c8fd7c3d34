"""The generate-all bench section's pieces on toy inputs: the at-scale spec of a tree, the refusal's
families, a project copy's settings, the hook count of a prepared tree, and the figures' rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_generate as bg
from skippy.core.settings import Settings
from skippy.maintain import genspec
from tests.unit.test_graphedit import HOOKED_PLAIN, PLAIN

ARCH_CPP = """\
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_CLIP,      "clip"       },
    { LLM_ARCH_TOY,       "toy"        },
    { LLM_ARCH_TOY_EMBED, "toy-embed"  },
    { LLM_ARCH_TOY2,      "toy2"       },
    { LLM_ARCH_TOY_MOE,   "toy_moe"    },
    { LLM_ARCH_QWEN25,    "Qwen2.5-VL" },
    { LLM_ARCH_UNKNOWN,   "(unknown)"  },
};
"""
#: TOY2 creates the toy class too (after TOY: the file's family is TOY); TOY_MOE shares toy's builder
#: through models.h; CLIP has no builder; the orphan file's class is created by no arch
MODEL_CPP = """\
static llama_model * llama_model_mapping(llm_arch arch, const llama_model_params & params) {
    switch (arch) {
        case LLM_ARCH_CLIP:
            return new llama_model_clip(params);
        case LLM_ARCH_TOY:
            return new llama_model_toy(params);
        case LLM_ARCH_QWEN25:
            return new llama_model_qwen25(params);
        case LLM_ARCH_TOY_MOE:
            return new llama_model_toy_moe(params);
        case LLM_ARCH_TOY2:
            return new llama_model_toy(params);
        default:
            return nullptr;
    }
}
"""
MODELS_H = "struct llama_model_toy_moe : public llama_model_base {\n    using graph = llama_model_toy::graph;\n};\n"


def toy_tree(root: Path) -> Path:
    models = root / "src" / "models"
    models.mkdir(parents=True)
    (root / "src" / "llama-arch.cpp").write_text(ARCH_CPP, encoding="utf-8")
    (root / "src" / "llama-model.cpp").write_text(MODEL_CPP, encoding="utf-8")
    (models / "models.h").write_text(MODELS_H, encoding="utf-8")
    (models / "toy.cpp").write_bytes(PLAIN)
    (models / "qwen25.cpp").write_bytes(PLAIN.replace(b"llama_model_toy", b"llama_model_qwen25"))
    (models / "orphan.cpp").write_bytes(PLAIN.replace(b"llama_model_toy", b"llama_model_orphan"))
    (models / "clip.cpp").write_bytes(b"// a quantize stub\n")
    return root


def test_one_family_per_builder_file_and_every_arch_accounted_for(tmp_path: Path) -> None:
    scale = bg.all_families(toy_tree(tmp_path))
    assert scale.families == (
        bg.AtScaleFamily("qwen2-5-vl", "LLM_ARCH_QWEN25", "src/models/qwen25.cpp"),
        bg.AtScaleFamily("toy", "LLM_ARCH_TOY", "src/models/toy.cpp"),
    )
    assert scale.builder_files == ("src/models/orphan.cpp", "src/models/qwen25.cpp", "src/models/toy.cpp")
    assert scale.no_arch == ("src/models/orphan.cpp",)
    assert scale.no_builder == ("LLM_ARCH_CLIP",)
    assert dict(scale.sharing) == {"LLM_ARCH_TOY_MOE": "src/models/toy.cpp", "LLM_ARCH_TOY2": "src/models/toy.cpp"}
    assert scale.mapped == ("LLM_ARCH_CLIP", "LLM_ARCH_TOY", "LLM_ARCH_QWEN25", "LLM_ARCH_TOY_MOE", "LLM_ARCH_TOY2")
    assert scale.covered_archs() == ["LLM_ARCH_TOY", "LLM_ARCH_QWEN25", "LLM_ARCH_TOY_MOE", "LLM_ARCH_TOY2"]
    assert scale.covered_archs(leave_out={"toy"}) == ["LLM_ARCH_QWEN25"]


def test_the_spec_is_one_the_generator_reads(tmp_path: Path) -> None:
    scale = bg.all_families(toy_tree(tmp_path))
    spec = genspec.parse_spec(Path("families.toml"), scale.spec().encode())
    assert [(f.name, f.arch, f.paths) for f in spec.families] == [
        ("qwen2-5-vl", "LLM_ARCH_QWEN25", ()),
        ("toy", "LLM_ARCH_TOY", ()),
    ]
    fewer = genspec.parse_spec(Path("families.toml"), bg.all_families_spec(tmp_path, leave_out={"toy"}).encode())
    assert [f.name for f in fewer.families] == ["qwen2-5-vl"]
    with pytest.raises(ValueError, match="no family named toy3"):
        scale.spec(leave_out={"toy3"})


@pytest.mark.parametrize(
    ("gguf", "name"),
    [("gemma3", "gemma3"), ("ernie4_5-moe", "ernie4_5-moe"), ("Qwen2.5 VL", "qwen2-5-vl"), ("(unknown)", "unknown")],
)
def test_family_names_match_the_spec_pattern(gguf: str, name: str) -> None:
    assert bg.family_name(gguf) == name
    assert bg.family_name("...") == "family"


def test_the_refusal_names_each_family_file_and_reason() -> None:
    details = (
        "family eagle3: src/models/eagle3.cpp: no layer loop to place the hook in (x: no layer loop)\n"
        "family wavtokenizer-dec: src/models/wavtokenizer-dec.cpp: y has 2 layer loops (lines 130, 218)\n"
        "family phi9: llama_model_mapping in src/llama-model.cpp creates no class for LLM_ARCH_PHI9\n"
    )
    assert bg.refused_families(details) == {
        "eagle3": ("src/models/eagle3.cpp", "no layer loop to place the hook in (x: no layer loop)"),
        "wavtokenizer-dec": ("src/models/wavtokenizer-dec.cpp", "y has 2 layer loops (lines 130, 218)"),
    }


def fake_project(root: Path) -> Settings:
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[project]\nname = "p"\n\n[tool.skippy]\npin_file = "ll/upstream.txt"\npatch_dir = "ll/patches"\n'
        'workdir = ".deps/llama.cpp"\n\n[tool.other]\nworkdir = "untouched"\n',
        encoding="utf-8",
    )
    (root / "tasks.py").write_text("# tasks\n", encoding="utf-8")
    (root / "ll" / "patches" / "generated").mkdir(parents=True)
    (root / "ll" / "patches" / "generated" / "families.toml").write_text("schema = 2\n", encoding="utf-8")
    (root / "ll" / "upstream.txt").write_text("a" * 40 + "\n", encoding="utf-8")
    return Settings.load(root, {})


def test_a_project_copy_has_its_own_queue_and_workdir(tmp_path: Path) -> None:
    original = fake_project(tmp_path / "orig")
    (tmp_path / "copy" / "stale").mkdir(parents=True)
    root = bg.project_copy(
        original, tmp_path / "copy", upstream_url="file:///up.git", pin="b" * 40, cache_dir=tmp_path / "cache"
    )
    copied = Settings.load(root, {})
    assert copied.patch_dir == root / "queue" / "patches"
    assert copied.pin_file.read_text(encoding="utf-8") == "b" * 40 + "\n"
    assert copied.workdir == root / "work" / "llama.cpp"
    assert (copied.upstream_url, copied.compat_link, copied.cache_dir) == ("file:///up.git", None, tmp_path / "cache")
    assert (copied.patch_dir / "generated" / "families.toml").read_text(encoding="utf-8") == "schema = 2\n"
    assert (root / "tasks.py").is_file() and not (root / "stale").exists()
    assert 'workdir = "untouched"' in (root / "pyproject.toml").read_text(encoding="utf-8")
    # the original is as it was
    assert Settings.load(original.root, {}).patch_dir == original.root / "ll" / "patches"
    # no pin given: the project's own
    again = Settings.load(bg.project_copy(original, tmp_path / "copy2"), {})
    assert again.pin_file.read_text(encoding="utf-8") == "a" * 40 + "\n"
    assert again.upstream_url == original.upstream_url


def test_the_hooks_of_a_prepared_tree_are_counted_against_the_shards(tmp_path: Path) -> None:
    lane, work = tmp_path / "lane", tmp_path / "work"
    (work / "src" / "models").mkdir(parents=True)
    lane.mkdir()
    (work / "src" / "models" / "toy.cpp").write_bytes(HOOKED_PLAIN)
    patch = "diff --git a/src/models/toy.cpp b/src/models/toy.cpp\n+        llama_skippy_layer_hook(this, cur, il);\n"
    (lane / "0001-family-toy.patch").write_text(patch, encoding="utf-8")
    (lane / "series").write_text("0001-family-toy.patch\n", encoding="utf-8")
    counted = bg.hooks_in_tree(work, lane)
    assert counted == {
        "hooks_added": 1,
        "hooks_in_tree": 1,
        "shards_off": [],
        "second_pass_on_applied_tree_changed": [],
    }
    # a tree without the hook: the shard is off, and a second pass over the file would change it
    (work / "src" / "models" / "toy.cpp").write_bytes(PLAIN)
    counted = bg.hooks_in_tree(work, lane)
    assert counted["shards_off"] == ["0001-family-toy.patch: adds 1, the tree holds 0"]
    assert counted["second_pass_on_applied_tree_changed"] == ["src/models/toy.cpp"]


def section(build: dict[str, Any] | None = None) -> dict[str, Any]:
    timing = {"median_s": 11.8, "min_s": 11.0, "max_s": 12.0, "samples_s": [11.8]}
    return {
        "refusal": {
            "families": {"eagle3": {"file": "src/models/eagle3.cpp", "reason": "no layer loop"}},
            "met": True,
            "lane_untouched": True,
        },
        "generate": {
            "seconds": 13.9,
            "check_seconds": 13.6,
            "shards": 124,
            "families_covered": 124,
            "families_with_builders": 126,
            "archs_covered": 140,
            "archs_mapped": 143,
            "second_pass": "no change",
            "rerun_same_bytes": True,
            "check_clean": True,
        },
        "apply": {
            "patches": 130,
            "skippy_cold_prepare": timing,
            "raw_clone_checkout_am": timing,
            "raw_am_only": {**timing, "median_s": 1.5},
            "ratio": 1.0,
            "same_tree_as_raw": True,
            "hooks_added": 126,
            "hooks_in_tree": 126,
            "shards_off": [],
            "second_pass_on_applied_tree_changed": [],
        },
        "build": build or {"skipped": "--no-builds: the build figures were not run"},
    }


def test_the_figures_table_and_the_summary_show_the_section() -> None:
    from tooling.docs.bench import render_bench

    build = {
        "target": "llama",
        "skippy": {"seconds": 40.0, "compiled": 200, "cache_hits": 76, "cache_misses": 124},
        "raw": {"seconds": 300.0, "compiled": 200},
    }
    table = render_bench({"machine": {"cpus": 2}, "generate_all": section(build)})
    assert "13.9 s; 124 shards / 126 files (140 of 143 archs); refused with file and reason: eagle3" in table
    assert "second pass no change, a rerun writes the same bytes; `--check` clean (13.6 s)" in table
    assert "1.0x (median 11.8 s vs 11.8 s; `git am` alone 1.5 s); same tree: yes; 126 hooks in the tree" in table
    assert "40.0 s (200 compiles; 76 hits, 124 misses) vs 300.0 s (200 compiles)" in table
    assert "**missed**" not in table and "does not show yet" not in table
    line = bg.summary(section())
    assert line.startswith("generate-all: 124 shards for 124 of 126 builder files (140 of 143 archs) in 13.9 s")
    assert "refused: eagle3 (src/models/eagle3.cpp: no layer loop)" in line
    assert line.endswith("--no-builds: the build figures were not run")
    drifted = section()
    drifted["generate"]["check_clean"] = False
    assert "**missed**" in render_bench({"generate_all": drifted})
