"""The arch dispatch of llama.cpp's C++ sources, read with the C++ parser (tree-sitter-cpp).

It finds every ``switch`` whose case labels are ``LLM_ARCH_*`` (``switch (arch)``,
``switch (model->arch)`` ...), the function that encloses it, and every table
initializer keyed by ``LLM_ARCH_*`` (``LLM_ARCH_NAMES = { { LLM_ARCH_LLAMA, "llama" }, ... }``).

The parser is :mod:`skippy.maintain.cppparse`'s.  A switch's function is its enclosing
function definition's qualified name (``llama_model::load_hparams``, a member defined in its
class body named after the class, template arguments dropped), ``<file scope>`` outside any.
A table is a declaration, a member's default value or an assignment whose value is a brace
list holding ``LLM_ARCH_*``: its entries are the arch names of its own list and the first
element of each nested list (``{ LLM_ARCH_LLAMA, "llama" }``); inside a function it is named
``function::name``.

Preprocessor conditionals: tree-sitter keeps every branch of an ``#if`` group as a preproc
node, and the cases and entries of each branch count.  A group whose branches do not each
balance their braces (``#if A  if (x) {  #else  if (y) {  #endif``) cannot be parsed that
way; its first branch alone is kept (its directive lines and the later branches are blanked,
offsets and lines kept, and the source is parsed again), so the braces pair as the compiler
sees them.  Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

import tree_sitter

from skippy.maintain.cppparse import function_name, node_text, parse, qualified_parts, walk

ARCH_PREFIX = "LLM_ARCH_"
FILE_SCOPE = "<file scope>"

_OPEN = frozenset({"#if", "#ifdef", "#ifndef"})
_ALTERNATE = frozenset({"#elif", "#elifdef", "#elifndef", "#else"})
_CLOSE = "#endif"
_DIRECTIVES = _OPEN | _ALTERNATE | {_CLOSE}
_CLASSES = frozenset({"class_specifier", "struct_specifier", "union_specifier"})
#: a line that may start or continue a conditional group (the cheap test before reading the tokens)
_CONDITIONAL_LINE = re.compile(rb"^[ \t]*#[ \t]*(?:if|el|endif)", re.M)

_TOKENS = "[" + " ".join(f'"{d}"' for d in sorted(_DIRECTIVES)) + ' "{" "}" (preproc_directive)] @token'
_FINDS = """
(switch_statement) @switch
(init_declarator value: (initializer_list)) @table
(field_declaration default_value: (initializer_list)) @table
(assignment_expression right: (initializer_list)) @table
"""


@cache
def _query(text: str) -> tree_sitter.Query:
    return tree_sitter.Query(parse(b"").language, text)


def _captures(query: str, node: tree_sitter.Node) -> dict[str, list[tree_sitter.Node]]:
    """The query's captures under ``node``, each list in source order."""
    found = tree_sitter.QueryCursor(_query(query)).captures(node)
    return {name: sorted(nodes, key=lambda n: n.start_byte) for name, nodes in found.items()}


@dataclass(frozen=True)
class ArchSwitch:
    path: str
    function: str
    line: int
    subject: str
    cases: tuple[str, ...]


@dataclass(frozen=True)
class ArchTable:
    path: str
    name: str
    line: int
    entries: tuple[str, ...]


@dataclass(frozen=True)
class FileScan:
    path: str
    switches: tuple[ArchSwitch, ...] = ()
    tables: tuple[ArchTable, ...] = ()

    def counts(self) -> dict[tuple[str, str, str], Counter[str]]:
        """(kind, path, scope) -> how often each arch appears there ("switch" scope: the function)."""
        out: dict[tuple[str, str, str], Counter[str]] = {}
        for sw in self.switches:
            out.setdefault(("switch", self.path, sw.function), Counter()).update(sw.cases)
        for table in self.tables:
            out.setdefault(("table", self.path, table.name), Counter()).update(table.entries)
        return out

    @property
    def case_count(self) -> int:
        return sum(len(s.cases) for s in self.switches)

    @property
    def entry_count(self) -> int:
        return sum(len(t.entries) for t in self.tables)


def scan(path: str, text: str) -> FileScan:
    """Every arch switch (with its enclosing function) and arch-keyed table of one C++ source."""
    source = text.encode("utf-8", "replace")
    if ARCH_PREFIX.encode() not in source:
        return FileScan(path)
    found = _captures(_FINDS, parse_one_branch(source).root_node)
    switches = [s for node in found.get("switch", []) if (s := _switch(path, node)) is not None]
    tables = [t for node in found.get("table", []) if (t := _table(path, node)) is not None]
    switches.sort(key=lambda s: s.line)
    tables.sort(key=lambda t: t.line)
    return FileScan(path, tuple(switches), tuple(tables))


def arch_names(text: str) -> dict[str, str]:
    """``LLM_ARCH_X -> "name"`` from llama-arch.cpp's name table: every brace pair of an arch and a
    string literal (``{ LLM_ARCH_LLAMA, "llama" }``)."""
    out: dict[str, str] = {}
    source = text.encode("utf-8", "replace")
    for node in _captures("(initializer_list) @list", parse(source).root_node).get("list", []):
        items = [child for child in node.named_children if child.type != "comment"]
        if len(items) == 2 and items[1].type == "string_literal":
            arch = _arch(items[0])
            if arch is not None:
                out[arch] = node_text(items[1])[1:-1]
    return out


# --- the preprocessor ------------------------------------------------------------------------


@dataclass
class _Group:
    """An open ``#if`` group: its directive lines, its branches' byte ranges and brace balances."""

    directives: list[tuple[int, int]]
    branch_start: int
    branches: list[tuple[int, int]] = field(default_factory=list)
    deltas: list[int] = field(default_factory=lambda: [0])


def parse_one_branch(source: bytes) -> tree_sitter.Tree:
    """The parse of ``source`` with the later branches of every brace-unbalanced ``#if`` group blanked."""
    tree = parse(source)
    blanks = _unbalanced(source, tree.root_node) if _CONDITIONAL_LINE.search(source) else []
    if not blanks:
        return tree
    out = bytearray(source)
    for start, end in blanks:
        for k in range(start, end):
            if out[k] not in b"\r\n":
                out[k] = 0x20
    return parse(bytes(out))


def _unbalanced(source: bytes, root: tree_sitter.Node) -> list[tuple[int, int]]:
    """The byte ranges to blank: of each conditional group where a branch leaves braces open or
    closes more than it opened, its directive lines and all branches but the first.

    Groups close innermost first, so an inner group is settled before the branch holding it is
    counted (it adds its first branch's balance when blanked, else the sum of its branches')."""
    blanks: list[tuple[int, int]] = []
    open_groups: list[_Group] = []
    for token in _captures(_TOKENS, root).get("token", []):
        if token.is_missing:
            continue  # an ``#endif`` tree-sitter's error recovery supplied
        kind = _directive(token)
        if kind is None:
            if open_groups and token.type in ("{", "}"):
                open_groups[-1].deltas[-1] += 1 if token.type == "{" else -1
            continue
        start, end = token.start_byte, _line_end(source, token.end_byte)
        if kind in _OPEN:
            open_groups.append(_Group([(start, end)], end))
            continue
        if not open_groups:
            continue
        group = open_groups[-1]
        group.branches.append((group.branch_start, start))
        group.directives.append((start, end))
        group.branch_start = end
        if kind in _ALTERNATE:
            group.deltas.append(0)
            continue
        open_groups.pop()
        balance = sum(group.deltas)
        if any(group.deltas):
            blanks += group.directives + group.branches[1:]
            balance = group.deltas[0]
        if open_groups:
            open_groups[-1].deltas[-1] += balance
    return blanks


def _directive(token: tree_sitter.Node) -> str | None:
    """``#if``, ``#else`` ... of a conditional directive's token, None for any other token."""
    if token.type in _DIRECTIVES:
        return token.type
    if token.type == "preproc_directive":  # #pragma, #error ... and a directive out of place
        word = "#" + node_text(token).lstrip("#").strip()
        return word if word in _DIRECTIVES else None
    return None


def _line_end(source: bytes, pos: int) -> int:
    """Where the preprocessor line holding ``pos`` ends (its newline; backslash continuations included)."""
    while True:
        end = source.find(b"\n", pos)
        if end < 0:
            return len(source)
        if source[end - 1 : end] != b"\\" and source[end - 2 : end] != b"\\\r":
            return end
        pos = end + 1


# --- switches ----------------------------------------------------------------------------------


def _arch(node: tree_sitter.Node | None) -> str | None:
    """``LLM_ARCH_X`` of the expression ``LLM_ARCH_X`` or ``llm_arch::LLM_ARCH_X``, else None."""
    if node is not None and node.type == "qualified_identifier":
        node = node.child_by_field_name("name")
    if node is None or node.type != "identifier":
        return None
    text = node_text(node)
    return text if text.startswith(ARCH_PREFIX) else None


def _switch(path: str, node: tree_sitter.Node) -> ArchSwitch | None:
    body = node.child_by_field_name("body")
    if body is None:
        return None
    cases = [
        arch
        for case in walk(body, opaque=frozenset({"switch_statement"}))
        if case.type == "case_statement" and (arch := _arch(case.child_by_field_name("value"))) is not None
    ]
    if not cases:
        return None
    condition = node.child_by_field_name("condition")
    subject = "" if condition is None else node_text(condition).strip().removeprefix("(").removesuffix(")")
    return ArchSwitch(path, _function_of(node) or FILE_SCOPE, _line(body), " ".join(subject.split()), tuple(cases))


def _function_of(node: tree_sitter.Node) -> str | None:
    """The qualified name of the function definition enclosing ``node``; None at file scope."""
    parent = node.parent
    while parent is not None:
        if parent.type == "function_definition":
            name = function_name(parent)
            if name is not None:
                return _qualified(parent, name)
        parent = parent.parent
    return None


def _qualified(definition: tree_sitter.Node, name: tree_sitter.Node) -> str:
    """``llama_model::load_hparams`` as written (template arguments dropped, no spaces); a member
    defined in its class body is prefixed with the classes around it."""
    parts = qualified_parts(name) if name.type == "qualified_identifier" else []
    text = "::".join(parts) if parts else node_text(name)
    text = "".join(text.split())
    if "::" in text:
        return text
    classes: list[str] = []
    parent = definition.parent
    while parent is not None:
        if parent.type in _CLASSES:
            class_name = parent.child_by_field_name("name")
            if class_name is not None:
                classes.append(node_text(class_name))
        parent = parent.parent
    return "::".join([*reversed(classes), text])


def _line(node: tree_sitter.Node) -> int:
    return node.start_point[0] + 1


# --- tables ------------------------------------------------------------------------------------


def _table(path: str, node: tree_sitter.Node) -> ArchTable | None:
    """An arch table: ``T name = {...}``, ``T name{...}``, a member's ``= {...}`` or ``name = {...};``."""
    if node.type == "init_declarator":
        value, target = node.child_by_field_name("value"), node.child_by_field_name("declarator")
    elif node.type == "field_declaration":
        value, target = node.child_by_field_name("default_value"), node.child_by_field_name("declarator")
    elif node.type == "assignment_expression":
        value, target = node.child_by_field_name("right"), node.child_by_field_name("left")
    else:
        return None
    if value is None or value.type != "initializer_list":
        return None
    entries = _entries(value)
    if not entries:
        return None
    name = _declared_name(target) or f"<table at offset {value.start_byte}>"
    function = _function_of(node)
    return ArchTable(path, f"{function}::{name}" if function else name, _line(value), tuple(entries))


def _entries(table: tree_sitter.Node) -> list[str]:
    """The arch names of the table's own list and the first element of each list nested in it."""
    found: list[tuple[int, str]] = []
    pending = [(table, True)]
    while pending:
        current, top = pending.pop()
        for node in walk(current, opaque=frozenset({"initializer_list"})):
            if node is current:
                continue
            if node.type == "initializer_list":
                first = next((c for c in node.named_children if c.type != "comment"), None)
                arch = _arch(first)
                if arch is not None and first is not None:
                    found.append((first.start_byte, arch))
                pending.append((node, False))
            elif top and node.type == "identifier" and node_text(node).startswith(ARCH_PREFIX):
                found.append((node.start_byte, node_text(node)))
    return [arch for _, arch in sorted(set(found))]


def _declared_name(node: tree_sitter.Node | None) -> str:
    """The variable a declarator or an assignment's target names (``x`` of ``x[]``, ``a.x``, ``m[k]``)."""
    while node is not None:
        if node.type in ("identifier", "field_identifier"):
            return node_text(node)
        if node.type == "qualified_identifier":
            node = node.child_by_field_name("name")
        elif node.type == "field_expression":
            node = node.child_by_field_name("field")
        elif node.type == "subscript_expression":
            node = node.child_by_field_name("argument")
        else:
            node = node.child_by_field_name("declarator")
    return ""
