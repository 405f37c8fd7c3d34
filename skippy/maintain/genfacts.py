"""The tree's facts about each family of the generated lane: its arch's GGUF name, model class, graph builder.

Read with the C++ parser: ``LLM_ARCH_NAMES`` (``src/llama-arch.cpp``), the class
``llama_model_mapping`` creates (``src/llama-model.cpp``) and the file holding that class's graph
builder, or the builder it shares in ``models.h``; and the files a family's patch may change.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import QueueError
from skippy.maintain import cppscan, graphcode
from skippy.maintain.genspec import Family

MODELS_DIR = "src/models"
MODELS_H = "src/models/models.h"
ARCH_CPP = "src/llama-arch.cpp"
MODEL_CPP = "src/llama-model.cpp"


@dataclass(frozen=True)
class ArchFacts:
    arch: str
    gguf_name: str
    model_class: str | None
    #: the file holding the graph builder the class uses, and that builder's class
    builder_file: str | None = None
    builder_class: str | None = None


def arch_facts(
    families: Sequence[Family],
    arch_cpp: str | None,
    model_cpp: str | None,
    *,
    where: str,
    builders: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, ArchFacts]:
    """What the tree says about each family's arch; QueueError naming unknown arches.
    ``builders``: model class -> (file, builder class) (:func:`builder_files`)."""
    names = cppscan.arch_names(arch_cpp or "")
    classes = graphcode.arch_classes((model_cpp or "").encode())
    facts: dict[str, ArchFacts] = {}
    unknown: list[str] = []
    for family in families:
        if family.arch not in names:
            close = difflib.get_close_matches(family.arch, list(names), n=3, cutoff=0.6)
            hint = f" (closest: {', '.join(close)})" if close else ""
            unknown.append(f"family {family.name}: {family.arch} is not in LLM_ARCH_NAMES of {ARCH_CPP}{hint}")
            continue
        model = classes.get(family.arch)
        file, builder = (builders or {}).get(model or "", (None, None))
        facts[family.name] = ArchFacts(family.arch, names[family.arch], model, file, builder)
    if unknown:
        raise QueueError(
            f"{len(unknown)} family arch(es) are unknown to the tree the generated lane applies to ({where})",
            details="\n".join(unknown),
            untouched="everything: the generated lane was not changed",
            next_step="fix the arch names in generated/families.toml (or add the arch in the model_support lane)",
        )
    return facts


def builder_files(tree: Path) -> dict[str, tuple[str, str]]:
    """model class -> (the file of the graph builder it uses, that builder's class), read from the
    tree's ``src/models/*.cpp`` and ``models.h`` with the C++ parser."""
    folder = tree / MODELS_DIR
    own: dict[str, str] = {}
    if folder.is_dir():
        for path in sorted(folder.glob("*.cpp")):
            rel = f"{MODELS_DIR}/{path.name}"
            for family_class, _name, _line in graphcode.find_builders(path.read_bytes()):
                own.setdefault(family_class, rel)
    out = {cls: (rel, cls) for cls, rel in own.items()}
    header = tree / MODELS_H
    if header.is_file():
        for cls, shared in graphcode.shared_graphs(header.read_bytes()).items():
            if cls not in out and shared in own:
                out[cls] = (own[shared], shared)
    return out


def family_paths(family: Family, fact: ArchFacts) -> tuple[str, ...]:
    """The globs of the family's files: the spec's, else its graph builder's file."""
    if family.paths:
        return family.paths
    return (fact.builder_file,) if fact.builder_file else ()
