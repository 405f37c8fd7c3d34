"""llama.cpp's graph code as the generated lane reads it: the builders, the arch classes, the shared graphs.

Read with the C++ parser (:mod:`skippy.maintain.cppparse`), never with regular expressions:

* the family graph builders of a file (:func:`find_builders`): the constructor
  ``llama_model_<family>::graph::graph`` in any of its shapes (a plain one, a
  template, explicit specializations, one builder each);
* the model class ``llama_model_mapping`` (``src/llama-model.cpp``) creates for
  each ``LLM_ARCH_*`` (:func:`arch_classes`);
* the families of ``models.h`` that build their graph with another family's
  builder (:func:`shared_graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

import tree_sitter

from skippy.maintain.cppparse import function_name, node_text, parse, qualified_parts, start_line, walk

#: the class prefix of a model family in ``src/models/models.h``
FAMILY_PREFIX = "llama_model_"
#: ``llm_arch`` values that are not model families (a quantize-only stub, the unknown arch)
NOT_MODEL_ARCHS = frozenset({"LLM_ARCH_UNKNOWN", "LLM_ARCH_CLIP"})


def family_class_for(path: str) -> str:
    """``src/models/granite-moe.cpp`` -> ``llama_model_granite_moe`` (llama.cpp's naming)."""
    return FAMILY_PREFIX + PurePosixPath(path).stem.replace("-", "_")


@dataclass(frozen=True)
class Builder:
    family_class: str
    name: str  # as written, whitespace collapsed
    node: tree_sitter.Node  # the function_definition


def family_builders(root: tree_sitter.Node) -> list[Builder]:
    """Every family graph builder under ``root`` (function bodies are not looked into)."""
    found: list[Builder] = []
    for node in walk(root, opaque=frozenset({"compound_statement"})):
        if node.type != "function_definition":
            continue
        name = function_name(node)
        if name is None or name.type != "qualified_identifier":
            continue
        parts = qualified_parts(name)
        if len(parts) == 3 and parts[0].startswith(FAMILY_PREFIX) and parts[1:] == ["graph", "graph"]:
            found.append(Builder(parts[0], " ".join(node_text(name).split()), node))
    return found


def builder_nodes(root: tree_sitter.Node) -> list[tree_sitter.Node]:
    """The function definitions of every family graph builder under ``root``."""
    return [b.node for b in family_builders(root)]


def find_builders(source: bytes) -> list[tuple[str, str, int]]:
    """Every family graph builder in ``source``: (family class, name as written, line)."""
    return [(b.family_class, b.name, start_line(b.node)) for b in family_builders(parse(source).root_node)]


def arch_classes(model_cpp: bytes, *, function: str = "llama_model_mapping") -> dict[str, str]:
    """``LLM_ARCH_*`` -> the model class ``function`` (in ``src/llama-model.cpp``) creates for it:
    ``case LLM_ARCH_QWEN2: return new llama_model_qwen2(params);`` (labels falling through to one
    ``return new`` all map to its class; comments and braces around the return are fine)."""
    out: dict[str, str] = {}
    for definition in walk(parse(model_cpp).root_node):
        if definition.type != "function_definition":
            continue
        name = function_name(definition)
        if name is None or node_text(name).split("::")[-1] != function:
            continue
        pending: list[str] = []
        for case in walk(definition):
            if case.type != "case_statement":
                continue
            value = case.child_by_field_name("value")
            if value is not None and value.type == "identifier":
                pending.append(node_text(value))
            created = next(
                (
                    node.child_by_field_name("type")
                    for node in walk(case, opaque=frozenset({"case_statement"}) - {case.type})
                    if node.type == "new_expression"
                ),
                None,
            )
            if created is not None:
                for arch in pending:
                    out.setdefault(arch, node_text(created))
                pending = []
            elif any(child.type not in ("comment", "identifier") for child in case.named_children):
                pending = []  # a case that does something else: no fall-through to the next class
    return out


def shared_graphs(models_h: bytes) -> dict[str, str]:
    """Families of ``models.h`` that build their graph with another family's builder: family
    class -> that class.  Either by an alias (``using graph = llama_model_bert::graph;``, or a
    template one such as ``using graph = llama_model_phi3::graph<iswa>;``) or, with no ``graph``
    of their own, by deriving from another family (``struct llama_model_qwen3tts : public
    llama_model_qwen3vl``).  Their own file has no builder; the hook placed in the other
    family's builder covers them."""
    shared: dict[str, str] = {}
    for node in walk(parse(models_h).root_node):
        if node.type != "struct_specifier":
            continue
        name, body = node.child_by_field_name("name"), node.child_by_field_name("body")
        if name is None or body is None or not node_text(name).startswith(FAMILY_PREFIX):
            continue
        members: list[tree_sitter.Node] = []
        for member in body.named_children:  # a template alias sits inside a template_declaration
            members += [member, *member.named_children] if member.type == "template_declaration" else [member]
        alias = next((t for t in map(_alias_target, members) if t is not None), None)
        own = any(_declares_graph(m) for m in members)
        bases = [
            node_text(b)
            for clause in node.named_children
            if clause.type == "base_class_clause"
            for b in clause.named_children
            if b.type == "type_identifier" and node_text(b).startswith(FAMILY_PREFIX)
        ]
        if alias is not None:
            shared[node_text(name)] = alias
        elif not own and bases and bases[0] != FAMILY_PREFIX + "base":
            shared[node_text(name)] = bases[0]
    return shared


def _alias_target(member: tree_sitter.Node) -> str | None:
    """``using graph = llama_model_x::graph[<...>];`` -> ``llama_model_x``."""
    if member.type != "alias_declaration":
        return None
    alias, target = member.child_by_field_name("name"), member.child_by_field_name("type")
    if alias is None or target is None or node_text(alias) != "graph":
        return None
    inner = target.child_by_field_name("type") or target
    parts = qualified_parts(inner) if inner.type == "qualified_identifier" else []
    if len(parts) == 2 and parts[1] == "graph" and parts[0].startswith(FAMILY_PREFIX):
        return parts[0]
    return None


def _declares_graph(member: tree_sitter.Node) -> bool:
    """A nested ``struct graph`` (or ``graph`` alias) of the family's own."""
    if member.type == "alias_declaration":
        named = member.child_by_field_name("name")
        return named is not None and node_text(named) == "graph"
    if member.type == "field_declaration":
        member = member.child_by_field_name("type") or member
    if member.type == "struct_specifier":
        named = member.child_by_field_name("name")
        return named is not None and node_text(named) == "graph"
    return False
