"""The graph-parse bench section on a toy tree: both parsers' counts, the rewrite's figures, the summary."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import bench_graphparse as bg
from tests.unit.test_graphedit import PLAIN

OUTPUT_NORM = b"    cur = build_norm(cur, model.output_norm"
SECOND_LOOP = b"    for (int il = 0; il < 2; ++il) {\n        inpL = cur;\n    }\n"
TWO_LOOPS = (
    PLAIN.replace(b"llama_model_toy", b"llama_model_wav")
    .replace(b'        cb(cur, "l_out", il);\n', b"")
    .replace(OUTPUT_NORM, SECOND_LOOP + OUTPUT_NORM)
)
MODELS_H = b"struct llama_model_toy_moe : public llama_model_base {\n    using graph = llama_model_toy::graph;\n};\n"


def toy_tree(root: Path) -> Path:
    models = root / "src" / "models"
    models.mkdir(parents=True)
    (models / "toy.cpp").write_bytes(PLAIN)
    (models / "wav.cpp").write_bytes(TWO_LOOPS)
    (models / "toy-moe.cpp").write_bytes(b"void llama_model_toy_moe::load_arch_hparams() {}\n")
    (models / "models.h").write_bytes(MODELS_H)
    return root


def test_tree_sitter_counts_and_the_rewrite(tmp_path: Path) -> None:
    tree = toy_tree(tmp_path)
    files = bg.family_files(tree)
    assert [f.name for f in files] == ["toy-moe.cpp", "toy.cpp", "wav.cpp"]
    ts = bg.tree_sitter_figures(files, rounds=2)
    assert (ts["builders"], ts["anchors"], ts["files_with_errors"], ts["rounds"]) == (2, 1, 0, 2)
    rewrite = bg.rewrite_figures(tree, files)
    assert rewrite["families_placed"] == 1
    assert rewrite["hooks"] == 1
    assert list(rewrite["refused"]) == ["wav.cpp"]
    assert rewrite["sharing_another_builder"] == {"toy-moe.cpp": "llama_model_toy"}
    assert rewrite["idempotent"]
    line = bg.summary(len(files), ts, {"skipped": "not installed"}, rewrite)
    assert "hook placed in 1 families (1 hooks), 1 refused, 1 sharing another's builder" in line
    assert "second pass a no-op" in line


SELF_CONTAINED = b"""\
struct llm_graph_context {
    explicit llm_graph_context(int) {}
    void cb(int, const char *, int) {}
};
struct llama_model_toy {
    template <bool iswa> struct graph : llm_graph_context { explicit graph(int p); };
};
template <bool iswa>
llama_model_toy::graph<iswa>::graph(int p) : llm_graph_context(p) {
    int cur = 0;
    for (int il = 0; il < 2; ++il) {
        cb(cur, "l_out", il);
    }
}
template struct llama_model_toy::graph<false>;
"""


def test_libclang_counts_the_same_builders(tmp_path: Path) -> None:
    models = tmp_path / "src" / "models"
    models.mkdir(parents=True)
    (models / "toy.cpp").write_bytes(SELF_CONTAINED)
    (models / "broken.cpp").write_bytes(b"int f( {\n")
    files = bg.family_files(tmp_path)
    clang = bg.libclang_figures(tmp_path, files, {"PATH": os.environ.get("PATH", os.defpath)})
    assert (clang["builders"], clang["anchors"], clang["error_files"]) == (1, 1, ["broken.cpp"])
    assert all(str(tmp_path) not in a for a in clang["args"])
    ts = bg.tree_sitter_figures(files, rounds=1)
    assert (ts["builders"], ts["anchors"]) == (1, 1)


def test_the_figures_table_shows_the_section(tmp_path: Path) -> None:
    from tooling.docs.bench import render_bench

    tree = toy_tree(tmp_path)
    files = bg.family_files(tree)
    section = {
        "files": len(files),
        "tree_sitter": bg.tree_sitter_figures(files, rounds=1),
        "libclang": {"skipped": "not installed"},
        "rewrite": bg.rewrite_figures(tree, files),
    }
    table = render_bench({"machine": {"cpus": 2}, "graph_parse": section})
    assert "the 3 family files (`src/models/*.cpp`) parsed by tree-sitter-cpp vs libclang" in table
    assert "hook placed in 1 families (1 hooks), 1 refused, 1 sharing another's builder; second pass a no-op" in table
    assert "does not show yet" not in table
