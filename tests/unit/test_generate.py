"""The generator's pure parts: spec validation, facts from the tree, the built-in edit, the split
by family, the generator's identity and the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.core.errors import QueueError
from skippy.maintain import genbuiltin, generate, genfacts, genmanifest, genspec
from skippy.maintain.genrun import Generator
from tests.integration.test_parity_fixtures import MODELS

ARCH = 'static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n    { LLM_ARCH_GEMMA3, "gemma3" },\n};\n'
MODEL = (
    "static llama_model * llama_model_mapping(llm_arch arch, const llama_model_params & params) {\n"
    "    switch (arch) {\n        case LLM_ARCH_GEMMA3: // a comment between the label and its class\n"
    "            return new llama_model_gemma3(params);\n    }\n}\n"
)


def spec(text: str) -> genspec.Spec:
    return genspec.parse_spec(Path("families.toml"), text.encode())


def tree(tmp_path: Path, files: dict[str, str] = dict(MODELS)) -> Path:  # noqa: B006 - read only
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return tmp_path


def test_empty_spec_is_valid() -> None:
    assert spec("schema = 2\n").families == ()


def test_spec_problems_are_listed_together() -> None:
    with pytest.raises(QueueError) as info:
        spec(
            'schema = 1\noutput_dir = "src/x"\nbogus = 1\n'
            '[[family]]\nname = "Gemma"\narch = "LLM_ARCH_GEMMA3"\n'
            '[[family]]\nname = "a"\narch = "gemma3"\n'
            '[[family]]\nname = "b"\narch = "LLM_ARCH_B"\n'
            '[[family]]\nname = "b"\narch = "LLM_ARCH_C"\n'
            '[[family]]\nname = "c"\narch = "LLM_ARCH_B"\nx = 1\n'
            '[[family]]\nname = "clip"\narch = "LLM_ARCH_CLIP"\n'
            '[[family]]\nname = "unknown"\narch = "LLM_ARCH_UNKNOWN"\n'
            '[[family]]\nname = "d"\narch = "LLM_ARCH_D"\npaths = ["../outside.cpp"]\n'
            '[[family]]\nname = "e"\narch = "LLM_ARCH_E"\npaths = "src/models/e.cpp"\n'
        )
    details = info.value.details or ""
    for expected in (
        "unknown key(s) bogus",
        "schema 1 is not supported: write schema = 2 (schema 1 was the registration-file generator)",
        "output_dir is gone",
        "family 1: name 'Gemma'",
        "family a: arch 'gemma3'",
        "family b: declared twice",
        "family c: arch LLM_ARCH_B is already declared",
        "family 5: unknown key(s) x",
        "family clip: LLM_ARCH_CLIP is not a model family",
        "family unknown: LLM_ARCH_UNKNOWN is not a model family",
        "family d: paths '../outside.cpp' must be relative paths inside the tree",
        "family e: paths must be a list",
    ):
        assert expected in details


def test_values_of_the_spec_are_quoted_as_short_masked_excerpts() -> None:
    with pytest.raises(QueueError) as info:
        spec(
            'schema = 2\n[[family]]\nname = "a"\narch = "HF_TOKEN=s3cr3tvalue' + "z" * 500 + '"\n'
            '[[family]]\nname = "b"\narch = "LLM_ARCH_B"\npaths = ["/etc/' + "p" * 500 + '"]\n'
        )
    details = info.value.details or ""
    assert "family a: arch 'HF_TOKEN=***" in details and "s3cr3tvalue" not in details
    assert "family b: paths '/etc/ppp" in details
    assert "z" * 100 not in details and "p" * 100 not in details


@pytest.mark.parametrize("arch", ["LLM_ARCH_UNKNOWN", "LLM_ARCH_CLIP"])
def test_entries_that_are_not_model_families_are_refused(arch: str) -> None:
    with pytest.raises(QueueError) as info:
        spec(f'schema = 2\n[[family]]\nname = "x"\narch = "{arch}"\n')
    assert f"family x: {arch} is not a model family" in (info.value.details or "")
    assert spec('schema = 2\n[[family]]\nname = "x"\narch = "LLM_ARCH_QWEN2"\n').families[0].arch == "LLM_ARCH_QWEN2"


def test_facts_come_from_the_tree(tmp_path: Path) -> None:
    families = spec('schema = 2\n[[family]]\nname = "gemma3"\narch = "LLM_ARCH_GEMMA3"\n').families
    builders = genfacts.builder_files(tree(tmp_path))
    assert builders["llama_model_gemma3"] == ("src/models/gemma3.cpp", "llama_model_gemma3")
    facts = genfacts.arch_facts(families, ARCH, MODEL, where="t", builders=builders)
    assert facts["gemma3"] == genfacts.ArchFacts(
        "LLM_ARCH_GEMMA3", "gemma3", "llama_model_gemma3", "src/models/gemma3.cpp", "llama_model_gemma3"
    )
    # a tree without the mapping: no model class, no builder file
    assert genfacts.arch_facts(families, ARCH, None, where="t", builders=builders)["gemma3"].builder_file is None
    unknown = spec('schema = 2\n[[family]]\nname = "g"\narch = "LLM_ARCH_GEMMA"\n').families
    with pytest.raises(QueueError, match="unknown to the tree") as info:
        genfacts.arch_facts(unknown, ARCH, MODEL, where="t")
    assert "closest: LLM_ARCH_GEMMA3" in (info.value.details or "")


def test_a_class_sharing_a_builder_is_edited_in_the_shared_file(tmp_path: Path) -> None:
    header = MODELS["src/models/models.h"] + (
        "\nstruct llama_model_gemma3n : public llama_model_gemma3 {\n    using graph = llama_model_gemma3::graph;\n};\n"
    )
    builders = genfacts.builder_files(tree(tmp_path, {**MODELS, "src/models/models.h": header}))
    assert builders["llama_model_gemma3n"] == ("src/models/gemma3.cpp", "llama_model_gemma3")


def _facts(root: Path, *families: genspec.Family) -> dict[str, genfacts.ArchFacts]:
    builders = genfacts.builder_files(root)
    return {
        f.name: genfacts.ArchFacts(
            f.arch, f.name, f"llama_model_{f.name}", *builders.get(f"llama_model_{f.name}", (None, None))
        )
        for f in families
    }


def test_builtin_edit_places_the_hook_once(tmp_path: Path) -> None:
    root = tree(tmp_path)
    families = (genspec.Family("llama", "LLM_ARCH_LLAMA"), genspec.Family("gpt2", "LLM_ARCH_GPT2"))
    facts = _facts(root, *families)
    done = genbuiltin.builtin_edit(root, families, facts)
    assert done["llama"] == "1 layer hook(s) in src/models/llama.cpp (line 10, anchor)"
    assert done["gpt2"] == "1 layer hook(s) in src/models/gpt2.cpp (line 9, end of loop body)"
    llama = (root / "src/models/llama.cpp").read_text()
    assert '        cb(cur, "l_out", il);\n        llama_skippy_layer_hook(this, cur, il);\n' in llama
    assert "llama_skippy_layer_hook(this, inpL, il);" in (root / "src/models/gpt2.cpp").read_text()
    assert (root / "src/models/gemma3.cpp").read_text() == MODELS["src/models/gemma3.cpp"]  # not declared
    # a second pass changes nothing
    genbuiltin.builtin_edit(root, families, facts)
    assert (root / "src/models/llama.cpp").read_text() == llama


def test_builtin_edit_names_every_family_it_cannot_place(tmp_path: Path) -> None:
    no_loop = MODELS["src/models/gemma3.cpp"].replace("for (int il = 0; il < n_layer; ++il)", "if (n_layer > 0)")
    root = tree(tmp_path, {**MODELS, "src/models/gemma3.cpp": no_loop})
    families = (
        genspec.Family("gemma3", "LLM_ARCH_GEMMA3"),
        genspec.Family("phi9", "LLM_ARCH_PHI9"),
        genspec.Family("llama", "LLM_ARCH_LLAMA"),
    )
    facts = _facts(root, *families)
    facts["phi9"] = genfacts.ArchFacts("LLM_ARCH_PHI9", "phi9", None)
    before = {p: (root / p).read_bytes() for p in MODELS}
    with pytest.raises(QueueError, match="cannot place the layer hook for 2 family") as info:
        genbuiltin.builtin_edit(root, families, facts)
    details = info.value.details or ""
    assert "family gemma3: src/models/gemma3.cpp: no layer loop" in details
    assert "family phi9: llama_model_mapping in src/llama-model.cpp creates no class for LLM_ARCH_PHI9" in details
    assert "family llama" not in details
    assert before["src/models/gemma3.cpp"] == (root / "src/models/gemma3.cpp").read_bytes()


def test_split_by_family_claims_every_file_once() -> None:
    llama = genspec.Family("llama", "LLM_ARCH_LLAMA", ("src/models/llama.cpp", "docs/llama/*"))
    gpt2 = genspec.Family("gpt2", "LLM_ARCH_GPT2")
    facts = {
        "llama": genfacts.ArchFacts("LLM_ARCH_LLAMA", "llama", None),
        "gpt2": genfacts.ArchFacts("LLM_ARCH_GPT2", "gpt2", "c", "src/models/gpt2.cpp", "c"),
    }
    changed = {"src/models/llama.cpp": "M", "docs/llama/notes.md": "A", "src/models/gpt2.cpp": "M"}
    assert generate.split_by_family(changed, (llama, gpt2), facts) == {
        "llama": ["docs/llama/notes.md", "src/models/llama.cpp"],
        "gpt2": ["src/models/gpt2.cpp"],
    }
    with pytest.raises(QueueError) as info:
        generate.split_by_family({"src/llama.cpp": "M", "src/models/llama.cpp": "M"}, (llama, gpt2), facts)
    details = info.value.details or ""
    assert "src/llama.cpp: changed, but in no family's paths" in details
    assert "family gpt2: the generator changed none of its paths (src/models/gpt2.cpp)" in details
    both = genspec.Family("gpt2", "LLM_ARCH_GPT2", ("src/models/*.cpp",))
    with pytest.raises(QueueError, match="do not split") as info:
        generate.split_by_family({"src/models/llama.cpp": "M"}, (llama, both), facts)
    assert "several families (llama, gpt2)" in (info.value.details or "")


def test_generator_identity_follows_its_files(tmp_path: Path) -> None:
    script = tmp_path / "tools" / "gen.py"
    script.parent.mkdir()
    script.write_text("print(1)\n")
    gen = Generator(("python3", "tools/gen.py", "--fast"))
    assert gen.files(tmp_path) == [script.resolve()]
    first = genmanifest.identity(gen, tmp_path)
    assert first.startswith("command sha256:") and first == genmanifest.identity(gen, tmp_path)
    script.write_text("print(2)\n")
    assert genmanifest.identity(gen, tmp_path) != first
    assert genmanifest.identity(Generator(("python3", "tools/gen.py")), tmp_path) != genmanifest.identity(gen, tmp_path)
    assert genmanifest.identity(Generator(), tmp_path) == f"builtin {genmanifest.GENERATOR_VERSION}"


def test_manifest_digest_covers_every_input_and_shard() -> None:
    inputs = genmanifest.input_lines("builtin v", "s" * 64, "p" * 40, "l" * 64)
    base = genmanifest.manifest(inputs, {"0001-family-a.patch": b"a"})
    lines = genmanifest.manifest_lines(base)
    assert lines["shard 0001-family-a.patch"] == "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
    assert genmanifest.inputs_of(base) == {
        "generator builtin": "v",
        "pin": "p" * 40,
        "spec families.toml": "s" * 64,
        "lanes core+model_support": "l" * 64,
        "inputs": lines["inputs"],
    }
    variants = [
        genmanifest.manifest(
            genmanifest.input_lines("builtin w", "s" * 64, "p" * 40, "l" * 64), {"0001-family-a.patch": b"a"}
        ),
        genmanifest.manifest(
            genmanifest.input_lines("builtin v", "t" * 64, "p" * 40, "l" * 64), {"0001-family-a.patch": b"a"}
        ),
        genmanifest.manifest(
            genmanifest.input_lines("builtin v", "s" * 64, "q" * 40, "l" * 64), {"0001-family-a.patch": b"a"}
        ),
        genmanifest.manifest(
            genmanifest.input_lines("builtin v", "s" * 64, "p" * 40, "m" * 64), {"0001-family-a.patch": b"a"}
        ),
        genmanifest.manifest(inputs, {"0001-family-a.patch": b"b"}),
    ]
    digests = {genmanifest.manifest_lines(v)["sha256"] for v in variants}
    assert len(digests) == 5 and lines["sha256"] not in digests
    # the shards are not inputs: a different patch keeps the inputs' digest
    assert genmanifest.inputs_of(variants[-1]) == genmanifest.inputs_of(base)
