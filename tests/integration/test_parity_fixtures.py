"""Shared helpers of the queue-maintenance tests: an upstream with arch dispatch, patch chains,
and branches in a prepared workdir.  (No tests here.)"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

MODEL_SRC = """\
#include "llama-model.h"

// the mapping: one model class per arch
static llama_model * llama_model_mapping(llm_arch arch, const llama_model_params & params) {
    switch (arch) {
        case LLM_ARCH_LLAMA:
            return new llama_model_llama(params);
        case LLM_ARCH_GEMMA3:
            return new llama_model_gemma3(params);
        case LLM_ARCH_GPT2:
            return new llama_model_gpt2(params);
        default:
            return nullptr;
    }
}

llama_memory_i * llama_model::create_memory(const llama_memory_params & params) const {
    llama_memory_i * res = nullptr;
    const auto pick = [&](int il) -> bool { return il > 0; };
    switch (arch) {
        case LLM_ARCH_BERT:
        case LLM_ARCH_T5ENCODER:
            {
                res = nullptr; // "case LLM_ARCH_FAKE:" in a string or comment is not a case
            } break;
        default:
            {
                res = make_memory(pick(1));
            }
    }
    return res;
}

llama_rope_type llama_model_rope_type(const llama_model * model) {
    switch (model->arch) {
        // these models do not use RoPE
        case LLM_ARCH_GPT2:
        case LLM_ARCH_MPT:
        case LLM_ARCH_BLOOM:
        case LLM_ARCH_T5ENCODER:
            return LLAMA_ROPE_TYPE_NONE;

        // use what we call a normal RoPE
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_GEMMA3:
            return LLAMA_ROPE_TYPE_NORM;

        default:
            break;
    }
    return LLAMA_ROPE_TYPE_NONE;
}

bool llama_model_has_encoder(const llama_model * model) {
    switch (model->arch) {
        case LLM_ARCH_T5ENCODER: return true;
        default:                 return false;
    }
}
"""

ARCH_SRC = """\
#include "llama-arch.h"

static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_GEMMA3,           "gemma3"           },
    { LLM_ARCH_GPT2,             "gpt2"             },
    { LLM_ARCH_MPT,              "mpt"              },
    { LLM_ARCH_BLOOM,            "bloom"            },
    { LLM_ARCH_BERT,             "bert"             },
    { LLM_ARCH_T5ENCODER,        "t5encoder"        },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};

bool llm_arch_is_recurrent(const llm_arch & arch) {
    switch (arch) {
        case LLM_ARCH_MPT:
            return true;
        default:
            return false;
    }
}
"""


def _builder(family: str, body: str) -> str:
    return (
        '#include "models.h"\n\n'
        f"llama_model_{family}::graph::graph(const llama_model & model, const llm_graph_params & params)\n"
        "    : llm_graph_context(params) {\n"
        "    ggml_tensor * cur;\n"
        "    ggml_tensor * inpL = build_inp_embd(model.tok_embd);\n"
        f"{body}"
        "    res->t_logits = cur;\n"
        "    ggml_build_forward_expand(gf, cur);\n"
        "}\n"
    )


#: the family files of the fixture tree: llama and gemma3 end their layer loop with the
#: ``l_out`` anchor, gpt2 with ``inpL = cur;`` only (no anchor)
MODELS: Mapping[str, str] = {
    "src/models/models.h": (
        "#pragma once\n\n"
        '#include "llama-graph.h"\n\n'
        "struct llama_model_llama : public llama_model {\n"
        "    struct graph : public llm_graph_context {\n"
        "        graph(const llama_model & model, const llm_graph_params & params);\n"
        "    };\n"
        "};\n\n"
        "struct llama_model_gemma3 : public llama_model {\n"
        "    struct graph : public llm_graph_context {\n"
        "        graph(const llama_model & model, const llm_graph_params & params);\n"
        "    };\n"
        "};\n\n"
        "struct llama_model_gpt2 : public llama_model {\n"
        "    struct graph : public llm_graph_context {\n"
        "        graph(const llama_model & model, const llm_graph_params & params);\n"
        "    };\n"
        "};\n"
    ),
    "src/models/llama.cpp": _builder(
        "llama",
        "    for (int il = 0; il < n_layer; ++il) {\n"
        "        cur = build_norm(inpL, model.layers[il].attn_norm, NULL, LLM_NORM_RMS, il);\n"
        "        cur = ggml_add(ctx0, cur, inpL);\n"
        '        cb(cur, "l_out", il);\n'
        "\n"
        "        inpL = cur;\n"
        "    }\n",
    ),
    "src/models/gemma3.cpp": _builder(
        "gemma3",
        "    for (int il = 0; il < n_layer; ++il) {\n"
        "        cur = build_norm(inpL, model.layers[il].attn_norm, NULL, LLM_NORM_RMS, il);\n"
        "        cur = ggml_scale(ctx0, cur, 2.0f);\n"
        '        cb(cur, "l_out", il);\n'
        "\n"
        "        inpL = cur;\n"
        "    }\n",
    ),
    "src/models/gpt2.cpp": _builder(
        "gpt2",
        "    for (int il = 0; il < n_layer; ++il) {\n"
        "        cur = ggml_add(ctx0, inpL, inpL);\n"
        "        inpL = cur;\n"
        "    }\n",
    ),
}

#: what the scanner must find in MODEL_SRC + ARCH_SRC (counted by hand)
SWITCHES = 5
CASES = 3 + 2 + 6 + 1 + 1
TABLE_ENTRIES = 8


def arch_upstream(project: Project) -> str:
    """Add a commit with arch dispatch to the fixture upstream and pin it; its SHA."""
    sha = project.upstream.commit(
        "model: arch dispatch", {"src/llama-model.cpp": MODEL_SRC, "src/llama-arch.cpp": ARCH_SRC, **MODELS}
    )
    project.pin(sha)
    return sha


def git_env() -> dict[str, str]:
    return hermetic_git_env(Path(os.environ["HOME"]))


def commit_files(repo: Path, subject: str, files: Mapping[str, str | None], *, date: str) -> str:
    env = git_env()
    env.update({"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_NAME": "Downstream Dev"})
    for rel, content in files.items():
        if content is None:
            git(repo, "rm", "--quiet", "--", rel, env=env)
            continue
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode("utf-8"))
        git(repo, "add", "--", rel, env=env)
    git(repo, "commit", "--quiet", "--no-verify", "-m", subject, env=env)
    return git(repo, "rev-parse", "HEAD", env=env).strip()


def edit(repo: Path, rel: str, old: str, new: str) -> str:
    text = (repo / rel).read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {rel}"
    return text.replace(old, new, 1)


def chain_patches(
    project: Project, base: str, steps: Sequence[tuple[str, Mapping[str, tuple[str, str] | str | None]]]
) -> list[bytes]:
    """Patches made one on top of the other from ``base``; a file value is new content, None
    (delete) or (old, new) to replace text in the current file."""
    scratch = project.scratch
    env = git_env()
    if not scratch.exists():
        git(project.upstream.path.parent, "clone", "--quiet", str(project.upstream.path), str(scratch), env=env)
    git(scratch, "fetch", "--quiet", "origin", env=env)
    git(scratch, "checkout", "--quiet", "--force", "--detach", base, env=env)
    out: list[bytes] = []
    for index, (subject, files) in enumerate(steps, start=1):
        resolved: dict[str, str | None] = {}
        for rel, value in files.items():
            resolved[rel] = edit(scratch, rel, *value) if isinstance(value, tuple) else value
        sha = commit_files(scratch, subject, resolved, date=f"2024-06-{index:02d}T10:00:00+0000")
        patch = git(scratch, "format-patch", "--stdout", "--zero-commit", "--no-signature", "-1", sha, env=env)
        out.append(patch.encode("utf-8"))
    return out


def queue_core(project: Project, patches: Sequence[bytes], slugs: Sequence[str]) -> None:
    for index, (data, slug) in enumerate(zip(patches, slugs, strict=True), start=1):
        project.add_patch("core", f"{index:04d}-{slug}.patch", data)


def snapshot(folder: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(folder))] = path.read_bytes()
    return out


#: a core patch step: two lines added before `return res;` in create_memory
ADD_HOOK_STEP: tuple[str, Mapping[str, tuple[str, str] | str | None]] = (
    "core: add a hook point",
    {"src/llama-model.cpp": ("    return res;\n", "    res = hook(res);\n    trace(res);\n    return res;\n")},
)
