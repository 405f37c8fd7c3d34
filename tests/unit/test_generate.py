"""The generator's pure parts: spec validation, facts from the tree, rendering, the inputs manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.core.errors import QueueError
from skippy.maintain import generate

ARCH = 'static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n    { LLM_ARCH_GEMMA3, "gemma3" },\n};\n'
MODEL = "switch (arch) {\n    case LLM_ARCH_GEMMA3:\n        return new llama_model_gemma3(params);\n}\n"


def spec(text: str) -> generate.Spec:
    return generate.parse_spec(Path("families.toml"), text.encode())


def test_empty_spec_is_valid() -> None:
    parsed = spec("schema = 1\n")
    assert parsed.families == ()
    assert parsed.output_dir == generate.DEFAULT_OUTPUT_DIR


def test_spec_problems_are_listed_together() -> None:
    with pytest.raises(QueueError) as info:
        spec(
            'schema = 2\noutput_dir = "../x"\nbogus = 1\n'
            '[[family]]\nname = "Gemma"\narch = "LLM_ARCH_GEMMA3"\n'
            '[[family]]\nname = "a"\narch = "gemma3"\n'
            '[[family]]\nname = "b"\narch = "LLM_ARCH_B"\n'
            '[[family]]\nname = "b"\narch = "LLM_ARCH_C"\n'
            '[[family]]\nname = "c"\narch = "LLM_ARCH_B"\nx = 1\n'
        )
    details = info.value.details or ""
    for expected in (
        "unknown key(s) bogus",
        "schema 2 is not supported",
        "output_dir '../x'",
        "family 1: name 'Gemma'",
        "family a: arch 'gemma3'",
        "family b: declared twice",
        "family c: arch LLM_ARCH_B is already declared",
        "family 5: unknown key(s) x",
    ):
        assert expected in details


def test_facts_come_from_the_tree() -> None:
    families = spec('[[family]]\nname = "gemma3"\narch = "LLM_ARCH_GEMMA3"\n').families
    facts = generate.arch_facts(families, ARCH, MODEL, where="t")
    assert facts["gemma3"] == generate.ArchFacts("LLM_ARCH_GEMMA3", "gemma3", "llama_model_gemma3")
    # an older tree without the mapping: no model class, still generated
    assert generate.arch_facts(families, ARCH, None, where="t")["gemma3"].model_class is None
    unknown = spec('[[family]]\nname = "g"\narch = "LLM_ARCH_GEMMA"\n').families
    with pytest.raises(QueueError, match="unknown to the tree") as info:
        generate.arch_facts(unknown, ARCH, MODEL, where="t")
    assert "closest: LLM_ARCH_GEMMA3" in (info.value.details or "")


def test_render_is_deterministic_and_uses_the_facts() -> None:
    parsed = spec('[[family]]\nname = "gemma-3"\narch = "LLM_ARCH_GEMMA3"\n')
    (family,) = parsed.families
    facts = generate.ArchFacts("LLM_ARCH_GEMMA3", "gemma3", "llama_model_gemma3")
    text = generate.render_family(parsed, family, facts)
    assert text == generate.render_family(parsed, family, facts)
    assert 'const family_info gemma_3 = { LLM_ARCH_GEMMA3, "gemma3", "llama_model_gemma3" };' in text
    assert generate.registry_line(family, facts) == 'SKIPPY_FAMILY(gemma_3, LLM_ARCH_GEMMA3, "gemma3")\n'
    assert generate.patch_name(2, family) == "0002-family-gemma-3.patch"


def test_manifest_digest_covers_every_input() -> None:
    base = generate.manifest(
        "s" * 64, "p" * 40, "l" * 64, {"src/llama-arch.cpp": "a" * 40, "src/llama-model.cpp": None}
    )
    lines = generate.manifest_lines(base)
    assert lines["upstream src/llama-model.cpp"] == "missing"
    variants = [
        generate.manifest("t" * 64, "p" * 40, "l" * 64, {"src/llama-arch.cpp": "a" * 40}),
        generate.manifest("s" * 64, "q" * 40, "l" * 64, {"src/llama-arch.cpp": "a" * 40, "src/llama-model.cpp": None}),
        generate.manifest("s" * 64, "p" * 40, "m" * 64, {"src/llama-arch.cpp": "a" * 40, "src/llama-model.cpp": None}),
        generate.manifest("s" * 64, "p" * 40, "l" * 64, {"src/llama-arch.cpp": "b" * 40, "src/llama-model.cpp": None}),
    ]
    digests = {generate.manifest_lines(v)["sha256"] for v in variants}
    assert len(digests) == 4 and lines["sha256"] not in digests
