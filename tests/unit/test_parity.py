"""The C++ arch scanner (tree-sitter) and the pure parts of the parity audit (no git)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from skippy.core.errors import QueueError
from skippy.maintain import cppscan
from skippy.maintain.linemap import parse_hunks
from skippy.maintain.parity import Allowed, compare, glob_match, load_allowlist

OLD_STYLE = r"""
#include "llama-model.h"
#define LLAMA_CASE(x) case x: /* a macro with a brace { */
static const char * RAW = R"json({ "case LLM_ARCH_FAKE:": "}" })json";

void llama_model::load_hparams(llama_model_loader & ml) {
    const auto get = [&](int k) { return k; };
    switch (arch) {
        case LLM_ARCH_LLAMA:
            {
                ml.get_key(LLM_KV_EXPERT_COUNT, hparams.n_expert, false);
                switch (hparams.n_layer) {
                    case 22: type = LLM_TYPE_1B; break;
                    default: type = LLM_TYPE_UNKNOWN;
                }
            } break;
        case LLM_ARCH_DECI:
            switch (hparams.n_layer) {
                case 32: type = LLM_TYPE_7B; break;
            } break;
        case LLM_ARCH_GROK: { if (get(1) > 0) { hparams.x = '}'; } } break;
        default: throw std::runtime_error("unsupported model architecture { ");
    }
}

struct llm_build_llama : public llm_graph_context {
    llm_build_llama(const llama_model & model, const llm_graph_params & params) : llm_graph_context(params) {
        for (int il = 0; il < n_layer; ++il) {
            switch (model.arch) {
                case LLM_ARCH_LLAMA4: cur = a; break;
                default: break;
            }
        }
    }
};

ggml_cgraph * llama_model::build_graph(const llm_graph_params & params) const {
    std::unique_ptr<llm_graph_context> llm;
    switch (arch) {
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_LLAMA4:
            {
                llm = std::make_unique<llm_build_llama>(*this, params);
            } break;
        case LLM_ARCH_DECI:
            {
                llm = std::make_unique<llm_build_deci>(*this, params);
            } break;
    }
    return llm->res->get_gf();
}

namespace {
const std::map<llm_arch, std::vector<int>> SIZES {
    { LLM_ARCH_LLAMA, { 1, 2 } },
    { LLM_ARCH_DECI,  { 3 } },
};
}

static const std::set<llm_arch> SWA_ARCHES = { LLM_ARCH_GEMMA2, LLM_ARCH_GEMMA3 };

int llama_helper(llm_arch a) {
    return a == LLM_ARCH_LLAMA ? 1 : 0; // not a case: a comparison
}
"""


def test_old_style_sources_are_scanned_per_function() -> None:
    scan = cppscan.scan("src/llama-model.cpp", OLD_STYLE)
    got = [(s.function, s.subject, s.cases) for s in scan.switches]
    assert got == [
        ("llama_model::load_hparams", "arch", ("LLM_ARCH_LLAMA", "LLM_ARCH_DECI", "LLM_ARCH_GROK")),
        ("llm_build_llama::llm_build_llama", "model.arch", ("LLM_ARCH_LLAMA4",)),
        ("llama_model::build_graph", "arch", ("LLM_ARCH_LLAMA", "LLM_ARCH_LLAMA4", "LLM_ARCH_DECI")),
    ]
    assert [(t.name, t.entries) for t in scan.tables] == [
        ("SIZES", ("LLM_ARCH_LLAMA", "LLM_ARCH_DECI")),
        ("SWA_ARCHES", ("LLM_ARCH_GEMMA2", "LLM_ARCH_GEMMA3")),
    ]
    assert scan.switches[0].line == OLD_STYLE.splitlines().index("    switch (arch) {") + 1
    assert scan.counts()[("switch", "src/llama-model.cpp", "llama_model::build_graph")] == Counter(
        {"LLM_ARCH_LLAMA": 1, "LLM_ARCH_LLAMA4": 1, "LLM_ARCH_DECI": 1}
    )


PREPROCESSED = """\
uint32_t llama_model::n_swa_layers() const {
#if defined(GGML_USE_METAL)
    if (hparams.swa_type != LLAMA_SWA_TYPE_NONE) {
#elif defined(GGML_USE_CUDA)
    if (true) {
#else
    {
#endif
        switch (arch) {
            case LLM_ARCH_GEMMA3: return 1;
#ifdef SKIPPY_EXTRA
            case LLM_ARCH_QWEN2: return 2;
#else
            case LLM_ARCH_LLAMA: return 3;
#endif
            default: return 0;
        }
    }
}

llama_rope_type llama_model_rope_type(const llama_model * model) {
    if (model->hparams.use_rope) {
        model->note();
#if defined(GGML_USE_METAL)
    }
#else
    }
#endif
    switch (model->arch) {
        case LLM_ARCH_GEMMA3: return LLAMA_ROPE_TYPE_NEOX;
        default: return LLAMA_ROPE_TYPE_NONE;
    }
}
"""


def test_unbalanced_preprocessor_branches_keep_the_braces_paired() -> None:
    scan = cppscan.scan("src/llama-model.cpp", PREPROCESSED)
    got = [(s.function, s.cases) for s in scan.switches]
    # the three `{` openers of the first #if group count once; balanced alternates count in full
    assert got == [
        ("llama_model::n_swa_layers", ("LLM_ARCH_GEMMA3", "LLM_ARCH_QWEN2", "LLM_ARCH_LLAMA")),
        ("llama_model_rope_type", ("LLM_ARCH_GEMMA3",)),
    ]
    lines = PREPROCESSED.splitlines()
    assert [s.line for s in scan.switches] == [
        lines.index("        switch (arch) {") + 1,
        lines.index("    switch (model->arch) {") + 1,
    ]


def test_only_the_first_branch_of_an_unbalanced_group_counts() -> None:
    text = """\
int llama_model::n_gpu_layers(llm_arch arch) const {
    switch (arch) {
#if defined(GGML_USE_METAL)
        case LLM_ARCH_GEMMA3: {
#else
        case LLM_ARCH_QWEN2: {
#endif
            return 1;
        }
        case LLM_ARCH_LLAMA: return 2;
        default: return 0;
    }
}

int llama_model::n_after() const {
    switch (arch) { case LLM_ARCH_PHI2: return 1; default: return 0; }
}
"""
    scan = cppscan.scan("src/llama-model.cpp", text)
    assert [(s.function, s.cases) for s in scan.switches] == [
        ("llama_model::n_gpu_layers", ("LLM_ARCH_GEMMA3", "LLM_ARCH_LLAMA")),
        ("llama_model::n_after", ("LLM_ARCH_PHI2",)),
    ]
    assert [s.line for s in scan.switches] == [2, 16]


def test_comments_literals_and_macros_hold_no_structure() -> None:
    text = (
        'const char * a = "x{y} case LLM_ARCH_FAKE:"; // }\n'
        "/* { */ char b = '{';\n"
        "#define Z {\\\n }\n"
        "int c = 1'000;\n"
        "int pick(llm_arch arch) {\n"
        "    switch (arch) { case LLM_ARCH_LLAMA: return 1; default: return 0; }\n"
        "}\n"
        "static const std::set<llm_arch> SET = { LLM_ARCH_GEMMA2 /* , LLM_ARCH_FAKE */ };\n"
    )
    scan = cppscan.scan("src/x.cpp", text)
    assert [(s.function, s.line, s.cases) for s in scan.switches] == [("pick", 7, ("LLM_ARCH_LLAMA",))]
    assert [(t.name, t.line, t.entries) for t in scan.tables] == [("SET", 9, ("LLM_ARCH_GEMMA2",))]


SWITCH = "switch (arch) { case LLM_ARCH_LLAMA: return 1; default: return 0; }"


@pytest.mark.parametrize(
    ("source", "function"),
    [
        (f"llama_rope_type llama_model_rope_type(const llama_model * model) {{ {SWITCH} }}", "llama_model_rope_type"),
        (f"std::string LLM_KV::operator()(llm_kv kv) const {{ {SWITCH} }}", "LLM_KV::operator()"),
        (
            f"llm_build_x::llm_build_x(const llama_model & m) : llm_graph_context(p), a(1) {{ {SWITCH} }}",
            "llm_build_x::llm_build_x",
        ),
        (
            f"template <bool iswa> void llama_model_x::graph<iswa>::build() {{ {SWITCH} }}",
            "llama_model_x::graph::build",
        ),
        (f"void g() {{ auto fn = [&](int il) -> ggml_tensor * {{ {SWITCH} }}; }}", "g"),
        (f"void h() {{ if (x && f(y)) {{ {SWITCH} }} else if (z) {{ }} }}", "h"),
        (
            f"struct llama_model_gemma3 : public llama_model_base {{ void load() {{ {SWITCH} }} }};",
            "llama_model_gemma3::load",
        ),
        (f"namespace skippy {{ int f() {{ {SWITCH} }} }}", "f"),
        (f"static auto pick = [](llm_arch arch) {{ {SWITCH} }};", "<file scope>"),
    ],
)
def test_a_switch_is_named_after_its_function(source: str, function: str) -> None:
    (switch,) = cppscan.scan("src/x.cpp", source).switches
    assert (switch.function, switch.subject, switch.cases) == (function, "arch", ("LLM_ARCH_LLAMA",))


def test_switch_subjects_and_nested_switches() -> None:
    text = (
        "void f(const llama_model * model) {\n"
        "    switch (model->arch) {\n"
        "        case LLM_ARCH_X: switch (hparams.n_layer) { case 22: break; default: break; } break;\n"
        "        case llm_arch::LLM_ARCH_Y: break;\n"
        "    }\n"
        "}\n"
    )
    (switch,) = cppscan.scan("src/x.cpp", text).switches
    assert (switch.subject, switch.cases, switch.line) == ("model->arch", ("LLM_ARCH_X", "LLM_ARCH_Y"), 2)


@pytest.mark.parametrize(
    ("source", "tables"),
    [
        (
            'static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n    { LLM_ARCH_LLAMA, "llama" },\n};',
            [("LLM_ARCH_NAMES", ("LLM_ARCH_LLAMA",))],
        ),
        ("const std::set<llm_arch> ARCHES[] = { LLM_ARCH_A, LLM_ARCH_B };", [("ARCHES", ("LLM_ARCH_A", "LLM_ARCH_B"))]),
        ("void f() { static const std::set<llm_arch> ARCHES = { LLM_ARCH_A }; }", [("f::ARCHES", ("LLM_ARCH_A",))]),
        ("void f() { self.archs = { LLM_ARCH_A }; }", [("f::archs", ("LLM_ARCH_A",))]),
        ("struct s { std::vector<llm_arch> archs = { LLM_ARCH_A }; };", [("archs", ("LLM_ARCH_A",))]),
        ("std::map<int, std::vector<int>> m = { { 1, { LLM_ARCH_A } } };", [("m", ("LLM_ARCH_A",))]),
        ("std::vector<int> v = { 1, 2 };", []),
        ("std::vector<int> f() { return { LLM_ARCH_A }; }", []),
        ("void f() { g({ LLM_ARCH_A }); }", []),
        ("enum llm_arch { LLM_ARCH_A, LLM_ARCH_B };", []),
    ],
)
def test_tables_keyed_by_arch(source: str, tables: list[tuple[str, tuple[str, ...]]]) -> None:
    assert [(t.name, t.entries) for t in cppscan.scan("src/x.cpp", source).tables] == tables


def test_real_style_switches_in_arch_helpers() -> None:
    text = (
        "bool llm_arch_is_hybrid(const llm_arch & arch) {\n    switch (arch) {\n"
        "        case LLM_ARCH_JAMBA:\n        case LLM_ARCH_FALCON_H1: return true;\n"
        "        default: return false;\n    }\n}\n"
    )
    (switch,) = cppscan.scan("src/llama-arch.cpp", text).switches
    assert (switch.function, switch.cases) == ("llm_arch_is_hybrid", ("LLM_ARCH_JAMBA", "LLM_ARCH_FALCON_H1"))


def test_a_file_without_arch_names_has_nothing() -> None:
    scan = cppscan.scan("src/x.cpp", "int f(int a) { switch (a) { case 1: return 2; } return 0; }")
    assert (scan.switches, scan.tables, scan.case_count, scan.entry_count) == ((), (), 0, 0)


def test_arch_names() -> None:
    text = (
        "static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n"
        '    { LLM_ARCH_LLAMA, "llama" },\n    { LLM_ARCH_GEMMA3 /* new */, "gemma3" },\n'
        '    // { LLM_ARCH_OLD, "old" },\n};\n'
        'static const char * NOT_ONE[] = { "a", "b" };\n'
    )
    assert cppscan.arch_names(text) == {"LLM_ARCH_LLAMA": "llama", "LLM_ARCH_GEMMA3": "gemma3"}


@pytest.mark.parametrize(
    ("path", "pattern", "ok"),
    [
        ("src/llama-model.cpp", "src/*.cpp", True),
        ("src/models/gemma3.cpp", "src/*.cpp", False),
        ("src/models/gemma3.cpp", "src/**/*.cpp", True),
        ("src/llama.cpp", "src/**/*.cpp", True),
        ("tools/src/x.cpp", "src/*.cpp", False),
    ],
)
def test_glob_match(path: str, pattern: str, ok: bool) -> None:
    assert glob_match(path, pattern) is ok


def test_compare_blames_and_allows() -> None:
    key = ("switch", "src/m.cpp", "rope")
    upstream = {key: Counter({"LLM_ARCH_A": 1, "LLM_ARCH_B": 2, "LLM_ARCH_C": 1})}
    patched = {key: Counter({"LLM_ARCH_B": 1, "LLM_ARCH_C": 1, "LLM_ARCH_NEW": 1})}
    allow = [Allowed("switch", "src/m.cpp", "rope", "LLM_ARCH_A", "gone"), Allowed("switch", "x", "y", "Z", "stale")]
    dropped, stale = compare(upstream, patched, {(*key, "LLM_ARCH_B"): "core/0002-x.patch"}, allow)
    assert [(d.case, d.lost, d.patch, d.allowed) for d in dropped] == [
        ("LLM_ARCH_A", 1, None, True),
        ("LLM_ARCH_B", 1, "core/0002-x.patch", False),
    ]
    assert [a.case for a in stale] == ["Z"]


def test_allowlist_validation(tmp_path: Path) -> None:
    path = tmp_path / "allow.toml"
    assert load_allowlist(path) == ()
    path.write_text(
        '[[dropped]]\nfile = "a"\ntable = "T"\ncase = "LLM_ARCH_X"\nreason = "ok"\n'
        '[[dropped]]\nfile = "a"\nfunction = "f"\ntable = "T"\ncase = "C"\nreason = "r"\n'
        '[[dropped]]\nfile = "a"\nfunction = "f"\ncase = "C"\nreason = " "\nextra = 1\n',
        encoding="utf-8",
    )
    with pytest.raises(QueueError) as info:
        load_allowlist(path)
    details = info.value.details or ""
    assert "entry 2: give exactly one of function" in details
    assert "entry 3: unknown key(s) extra" in details
    assert "entry 3: reason must be non-empty" in details


def test_parse_hunks() -> None:
    diff = (
        "diff --git a/src/m.cpp b/src/m.cpp\nindex 1..2 100644\n--- a/src/m.cpp\n+++ b/src/m.cpp\n"
        "@@ -3,2 +3,0 @@ fn\n-        case LLM_ARCH_MPT:\n-        case LLM_ARCH_BLOOM:\n"
        "@@ -10,0 +9 @@\n+added\n"
        "diff --git a/new.h b/new.h\nnew file mode 100644\n--- /dev/null\n+++ b/new.h\n@@ -0,0 +1 @@\n+x\n"
        "diff --git a/blob.bin b/blob.bin\nBinary files a/blob.bin and b/blob.bin differ\n"
    )
    hunks, no_text = parse_hunks(diff)
    assert [(h.file, h.old_start, h.old_count, h.new_file, len(h.removed)) for h in hunks] == [
        ("src/m.cpp", 3, 2, False, 2),
        ("src/m.cpp", 10, 0, False, 0),
        ("new.h", 0, 0, True, 0),
    ]
    assert hunks[0].removed == ("        case LLM_ARCH_MPT:", "        case LLM_ARCH_BLOOM:")
    assert no_text == {"blob.bin"}
