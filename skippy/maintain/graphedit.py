"""Graph-code edits for the generated lane: a layer hook in each family's graph builder.

Given the bytes of a family file (``src/models/<family>.cpp``), find the
family's graph builder, the constructor ``llama_model_<family>::graph::graph``
in any of its shapes (a plain one; ``template <bool iswa>
llama_model_x::graph<iswa>::graph``; explicit specializations such as
``template <> llama_model_t5::graph<true>::graph``, one builder each), find
its layer loop (a ``for`` over ``il``), and insert::

    llama_skippy_layer_hook(this, cur, il);

right after the loop's anchor, the statement ``cb(cur, "l_out", il);`` that
names the layer's output (the tensor passed is the anchor's own first
argument).  The name follows the core lane's trace point
(``llama_skippy_graph_hook`` in ``src/skippy-hooks.cpp``): the layer hook is
its per-layer sibling.  The core lane is to declare it (the shipped queue
does not yet: nothing here is wired into ``invoke generate``).

Placement rules, per layer loop:

* the last statement of the loop body that is an anchor or holds one decides:
  an anchor: the hook goes after it (an earlier anchor of the same body is an
  intermediate name, as in bitnet's two ``l_out``); an ``if`` with an ``else``
  whose every branch ends the same way (gptneox's parallel and sequential
  residuals): one hook per branch; anything else (an anchor on some paths
  only) is ambiguous, and an error.
* a loop with no anchor: the hook goes at the end of the loop body, passing
  the variable the body's last assignment sets (``inpL = cur;``: the input of
  the next layer), when that is unambiguous: the builder has one layer loop,
  no ``continue`` skips the end of the body, and the last statement (past
  trailing ``cb(...)`` calls) is a plain assignment.  Otherwise an error
  names the file, the line and the reason.
* a builder with several layer loops: the loops with anchors are placed and
  the others are reported as skipped; several loops and no anchor is an
  error.  A builder without a layer loop (an encoder's feature fusion) is
  skipped; a family none of whose builders has one is an error.

:func:`rewrite_tree` runs this over a whole tree's family files and sorts
them: edited, refused (why), using another family's builder (read from
``models.h``: ``using graph = llama_model_bert::graph;`` or a derived class),
or no family at all (a stub, a base class); ``covering`` names the file whose
edit covers a family class.

Edits are insertions at byte offsets taken from the parse tree, applied from
the end; the source is never matched with regular expressions.  A second pass
over the result changes nothing: a hook already right after its anchor (or
ending the body) is recognised, and a hook anywhere else in a layer loop is
an error (a stale hand edit).  A builder holding a parse error is refused
rather than edited around.

The parser is :mod:`skippy.maintain.cppparse`'s (tree-sitter-cpp: why it and not libclang is
told there); the builders and the families sharing one are found by :mod:`skippy.maintain.graphcode`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import tree_sitter

from skippy.core.errors import GraphEditError
from skippy.maintain.cppparse import error_count, error_nodes, node_text, parse, start_line, walk
from skippy.maintain.graphcode import Builder, family_builders, family_class_for, shared_graphs

#: the call inserted at each layer boundary (declared by the core lane)
HOOK = "llama_skippy_layer_hook"
#: the callback name that marks a layer's output in llama.cpp's graph code
ANCHOR_NAME = "l_out"
#: the loop variable of llama.cpp's layer loops (and the third argument of ``cb``)
LAYER_VAR = "il"

_LOOPS = frozenset({"for_statement", "for_range_loop", "while_statement", "do_statement"})
_OPAQUE = frozenset({"lambda_expression"}) | _LOOPS


@dataclass(frozen=True)
class Placement:
    """One hook: where it goes (a byte offset in the source read) and what it passes."""

    builder: str
    line: int  # 1-based line of the anchor (or of the statement the hook follows)
    how: Literal["anchor", "end of loop body"]
    tensor: str
    offset: int
    text: str  # the bytes inserted at offset, decoded
    done: bool  # already in the source (a second pass)


@dataclass(frozen=True)
class Skipped:
    builder: str
    reason: str


@dataclass(frozen=True)
class FamilyEdit:
    path: str
    family_class: str
    builders: tuple[str, ...]
    placements: tuple[Placement, ...]
    skipped: tuple[Skipped, ...]
    source: bytes = field(repr=False)  # the edited source (the input when nothing changed)

    @property
    def changed(self) -> bool:
        return any(not p.done for p in self.placements)


def anchors_in_loops(definition: tree_sitter.Node) -> int:
    """How many ``cb(..., "l_out", il)`` statements a builder holds inside a ``for`` loop (a census,
    apart from the placement rules)."""
    count = 0
    for node in walk(definition):
        if _anchor_tensor(node) is None:
            continue
        parent = node.parent
        while parent is not None and parent != definition and parent.type != "for_statement":
            parent = parent.parent
        count += parent is not None and parent.type == "for_statement"
    return count


# --- statements -------------------------------------------------------------------------


def _call(statement: tree_sitter.Node) -> tuple[str, list[tree_sitter.Node]] | None:
    """``f(a, b);`` as an expression statement -> ``("f", [a, b])``."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    call = statement.named_children[0]
    if call.type != "call_expression":
        return None
    function, arguments = call.child_by_field_name("function"), call.child_by_field_name("arguments")
    if function is None or arguments is None or function.type != "identifier":
        return None
    return node_text(function), [a for a in arguments.named_children if a.type != "comment"]


def _anchor_tensor(statement: tree_sitter.Node) -> str | None:
    """The tensor of ``cb(<tensor>, "l_out", il);``, or None when the statement is not an anchor."""
    call = _call(statement)
    if call is None or call[0] != "cb" or len(call[1]) != 3:
        return None
    tensor, name, layer = call[1]
    if tensor.type != "identifier" or name.type != "string_literal" or node_text(layer) != LAYER_VAR:
        return None
    content = [c for c in name.named_children if c.type == "string_content"]
    if len(content) != 1 or node_text(content[0]) != ANCHOR_NAME:
        return None
    return node_text(tensor)


def _is_hook(statement: tree_sitter.Node) -> bool:
    call = _call(statement)
    return call is not None and call[0] == HOOK


def _is_cb(statement: tree_sitter.Node) -> bool:
    call = _call(statement)
    return call is not None and call[0] == "cb"


def _statements(block: tree_sitter.Node) -> list[tree_sitter.Node]:
    return [s for s in block.named_children if s.type != "comment"]


def _holds_anchor(node: tree_sitter.Node) -> bool:
    """Whether ``node`` is or holds an anchor outside nested loops and lambdas."""
    if node.type in _OPAQUE:
        return False
    return any(_anchor_tensor(n) is not None for n in walk(node, opaque=_OPAQUE))


def hook_text(tensor: str) -> str:
    return f"{HOOK}(this, {tensor}, {LAYER_VAR});"


# --- layer loops ------------------------------------------------------------------------


def _is_layer_loop(node: tree_sitter.Node) -> bool:
    if node.type != "for_statement":
        return False
    init = node.child_by_field_name("initializer")
    if init is None:
        return False
    if init.type == "declaration":
        for declarator in init.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator") or declarator
            if node_text(target) == LAYER_VAR:
                return True
        return False
    if init.type == "assignment_expression":
        left = init.child_by_field_name("left")
        return left is not None and node_text(left) == LAYER_VAR
    return False


def _layer_loops(body: tree_sitter.Node) -> list[tree_sitter.Node]:
    """The outermost ``for`` loops over ``il`` in a builder body (not inside a lambda)."""
    loops: list[tree_sitter.Node] = []
    stack = [body]
    while stack:
        node = stack.pop()
        if _is_layer_loop(node):
            loops.append(node)
            continue
        if node.type == "lambda_expression":
            continue
        stack.extend(reversed(node.children))
    return sorted(loops, key=lambda n: n.start_byte)


class _Ambiguous(Exception):
    def __init__(self, node: tree_sitter.Node, why: str) -> None:
        super().__init__(why)
        self.line = start_line(node)
        self.why = why


def _cover(block: tree_sitter.Node) -> list[tree_sitter.Node]:
    """The anchors that end every path through ``block`` (a statement or a compound)."""
    if _anchor_tensor(block) is not None:
        return [block]
    if block.type == "compound_statement":
        holding = [s for s in _statements(block) if _holds_anchor(s)]
        return _cover(holding[-1]) if holding else []
    if block.type == "if_statement":
        consequence, alternative = block.child_by_field_name("consequence"), block.child_by_field_name("alternative")
        if consequence is None or alternative is None:
            raise _Ambiguous(block, f'the last "{ANCHOR_NAME}" anchor is inside an if without an else')
        branch = next((c for c in alternative.named_children if c.type != "comment"), None)
        firsts, seconds = _cover(consequence), [] if branch is None else _cover(branch)
        if not firsts or not seconds:
            raise _Ambiguous(block, f'only one branch of this if ends with a "{ANCHOR_NAME}" anchor')
        return firsts + seconds
    raise _Ambiguous(block, f'the last "{ANCHOR_NAME}" anchor is inside a {block.type.replace("_", " ")}')


def _indent(source: bytes, node: tree_sitter.Node) -> bytes:
    start = source.rfind(b"\n", 0, node.start_byte) + 1
    prefix = source[start : node.start_byte]
    return prefix if not prefix.strip() else b" " * (node.start_point[1])


def _newline(source: bytes) -> bytes:
    return b"\r\n" if b"\r\n" in source else b"\n"


def _after(source: bytes, statement: tree_sitter.Node, tensor: str) -> tuple[int, str, bool]:
    """(offset, text, already there) of the hook right after ``statement``."""
    text = hook_text(tensor)
    following = statement.next_named_sibling
    while following is not None and following.type == "comment":
        following = following.next_named_sibling
    done = (
        following is not None
        and _is_hook(following)
        and following.start_point[0] == statement.end_point[0] + 1
        and "".join(node_text(following).split()) == "".join(text.split())
    )
    insert = (_newline(source) + _indent(source, statement)).decode() + text
    return statement.end_byte, insert, done


def _loop_body(loop: tree_sitter.Node) -> tree_sitter.Node:
    body = loop.child_by_field_name("body")
    if body is None:
        raise _Ambiguous(loop, "the layer loop has no body")
    return body


def _anchored(source: bytes, builder: str, loop: tree_sitter.Node) -> list[Placement]:
    placements = []
    for anchor in _cover(_loop_body(loop)):
        tensor = _anchor_tensor(anchor)
        assert tensor is not None
        offset, text, done = _after(source, anchor, tensor)
        placements.append(Placement(builder, start_line(anchor), "anchor", tensor, offset, text, done))
    return placements


def _fallback(source: bytes, builder: str, loop: tree_sitter.Node) -> Placement:
    """The hook at the end of an anchorless loop body, or _Ambiguous saying why not."""
    body = _loop_body(loop)
    if body.type != "compound_statement":
        raise _Ambiguous(loop, "the layer loop has no braced body")
    for node in walk(body, opaque=_OPAQUE):
        if node.type == "continue_statement":
            raise _Ambiguous(node, f'no "{ANCHOR_NAME}" anchor, and a continue skips the end of the loop body')
    statements = _statements(body)
    rest = [s for s in statements if not _is_hook(s)]
    while rest and _is_cb(rest[-1]):
        rest.pop()
    if not rest:
        raise _Ambiguous(body, f'no "{ANCHOR_NAME}" anchor, and the loop body is empty')
    last = rest[-1]
    expression = last.named_children[0] if last.type == "expression_statement" and last.named_children else None
    left = None if expression is None else expression.child_by_field_name("left")
    operator = None if expression is None else expression.child_by_field_name("operator")
    if (
        expression is None
        or expression.type != "assignment_expression"
        or left is None
        or left.type != "identifier"
        or (operator is not None and node_text(operator) != "=")
    ):
        raise _Ambiguous(
            last,
            f'no "{ANCHOR_NAME}" anchor, and the loop body does not end by assigning the layer output '
            "to a variable (such as inpL = cur;)",
        )
    tensor = node_text(left)
    end = statements[-1]
    if _is_hook(end):
        prior = end.prev_named_sibling
        while prior is not None and prior.type == "comment":
            prior = prior.prev_named_sibling
        assert prior is not None
        offset, text, done = _after(source, prior, tensor)
        return Placement(builder, start_line(prior), "end of loop body", tensor, offset, text, done)
    offset, text, done = _after(source, end, tensor)
    return Placement(builder, start_line(end), "end of loop body", tensor, offset, text, done)


def _place_builder(source: bytes, path: str, builder: Builder) -> tuple[list[Placement], list[Skipped]]:
    errors = error_nodes(builder.node)
    if errors:
        raise GraphEditError(
            path, f"{builder.name} (line {start_line(builder.node)}) has a parse error at line {start_line(errors[0])}"
        )
    body = builder.node.child_by_field_name("body")
    loops = [] if body is None else _layer_loops(body)
    if not loops:
        return [], [Skipped(builder.name, f"no layer loop (a for over {LAYER_VAR})")]
    placements: list[Placement] = []
    skipped: list[Skipped] = []
    try:
        anchored = [loop for loop in loops if _holds_anchor(_loop_body(loop))]
        if anchored:
            for loop in loops:
                if loop in anchored:
                    placements += _anchored(source, builder.name, loop)
                else:
                    skipped.append(
                        Skipped(builder.name, f'the loop at line {start_line(loop)} has no "{ANCHOR_NAME}" anchor')
                    )
        elif len(loops) == 1:
            placements.append(_fallback(source, builder.name, loops[0]))
        else:
            lines = ", ".join(str(start_line(loop)) for loop in loops)
            raise GraphEditError(
                path, f'{builder.name} has {len(loops)} layer loops (lines {lines}) and no "{ANCHOR_NAME}" anchor'
            )
    except _Ambiguous as exc:
        raise GraphEditError(path, f"{builder.name}, line {exc.line}: {exc.why}") from None
    _check_stale(path, builder.name, loops, placements)
    return placements, skipped


def _check_stale(path: str, name: str, loops: list[tree_sitter.Node], placements: list[Placement]) -> None:
    """A hook call in a layer loop that is not where this rewrite puts it is a stale edit."""
    ours = {p.offset for p in placements if p.done}
    for loop in loops:
        for node in walk(loop, opaque=frozenset({"lambda_expression"})):
            if not _is_hook(node):
                continue
            previous = node.prev_named_sibling
            while previous is not None and previous.type == "comment":
                previous = previous.prev_named_sibling
            if previous is None or previous.end_byte not in ours:
                raise GraphEditError(
                    path,
                    f"{name}, line {start_line(node)}: a {HOOK} call is not where the rewrite places it (a stale edit)",
                )


def place_layer_hooks(source: bytes, *, path: str, family_class: str | None = None) -> FamilyEdit:
    """Insert the layer hook in every graph builder of ``family_class`` (default: the class the
    file's name gives) in ``source``; :class:`GraphEditError` when it cannot be placed."""
    family_class = family_class or family_class_for(path)
    tree = parse(source)
    builders = [b for b in family_builders(tree.root_node) if b.family_class == family_class]
    if not builders:
        raise GraphEditError(path, f"no graph builder {family_class}::graph::graph in the file")
    placements: list[Placement] = []
    skipped: list[Skipped] = []
    for builder in builders:
        placed, passed = _place_builder(source, path, builder)
        placements += placed
        skipped += passed
    if not placements:
        reasons = "; ".join(f"{s.builder}: {s.reason}" for s in skipped)
        raise GraphEditError(path, f"no layer loop to place the hook in ({reasons})")
    edited = source
    for placement in sorted(placements, key=lambda p: p.offset, reverse=True):
        if not placement.done:
            edited = edited[: placement.offset] + placement.text.encode() + edited[placement.offset :]
    if edited != source and error_count(edited) > len(error_nodes(tree.root_node)):
        raise GraphEditError(path, "the edited source parses with new errors (a bug in the rewrite)")
    return FamilyEdit(
        path=path,
        family_class=family_class,
        builders=tuple(b.name for b in builders),
        placements=tuple(placements),
        skipped=tuple(skipped),
        source=edited,
    )


# --- a whole tree -----------------------------------------------------------------------


@dataclass(frozen=True)
class TreeRewrite:
    """The rewrite over every family file of a tree, by path (``src/models/<file>.cpp``)."""

    edits: dict[str, FamilyEdit]
    refused: dict[str, str]  # path -> reason (the file has a builder the rewrite cannot place)
    sharing: dict[str, str]  # path -> the family class whose builder the family uses
    not_families: tuple[str, ...]  # no builder and none shared (a stub, a base class)

    def covering(self, family_class: str) -> str | None:
        """The path whose edit covers ``family_class``: its own file, or the file of the builder it
        shares; None when that file was refused (or there is none)."""
        by_class = {edit.family_class: path for path, edit in self.edits.items()}
        if family_class in by_class:
            return by_class[family_class]
        shared = next((cls for path, cls in self.sharing.items() if family_class_for(path) == family_class), None)
        return None if shared is None else by_class.get(shared)


def rewrite_tree(files: dict[str, bytes], models_h: bytes) -> TreeRewrite:
    """:func:`place_layer_hooks` over ``files`` (path -> bytes, the family files of one tree),
    each file classified: edited, refused (why), sharing another family's builder (from
    ``models_h``), or no family at all."""
    shared = shared_graphs(models_h)
    edits: dict[str, FamilyEdit] = {}
    refused: dict[str, str] = {}
    sharing: dict[str, str] = {}
    not_families: list[str] = []
    for path in sorted(files):
        family = family_class_for(path)
        if not any(b.family_class == family for b in family_builders(parse(files[path]).root_node)):
            if family in shared:
                sharing[path] = shared[family]
            else:
                not_families.append(path)
            continue
        try:
            edits[path] = place_layer_hooks(files[path], path=path, family_class=family)
        except GraphEditError as exc:
            refused[path] = exc.reason
    return TreeRewrite(edits, refused, sharing, tuple(not_families))
