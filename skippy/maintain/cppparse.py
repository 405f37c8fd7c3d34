"""The C++ parser of the queue's C++ reading, and the node helpers every reader of its trees uses.

The parse tree of a source (:func:`parse`), its nodes in source order (:func:`walk`), the
errors tree-sitter recovered from (:func:`error_nodes`), a node's text and line, the parts of a
qualified name and the name of a function definition.  The readers are the generated lane's
(:mod:`skippy.maintain.graphcode`, :mod:`skippy.maintain.graphedit`), the parity audit's
(:mod:`skippy.maintain.cppscan`), the family census (:mod:`skippy.maintain.touched`) and the
review of a pin move by function (:mod:`skippy.maintain.churn`).

The parser is tree-sitter with the tree-sitter-cpp grammar (both wheels from
the package index), chosen over libclang after measuring both on the pinned
tree's 147 family files (``nox -s bench -- --only graph-parse``).  Both find
the same 129 builders and 116 ``l_out`` anchors in layer loops.  tree-sitter
parses all 147 files in 0.26-0.44 s with no build directory, include paths or
compiler headers, and its only errors there are the explicit instantiation
lines ``template struct llama_model_x::graph<false>;`` (outside every
builder).  libclang took 185 s for them on a busy 2-core machine (about 0.6 s
of CPU per file: every file pulls in ``models.h``, ggml and the C++ standard
headers), and needs each file's compile flags (a configured build's
``compile_commands.json``, one per backend) and a compiler's builtin headers
that its wheel lacks; what it adds (types, macro expansion) the generated
lane's edits do not need.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import tree_sitter
import tree_sitter_cpp


@cache
def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cpp.language()))


def parse(source: bytes) -> tree_sitter.Tree:
    """The tree-sitter-cpp parse tree of ``source``."""
    return _parser().parse(source)


def walk(node: tree_sitter.Node, *, opaque: frozenset[str] = frozenset()) -> Iterator[tree_sitter.Node]:
    """``node`` and its descendants, in source order; below an ``opaque`` type only that node."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is node or current.type not in opaque:
            stack.extend(reversed(current.children))


def error_nodes(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    """ERROR and MISSING nodes under ``node`` (tree-sitter's local error recovery)."""
    return [n for n in walk(node) if n.type == "ERROR" or n.is_missing]


def error_count(source: bytes) -> int:
    return len(error_nodes(parse(source).root_node))


def node_text(node: tree_sitter.Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def start_line(node: tree_sitter.Node) -> int:
    return node.start_point[0] + 1


def qualified_parts(node: tree_sitter.Node) -> list[str]:
    """``a::graph<iswa>::graph`` -> ``["a", "graph", "graph"]`` (template arguments dropped)."""
    parts: list[str] = []
    current: tree_sitter.Node | None = node
    while current is not None and current.type == "qualified_identifier":
        scope = current.child_by_field_name("scope")
        if scope is None:
            return []
        if scope.type == "template_type":
            name = scope.child_by_field_name("name")
            parts.append(node_text(name) if name is not None else "")
        else:
            parts.append(node_text(scope))
        current = current.child_by_field_name("name")
    if current is not None and current.type == "template_type":
        current = current.child_by_field_name("name")
    if current is None:
        return []
    parts.append(node_text(current))
    return parts


def function_name(definition: tree_sitter.Node) -> tree_sitter.Node | None:
    declarator = definition.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return None if declarator is None else declarator.child_by_field_name("declarator")
