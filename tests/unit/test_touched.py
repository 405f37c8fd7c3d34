"""Which model families a change touches, on a small llama.cpp-shaped tree held in memory: a class
edit, a shared builder, a shared graph base, an inherited member, arch cases added, dropped or
changed, and the changes that touch no family (shared files, whitespace)."""

from __future__ import annotations

from collections.abc import Mapping

from skippy.maintain import touched as tc

ARCH = """\
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,        "llama"        },
    { LLM_ARCH_LLAMA_EMBED,  "llama-embed"  },
    { LLM_ARCH_QWEN2,        "qwen2"        },
    { LLM_ARCH_BERT,         "bert"         },
    { LLM_ARCH_JINA_BERT_V2, "jina-bert-v2" },
    { LLM_ARCH_MAMBA,        "mamba"        },
    { LLM_ARCH_MAMBA2,       "mamba2"       },
    { LLM_ARCH_DEEPSEEK2,    "deepseek2"    },
    { LLM_ARCH_MISTRAL4,     "mistral4"     },
    { LLM_ARCH_CLIP,         "clip"         },
    { LLM_ARCH_UNKNOWN,      "(unknown)"    },
};
"""

MODEL = """\
#include "models/models.h"

static llama_model * llama_model_mapping(llm_arch arch, const llama_model_params & params) {
    switch (arch) {
        case LLM_ARCH_CLIP:
            return new llama_model_clip(params);
        case LLM_ARCH_LLAMA:
            return new llama_model_llama(params);
        case LLM_ARCH_LLAMA_EMBED:
            return new llama_model_llama_embed(params);
        case LLM_ARCH_QWEN2:
            return new llama_model_qwen2(params);
        case LLM_ARCH_BERT:
            return new llama_model_bert(params);
        case LLM_ARCH_JINA_BERT_V2:
            return new llama_model_jina_bert_v2(params);
        case LLM_ARCH_MAMBA:
            return new llama_model_mamba(params);
        case LLM_ARCH_MAMBA2:
            return new llama_model_mamba2(params);
        case LLM_ARCH_DEEPSEEK2:
            return new llama_model_deepseek2(params);
        case LLM_ARCH_MISTRAL4:
            return new llama_model_mistral4(params);
        default:
            throw std::runtime_error("unsupported model architecture");
    }
}

llama_rope_type llama_model_rope_type(const llama_model * model) {
    switch (model->arch) {
        case LLM_ARCH_MAMBA:
        case LLM_ARCH_MAMBA2:
            return LLAMA_ROPE_TYPE_NONE;
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_LLAMA_EMBED:
            return LLAMA_ROPE_TYPE_NORM;
        case LLM_ARCH_QWEN2:
            return LLAMA_ROPE_TYPE_NEOX;
        default:
            return LLAMA_ROPE_TYPE_NONE;
    }
}
"""

MODELS_H = """\
#pragma once
#include "../llama-model.h"

struct llm_build_mamba_base : public llm_graph_context {
    llm_build_mamba_base(const llm_graph_params & params);
    ggml_tensor * build_mamba_layer(ggml_tensor * cur, int il);
};

struct llama_model_llama : public llama_model_base {
    void load_arch_tensors(llama_model_loader & ml) override;
    template <bool embed>
    struct graph : public llm_graph_context {
        graph(const llama_model & model, const llm_graph_params & params);
    };
};

struct llama_model_llama_embed : public llama_model_llama {
    template <bool embed>
    using graph = llama_model_llama::graph<embed>;
};

struct llama_model_qwen2 : public llama_model_base {
    void load_arch_hparams(llama_model_loader & ml) override;
    struct graph : public llm_graph_context {
        graph(const llama_model & model, const llm_graph_params & params);
    };
};

struct llama_model_bert : public llama_model_base {
    void load_arch_hparams(llama_model_loader & ml) override;
    struct graph : public llm_graph_context {
        graph(const llama_model & model, const llm_graph_params & params);
    };
};

struct llama_model_jina_bert_v2 : public llama_model_base {
    void load_arch_hparams(llama_model_loader & ml) override;
    using graph = llama_model_bert::graph;
};

struct llama_model_mamba : public llama_model_base {
    struct graph : public llm_build_mamba_base {
        graph(const llama_model & model, const llm_graph_params & params);
    };
};

struct llama_model_mamba2 : public llama_model_base {
    using graph = llama_model_mamba::graph;
};

struct llama_model_deepseek2 : public llama_model_base {
    void load_arch_tensors(llama_model_loader & ml) override;
    struct graph : public llm_graph_context {
        graph(const llama_model & model, const llm_graph_params & params);
    };
};

struct llama_model_mistral4 : public llama_model_deepseek2 {
    struct graph : public llm_graph_context {
        graph(const llama_model & model, const llm_graph_params & params);
    };
};
"""


def builder(cls: str, body: str = 'cb(cur, "l_out", il);', template: str = "") -> str:
    prefix = f"template <bool {template}>\n" if template else ""
    graph = f"graph<{template}>" if template else "graph"
    return (
        f"{prefix}{cls}::{graph}::graph(const llama_model & model, const llm_graph_params & params)"
        " : llm_graph_context(params) {\n"
        "    ggml_tensor * cur = nullptr;\n"
        "    for (int il = 0; il < n_layer; ++il) {\n"
        f"        {body}\n"
        "    }\n"
        "}\n"
    )


def member(cls: str, name: str, body: str = "") -> str:
    return f"void {cls}::{name}(llama_model_loader & ml) {{\n    {body}\n}}\n"


TREE: dict[str, str] = {
    "src/llama-arch.cpp": ARCH,
    "src/llama-model.cpp": MODEL,
    "src/llama-graph.cpp": "// the graph context every family shares\n",
    "src/models/models.h": MODELS_H,
    "src/models/llama.cpp": '#include "models.h"\n\n'
    + member("llama_model_llama", "load_arch_tensors")
    + builder("llama_model_llama", template="embed")
    + "\ntemplate struct llama_model_llama::graph<false>;\ntemplate struct llama_model_llama::graph<true>;\n",
    "src/models/qwen2.cpp": '#include "models.h"\n\n'
    + member("llama_model_qwen2", "load_arch_hparams")
    + builder("llama_model_qwen2"),
    "src/models/bert.cpp": '#include "models.h"\n\n'
    + member("llama_model_bert", "load_arch_hparams")
    + builder("llama_model_bert"),
    "src/models/jina-bert-v2.cpp": '#include "models.h"\n\n' + member("llama_model_jina_bert_v2", "load_arch_hparams"),
    "src/models/mamba-base.cpp": '#include "models.h"\n\n'
    "ggml_tensor * llm_build_mamba_base::build_mamba_layer(ggml_tensor * cur, int il) {\n    return cur;\n}\n",
    "src/models/mamba.cpp": '#include "models.h"\n\n' + builder("llama_model_mamba"),
    "src/models/deepseek2.cpp": '#include "models.h"\n\n'
    + member("llama_model_deepseek2", "load_arch_tensors")
    + builder("llama_model_deepseek2"),
    "src/models/mistral4.cpp": '#include "models.h"\n\n' + builder("llama_model_mistral4"),
}


def reader(files: Mapping[str, str | None]) -> tc.Reader:
    def read(path: str) -> bytes | None:
        text = files.get(path)
        return None if text is None else text.encode()

    return read


def changed(changes: Mapping[str, str | None]) -> dict[str, tuple[str, ...]]:
    """family -> reasons, for TREE with ``changes``."""
    new = {**TREE, **changes}
    found = tc.families_touched(changes, reader(TREE), reader(new))
    return {t.family: t.reasons for t in found}


def test_a_family_builder_edit_touches_its_family_alone() -> None:
    edited = TREE["src/models/qwen2.cpp"].replace('cb(cur, "l_out", il);', 'cb(cur, "l_out", il);\n        hook(il);')
    assert changed({"src/models/qwen2.cpp": edited}) == {
        "qwen2": ("src/models/qwen2.cpp: llama_model_qwen2::graph::graph changed",)
    }
    found = tc.families_touched(
        ["src/models/qwen2.cpp"], reader(TREE), reader({**TREE, "src/models/qwen2.cpp": edited})
    )
    assert [(t.family, t.arch) for t in found] == [("qwen2", "LLM_ARCH_QWEN2")]


def test_a_shared_builder_touches_every_family_that_builds_with_it() -> None:
    edited = TREE["src/models/bert.cpp"].replace("cb(cur", "cur = ggml_scale(ctx0, cur, 2.0f);\n        cb(cur")
    assert changed({"src/models/bert.cpp": edited}) == {
        "bert": ("src/models/bert.cpp: llama_model_bert::graph::graph changed",),
        "jina-bert-v2": (
            "src/models/bert.cpp: llama_model_bert::graph::graph changed "
            "(llama_model_jina_bert_v2 builds its graph with llama_model_bert)",
        ),
    }
    # another member of bert's is not graph code: the families using bert's builder stay untouched
    hparams = TREE["src/models/bert.cpp"].replace(
        "void llama_model_bert::load_arch_hparams(llama_model_loader & ml) {\n    \n}",
        "void llama_model_bert::load_arch_hparams(llama_model_loader & ml) {\n    ml.get_key(LLM_KV_X, x);\n}",
    )
    assert hparams != TREE["src/models/bert.cpp"]
    assert changed({"src/models/bert.cpp": hparams}) == {
        "bert": ("src/models/bert.cpp: llama_model_bert::load_arch_hparams changed",)
    }


def test_a_template_builder_reaches_the_family_that_aliases_it() -> None:
    edited = TREE["src/models/llama.cpp"].replace('"l_out"', '"l_out_2"')
    assert changed({"src/models/llama.cpp": edited}) == {
        "llama": ("src/models/llama.cpp: llama_model_llama::graph<embed>::graph changed",),
        "llama-embed": (
            "src/models/llama.cpp: llama_model_llama::graph<embed>::graph changed "
            "(llama_model_llama_embed builds its graph with llama_model_llama)",
        ),
    }


def test_an_inherited_member_touches_the_families_that_derive_from_it() -> None:
    edited = TREE["src/models/deepseek2.cpp"].replace(
        "load_arch_tensors(llama_model_loader & ml) {\n    \n}",
        "load_arch_tensors(llama_model_loader & ml) {\n    t();\n}",
    )
    assert changed({"src/models/deepseek2.cpp": edited}) == {
        "deepseek2": ("src/models/deepseek2.cpp: llama_model_deepseek2::load_arch_tensors changed",),
        "mistral4": (
            "src/models/deepseek2.cpp: llama_model_deepseek2::load_arch_tensors changed "
            "(llama_model_mistral4 derives from llama_model_deepseek2)",
        ),
    }
    # mistral4 has a graph of its own: deepseek2's builder is not its graph
    builder_edit = TREE["src/models/deepseek2.cpp"].replace('"l_out"', '"l_out_x"')
    assert set(changed({"src/models/deepseek2.cpp": builder_edit})) == {"deepseek2"}


def test_a_shared_graph_base_touches_the_families_whose_graph_derives_from_it() -> None:
    edited = TREE["src/models/mamba-base.cpp"].replace("return cur;", "return ggml_silu(ctx0, cur);")
    assert changed({"src/models/mamba-base.cpp": edited}) == {
        "mamba": (
            "src/models/mamba-base.cpp: llm_build_mamba_base::build_mamba_layer changed "
            "(llama_model_mamba builds its graph with llm_build_mamba_base)",
        ),
        "mamba2": (
            "src/models/mamba-base.cpp: llm_build_mamba_base::build_mamba_layer changed "
            "(llama_model_mamba2 builds its graph with llama_model_mamba -> llm_build_mamba_base)",
        ),
    }


def test_a_change_outside_the_member_functions_touches_the_files_classes() -> None:
    include = TREE["src/models/qwen2.cpp"].replace('#include "models.h"\n', '#include "models.h"\n#include "x.h"\n')
    assert changed({"src/models/qwen2.cpp": include}) == {
        "qwen2": ("src/models/qwen2.cpp: changed outside its member functions",)
    }
    helper = TREE["src/models/qwen2.cpp"] + "\nstatic int helper(int x) { return x; }\n"
    assert set(changed({"src/models/qwen2.cpp": helper})) == {"qwen2"}
    instantiations = TREE["src/models/llama.cpp"].replace("template struct llama_model_llama::graph<true>;\n", "")
    assert set(changed({"src/models/llama.cpp": instantiations})) == {"llama", "llama-embed"}


def test_cases_added_dropped_or_changed_in_a_switch() -> None:
    added = MODEL.replace(
        "        case LLM_ARCH_QWEN2:\n            return LLAMA_ROPE_TYPE_NEOX;",
        "        case LLM_ARCH_QWEN2:\n        case LLM_ARCH_BERT:\n            return LLAMA_ROPE_TYPE_NEOX;",
    )
    assert changed({"src/llama-model.cpp": added}) == {
        "bert": ("src/llama-model.cpp: case LLM_ARCH_BERT added to the switch in llama_model_rope_type",)
    }
    dropped = MODEL.replace(
        "        case LLM_ARCH_MAMBA:\n        case LLM_ARCH_MAMBA2:\n", "        case LLM_ARCH_MAMBA:\n"
    )
    assert changed({"src/llama-model.cpp": dropped}) == {
        "mamba2": ("src/llama-model.cpp: case LLM_ARCH_MAMBA2 dropped from the switch in llama_model_rope_type",)
    }
    branch = MODEL.replace("return LLAMA_ROPE_TYPE_NEOX;", "return LLAMA_ROPE_TYPE_NORM;")
    assert changed({"src/llama-model.cpp": branch}) == {
        "qwen2": ("src/llama-model.cpp: case LLM_ARCH_QWEN2 changed in the switch in llama_model_rope_type",)
    }
    # a label that falls through into another branch shares it: both archs are touched
    fall = MODEL.replace("return LLAMA_ROPE_TYPE_NORM;", "return LLAMA_ROPE_TYPE_GPTJ;")
    assert set(changed({"src/llama-model.cpp": fall})) == {"llama", "llama-embed"}


def test_a_new_family_is_touched_by_its_file_and_its_case() -> None:
    arch = ARCH.replace("    { LLM_ARCH_CLIP,", '    { LLM_ARCH_PHI3,         "phi3"         },\n    { LLM_ARCH_CLIP,')
    model = MODEL.replace(
        "        case LLM_ARCH_QWEN2:\n            return new",
        "        case LLM_ARCH_PHI3:\n            return new llama_model_phi3(params);\n"
        "        case LLM_ARCH_QWEN2:\n            return new",
    )
    header = MODELS_H + (
        "\nstruct llama_model_phi3 : public llama_model_base {\n"
        "    struct graph : public llm_graph_context {\n"
        "        graph(const llama_model & model, const llm_graph_params & params);\n    };\n};\n"
    )
    found = changed(
        {
            "src/llama-arch.cpp": arch,
            "src/llama-model.cpp": model,
            "src/models/models.h": header,
            "src/models/phi3.cpp": '#include "models.h"\n' + builder("llama_model_phi3"),
        }
    )
    assert found == {
        "phi3": (
            "src/models/phi3.cpp: llama_model_phi3::graph::graph added",
            "src/models/phi3.cpp: changed outside its member functions",
            "src/llama-model.cpp: case LLM_ARCH_PHI3 added to the switch in llama_model_mapping",
        )
    }
    # the family removed again: its file and its case are gone
    removed = tc.families_touched(
        ["src/models/phi3.cpp", "src/llama-model.cpp"],
        reader({**TREE, "src/llama-arch.cpp": arch, "src/llama-model.cpp": model, "src/models/phi3.cpp": "x"}),
        reader(TREE),
    )
    assert [(t.family, t.arch) for t in removed] == [("phi3", "LLM_ARCH_PHI3")]
    assert "src/llama-model.cpp: case LLM_ARCH_PHI3 dropped from the switch in llama_model_mapping" in (
        removed[0].reasons
    )


def test_shared_files_whitespace_and_non_families_touch_nothing() -> None:
    assert changed({"src/models/models.h": MODELS_H + "\nstruct helper {};\n"}) == {}
    assert changed({"src/llama-graph.cpp": "// the graph context, edited\n"}) == {}
    assert changed({"README.md": "a line\n"}) == {}
    spaced = TREE["src/models/qwen2.cpp"].replace('cb(cur, "l_out", il);', 'cb(cur,   "l_out",\n il);')
    assert changed({"src/models/qwen2.cpp": spaced}) == {}
    clip = MODEL.replace(
        "        case LLM_ARCH_QWEN2:\n            return LLAMA",
        "        case LLM_ARCH_CLIP:\n        case LLM_ARCH_QWEN2:\n            return LLAMA",
    )
    assert changed({"src/llama-model.cpp": clip}) == {}, "LLM_ARCH_CLIP is no model family"


def test_definitions_of_a_family_file() -> None:
    read = tc.read_family_file(TREE["src/models/llama.cpp"].encode())
    assert {(d.name, d.owner, d.graph) for d in read.definitions.values()} == {
        ("llama_model_llama::load_arch_tensors", "llama_model_llama", False),
        ("llama_model_llama::graph<embed>::graph", "llama_model_llama", True),
    }
    assert "template struct llama_model_llama::graph<false>;" in read.rest
    classes = tc.read_classes(MODELS_H.encode())
    assert classes.shared["llama_model_jina_bert_v2"] == "llama_model_bert"
    assert classes.bases == {
        "llama_model_llama_embed": "llama_model_llama",
        "llama_model_mistral4": "llama_model_deepseek2",
    }
    assert classes.graph_bases["llama_model_mamba"] == ("llm_build_mamba_base",)
    switches = tc.arch_switches(MODEL.encode())
    assert [s.where for s in switches.values()] == ["llama_model_mapping", "llama_model_rope_type"]
    mapping = next(iter(switches.values()))
    assert mapping.branches["LLM_ARCH_QWEN2"] == "return new llama_model_qwen2(params);"
