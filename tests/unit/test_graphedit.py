"""The graph-code rewrite on small C++ snippets: builders in every shape, anchors, fallbacks, refusals."""

from __future__ import annotations

import pytest

from skippy.core.errors import GraphEditError
from skippy.maintain import cppparse, graphcode
from skippy.maintain import graphedit as ge

PATH = "src/models/toy.cpp"

PLAIN = b"""\
#include "models.h"

llama_model_toy::graph::graph(const llama_model & model, const llm_graph_params & params) : llm_graph_context(params) {
    ggml_tensor * cur;
    ggml_tensor * inpL = build_inp_embd(model.tok_embd);

    for (int il = 0; il < n_layer; ++il) {
        cur = build_norm(inpL, model.layers[il].attn_norm, NULL, LLM_NORM_RMS, il);
        cb(cur, "attn_norm", il);

        cur = build_cvec(cur, il);
        cb(cur, "l_out", il);

        // input for next layer
        inpL = cur;
    }

    cur = build_norm(cur, model.output_norm, NULL, LLM_NORM_RMS, -1);
}
"""

HOOKED_PLAIN = PLAIN.replace(
    b'        cb(cur, "l_out", il);\n',
    b'        cb(cur, "l_out", il);\n        llama_skippy_layer_hook(this, cur, il);\n',
)


def place(source: bytes, path: str = PATH) -> ge.FamilyEdit:
    return ge.place_layer_hooks(source, path=path)


def assert_idempotent(edit: ge.FamilyEdit) -> None:
    again = place(edit.source, edit.path)
    assert again.source == edit.source
    assert not again.changed
    assert all(p.done for p in again.placements)


def test_the_hook_follows_the_l_out_anchor() -> None:
    edit = place(PLAIN)
    assert edit.source == HOOKED_PLAIN
    assert edit.changed
    assert edit.builders == ("llama_model_toy::graph::graph",)
    (placement,) = edit.placements
    assert (placement.line, placement.how, placement.tensor) == (12, "anchor", "cur")
    assert_idempotent(edit)


def test_a_second_pass_changes_nothing() -> None:
    edit = place(HOOKED_PLAIN)
    assert edit.source == HOOKED_PLAIN
    assert not edit.changed


def test_a_template_builder_and_its_instantiations() -> None:
    source = b"template <bool iswa>\n" + PLAIN.split(b"\n", 1)[1].replace(
        b"llama_model_toy::graph::graph", b"llama_model_toy::graph<iswa>::graph"
    )
    source += b"\ntemplate struct llama_model_toy::graph<false>;\ntemplate struct llama_model_toy::graph<true>;\n"
    # tree-sitter-cpp reads the explicit instantiations with errors: outside the builder, harmless
    assert cppparse.error_count(source) > 0
    edit = place(source)
    assert edit.builders == ("llama_model_toy::graph<iswa>::graph",)
    assert b"        llama_skippy_layer_hook(this, cur, il);\n" in edit.source
    assert cppparse.error_count(edit.source) == cppparse.error_count(source)
    assert_idempotent(edit)


def test_explicit_specializations_are_builders_each() -> None:
    body = PLAIN.split(b"\n", 2)[2]
    source = (
        b"template <>\n"
        + body.replace(b"llama_model_toy::graph::graph", b"llama_model_toy::graph<true>::graph")
        + b"\ntemplate <>\n"
        + body.replace(b"llama_model_toy::graph::graph", b"llama_model_toy::graph<false>::graph")
    )
    edit = place(source)
    assert edit.builders == ("llama_model_toy::graph<true>::graph", "llama_model_toy::graph<false>::graph")
    assert [p.builder for p in edit.placements] == list(edit.builders)
    assert edit.source.count(b"llama_skippy_layer_hook(this, cur, il);") == 2
    assert_idempotent(edit)


def test_the_last_anchor_of_the_body_is_the_layer_output() -> None:
    source = PLAIN.replace(
        b'        cur = build_cvec(cur, il);\n        cb(cur, "l_out", il);\n',
        b'        cur = ggml_add(ctx0, cur, inpL);\n        cb(cur, "l_out", il);\n\n'
        b'        cur = build_cvec(cur, il);\n        cb(cur, "l_out", il);\n',
    )
    edit = place(source)
    (placement,) = edit.placements
    assert placement.line == 15
    assert edit.source.count(b"llama_skippy_layer_hook") == 1
    assert edit.source.index(b"llama_skippy_layer_hook") > edit.source.index(b"build_cvec")


def test_an_anchor_in_each_branch_of_an_if_else() -> None:
    source = PLAIN.replace(
        b'        cur = build_cvec(cur, il);\n        cb(cur, "l_out", il);\n',
        b"        if (hparams.use_par_res) {\n"
        b'            cur = ggml_add(ctx0, cur, inpL);\n            cb(cur, "l_out", il);\n'
        b"        } else {\n"
        b'            cur = build_cvec(cur, il);\n            cb(cur, "l_out", il);\n'
        b"        }\n",
    )
    edit = place(source)
    assert [p.line for p in edit.placements] == [13, 16]
    assert edit.source.count(b"            llama_skippy_layer_hook(this, cur, il);\n") == 2
    assert_idempotent(edit)


def test_an_anchor_inside_a_nested_block_without_an_else_is_ambiguous() -> None:
    source = PLAIN.replace(
        b'        cur = build_cvec(cur, il);\n        cb(cur, "l_out", il);\n',
        b'        if (il == n_layer - 1) {\n            cur = build_cvec(cur, il);\n            cb(cur, "l_out", il);\n'
        b"        }\n",
    )
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert info.value.path == PATH
    assert "line 11" in info.value.reason
    assert "if without an else" in info.value.reason
    assert PATH in info.value.render()


def test_an_anchor_in_a_braced_block_of_the_body() -> None:
    source = PLAIN.replace(
        b'        cur = build_cvec(cur, il);\n        cb(cur, "l_out", il);\n',
        b'        {\n            cur = build_cvec(cur, il);\n            cb(cur, "l_out", il);\n        }\n',
    )
    edit = place(source)
    assert b'            cb(cur, "l_out", il);\n            llama_skippy_layer_hook(this, cur, il);\n' in edit.source
    assert_idempotent(edit)


def test_no_anchor_falls_back_to_the_end_of_the_loop_body() -> None:
    source = PLAIN.replace(b'        cb(cur, "l_out", il);\n', b"")
    edit = place(source)
    (placement,) = edit.placements
    assert (placement.how, placement.tensor) == ("end of loop body", "inpL")
    assert b"        inpL = cur;\n        llama_skippy_layer_hook(this, inpL, il);\n    }\n" in edit.source
    assert_idempotent(edit)


def test_the_fallback_passes_over_trailing_callbacks() -> None:
    source = PLAIN.replace(b'        cb(cur, "l_out", il);\n', b"").replace(
        b"        inpL = cur;\n", b'        inpL = build_cvec(cur, il);\n        cb(inpL, "l_last", il);\n'
    )
    edit = place(source)
    assert b'        cb(inpL, "l_last", il);\n        llama_skippy_layer_hook(this, inpL, il);\n' in edit.source
    assert_idempotent(edit)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (b"        if (il == 0) { continue; }\n        inpL = cur;\n", "continue"),
        (b"        ggml_build_forward_expand(gf, cur);\n", "does not end by assigning"),
    ],
)
def test_no_anchor_and_no_unambiguous_end_is_an_error(change: bytes, reason: str) -> None:
    source = PLAIN.replace(b'        cb(cur, "l_out", il);\n', b"").replace(b"        inpL = cur;\n", change)
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert reason in info.value.reason
    assert "llama_model_toy::graph::graph, line" in info.value.reason


def test_two_loops_one_with_the_anchor() -> None:
    source = PLAIN.replace(
        b"    for (int il = 0; il < n_layer; ++il) {\n        cur = build_norm",
        b"    for (int il = 0; il < n_layer; ++il) {\n        inject_kv(il);\n    }\n\n"
        b"    for (int il = 0; il < n_layer; ++il) {\n        cur = build_norm",
    )
    edit = place(source)
    assert len(edit.placements) == 1
    assert [s.reason for s in edit.skipped] == ['the loop at line 7 has no "l_out" anchor']
    assert_idempotent(edit)


def test_two_loops_without_an_anchor_are_ambiguous() -> None:
    source = PLAIN.replace(b'        cb(cur, "l_out", il);\n', b"").replace(
        b"    for (int il = 0; il < n_layer; ++il) {\n        cur = build_norm",
        b"    for (int il = 0; il < n_layer; ++il) {\n        inpL = inject_kv(inpL, il);\n    }\n\n"
        b"    for (int il = 0; il < n_layer; ++il) {\n        cur = build_norm",
    )
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert info.value.reason == ('llama_model_toy::graph::graph has 2 layer loops (lines 7, 11) and no "l_out" anchor')


def test_loops_inside_lambdas_and_inner_loops_are_not_layer_loops() -> None:
    source = PLAIN.replace(
        b'        cb(cur, "attn_norm", il);\n',
        b'        cb(cur, "attn_norm", il);\n'
        b'        for (int e = 0; e < n_expert; ++e) { cb(cur, "l_out", il); }\n'
        b'        auto f = [&]() { for (int il = 0; il < 2; ++il) { cb(cur, "l_out", il); } };\n',
    )
    edit = place(source)
    (placement,) = edit.placements
    assert placement.line == 14  # the body's own anchor, not the inner loop's or the lambda's


def test_a_macro_heavy_file_with_errors_outside_the_builder() -> None:
    source = (
        b"#define LAYER_ATTRS(X) X(attn) X(ffn)\n"
        b"LAYER_ATTRS(DECLARE_TENSOR)\n"
        b"GGML_CALL_PREFIX static int helper( {{ oops\n"
        b"}\n" + PLAIN
    )
    assert cppparse.error_count(source) > 0
    edit = place(source)
    assert b"llama_skippy_layer_hook(this, cur, il);" in edit.source
    assert cppparse.error_count(edit.source) == cppparse.error_count(source)
    assert_idempotent(edit)


def test_a_builder_with_a_parse_error_is_refused() -> None:
    source = PLAIN.replace(b'        cb(cur, "attn_norm", il);\n', b'        cb(cur, "attn_norm", il) +* ;;(\n')
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert "parse error at line" in info.value.reason


def test_a_hook_elsewhere_in_the_loop_is_a_stale_edit() -> None:
    source = PLAIN.replace(
        b'        cb(cur, "attn_norm", il);\n',
        b'        cb(cur, "attn_norm", il);\n        llama_skippy_layer_hook(this, cur, il);\n',
    )
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert "stale edit" in info.value.reason


def test_a_file_without_the_family_builder() -> None:
    source = b'#include "models.h"\n\nvoid llama_model_toy::load_arch_hparams(llama_model_loader & ml) {}\n'
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert info.value.reason == "no graph builder llama_model_toy::graph::graph in the file"
    # another family's builder in the file is not this family's
    with pytest.raises(GraphEditError):
        ge.place_layer_hooks(PLAIN, path=PATH, family_class="llama_model_other")


def test_a_builder_without_a_layer_loop() -> None:
    source = b"llama_model_toy::graph::graph(const llm_graph_params & params) : llm_graph_context(params) {\n"
    source += b"    f();\n}\n"
    with pytest.raises(GraphEditError) as info:
        place(source)
    assert "no layer loop" in info.value.reason


def test_crlf_sources_keep_their_line_endings() -> None:
    source = PLAIN.replace(b"\n", b"\r\n")
    edit = place(source)
    assert edit.source == HOOKED_PLAIN.replace(b"\n", b"\r\n")


def test_family_classes_and_builders_by_name() -> None:
    assert graphcode.family_class_for("src/models/granite-moe.cpp") == "llama_model_granite_moe"
    assert graphcode.find_builders(PLAIN) == [("llama_model_toy", "llama_model_toy::graph::graph", 3)]


def test_families_sharing_a_builder_are_read_from_models_h() -> None:
    models_h = b"""\
struct llama_model_bert : public llama_model_base {
    struct graph : public llm_graph_context { graph(const llama_model & model, const llm_graph_params & params); };
};
struct llama_model_nomic_bert : public llama_model_base {
    using graph = llama_model_bert::graph;
};
struct llama_model_phimoe : public llama_model_base {
    template <bool iswa>
    using graph = llama_model_phi3::graph<iswa>;
};
struct llama_model_qwen3tts : public llama_model_qwen3vl {
    llama_model_qwen3tts(const struct llama_model_params & params) : llama_model_qwen3vl(params) {}
};
struct llama_model_qwen3vlx : public llama_model_qwen3vl {
    struct graph : public llm_graph_context { };
};
"""
    assert graphcode.shared_graphs(models_h) == {
        "llama_model_nomic_bert": "llama_model_bert",
        "llama_model_phimoe": "llama_model_phi3",
        "llama_model_qwen3tts": "llama_model_qwen3vl",
    }


def test_a_tree_is_classified_and_each_family_mapped_to_the_file_covering_it() -> None:
    models_h = (
        b"struct llama_model_toy_moe : public llama_model_base {\n    using graph = llama_model_toy::graph;\n};\n"
    )
    files = {
        "src/models/toy.cpp": PLAIN,
        "src/models/toy-moe.cpp": b"void llama_model_toy_moe::load_arch_hparams() {}\n",
        "src/models/base.cpp": b"llm_build_base::llm_build_base() {}\n",
        "src/models/odd.cpp": PLAIN.replace(b"llama_model_toy", b"llama_model_odd").replace(
            b"for (int il", b"for (int j"
        ),
    }
    done = ge.rewrite_tree(files, models_h)
    assert list(done.edits) == ["src/models/toy.cpp"]
    assert list(done.refused) == ["src/models/odd.cpp"]
    assert done.sharing == {"src/models/toy-moe.cpp": "llama_model_toy"}
    assert done.not_families == ("src/models/base.cpp",)
    assert done.covering("llama_model_toy") == "src/models/toy.cpp"
    assert done.covering("llama_model_toy_moe") == "src/models/toy.cpp"
    assert done.covering("llama_model_odd") is None
    assert done.covering("llama_model_absent") is None
