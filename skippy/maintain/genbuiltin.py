"""The built-in generator: the core lane's layer hook put in each family's graph builder.

The edit itself is :mod:`skippy.maintain.graphedit`'s; here each family of the spec is given
its builder's file (once: two families using one builder are refused) and every family that
cannot be placed is named in one error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from skippy.core.errors import GraphEditError, QueueError
from skippy.maintain import graphedit
from skippy.maintain.genfacts import MODEL_CPP, MODELS_DIR, ArchFacts
from skippy.maintain.genspec import Family

#: what the built-in generator reads and edits: the sandbox writes only this folder of the tree
#: (its 213 files, 3.5 MB, of the pinned tree's 3,429 files and 169 MB); a command of the user's
#: gets the whole tree, since it may read anything (or configure the build)
BUILTIN_READS = ("src",)


def builtin_edit(tree: Path, families: Sequence[Family], facts: Mapping[str, ArchFacts]) -> dict[str, str]:
    """Put the layer hook in each family's graph builder in ``tree`` (files rewritten in place);
    family -> what was placed.  One QueueError naming every family that cannot be placed."""
    problems: list[str] = []
    done: dict[str, str] = {}
    claimed: dict[str, str] = {}
    for family in families:
        fact = facts[family.name]
        if fact.builder_file is None or fact.builder_class is None:
            why = (
                f"llama_model_mapping in {MODEL_CPP} creates no class for {family.arch}"
                if fact.model_class is None
                else f"no graph builder {fact.model_class}::graph::graph in {MODELS_DIR}/ (nor one it shares)"
            )
            problems.append(f"family {family.name}: {why}")
            continue
        if fact.builder_file in claimed:
            problems.append(
                f"family {family.name}: it uses the graph builder in {fact.builder_file}, which family "
                f"{claimed[fact.builder_file]}'s patch edits already (declare one of them)"
            )
            continue
        claimed[fact.builder_file] = family.name
        path = tree / fact.builder_file
        try:
            edit = graphedit.place_layer_hooks(
                path.read_bytes(), path=fact.builder_file, family_class=fact.builder_class
            )
        except GraphEditError as exc:
            problems.append(f"family {family.name}: {exc.what}")
            continue
        if edit.changed:
            path.write_bytes(edit.source)
        placed = [p for p in edit.placements if not p.done]
        done[family.name] = (
            f"{len(placed)} layer hook(s) in {fact.builder_file} ("
            + ", ".join(f"line {p.line}, {p.how}" for p in placed)
            + ")"
        )
    if problems:
        raise QueueError(
            f"the built-in generator cannot place the layer hook for {len(problems)} family(ies)",
            details="\n".join(problems),
            untouched="everything: the generated lane was not changed",
            next_step="leave those families out of generated/families.toml, or give their layer loop a "
            'cb(cur, "l_out", il) anchor in a model_support patch; then `invoke generate`',
        )
    return done
