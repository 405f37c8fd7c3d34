"""Which model families a change of the llama.cpp tree touches, read with the C++ parser.

A build after a queue change spot-checks, besides the default model, the families the change
touches (:mod:`skippy.flows.follow`).  Between two trees of the workdir (a baseline commit and
a new commit, or the work tree), a family is touched when:

* a definition of its class in a family file (``src/models/*.cpp``) changed, was added or was
  removed, compared definition by definition (whitespace aside): a change to
  ``llama_model_qwen2::graph::graph`` touches every arch that a switch of
  ``src/llama-model.cpp`` makes a ``llama_model_qwen2`` for (``case LLM_ARCH_QWEN2: return new
  llama_model_qwen2(params);``);
* graph code it builds with changed: it uses another family's builder (``using graph =
  llama_model_bert::graph;``, or derives with no ``graph`` of its own: read by
  :func:`skippy.maintain.graphcode.shared_graphs`), or its ``struct graph`` derives from a shared
  graph base (``llm_build_mamba_base``, defined in ``src/models/mamba-base.cpp``) or from another
  family's graph; all read from ``src/models/models.h``, followed transitively;
* a member it inherits changed (``struct llama_model_mistral4 : public llama_model_deepseek2``);
* its arch's case in a switch over ``LLM_ARCH_*`` of ``src/llama-model.cpp`` was added, dropped,
  or its branch changed.

A change in a family file outside its definitions (an include, a free helper function) touches
every class the file defines.  Shared files (``models.h``, ``llama-graph.cpp`` ...) touch no family
by themselves: the default model covers them.  A family is named by its arch's GGUF name
(``LLM_ARCH_NAMES`` in ``src/llama-arch.cpp``); ``LLM_ARCH_UNKNOWN`` and ``LLM_ARCH_CLIP`` are no
families.

The parser is cppparse's (tree-sitter-cpp); nothing here matches C++ with regular expressions
(the arch names come from :func:`skippy.maintain.cppscan.arch_names`).  :func:`families_touched` is
pure over two readers (path -> bytes, or None when the tree has no such file);
:func:`touched_between` and :func:`touched_in_work_tree` read them with git.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import tree_sitter

from skippy.core.git import Repo
from skippy.maintain.cppparse import function_name, node_text, parse, walk
from skippy.maintain.cppscan import ARCH_PREFIX, arch_names
from skippy.maintain.graphcode import FAMILY_PREFIX, NOT_MODEL_ARCHS, arch_classes, find_builders, shared_graphs

#: the family files, and the files read beside them
MODELS_DIR: Final = "src/models/"
MODELS_H: Final = "src/models/models.h"
MODEL_CPP: Final = "src/llama-model.cpp"
ARCH_CPP: Final = "src/llama-arch.cpp"

#: one tree: a path's bytes, or None when the tree has no such file
Reader = Callable[[str], bytes | None]


@dataclass(frozen=True)
class Touched:
    """A family the change touches: its GGUF name, its ``LLM_ARCH_*`` and why."""

    family: str
    arch: str
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"family": self.family, "arch": self.arch, "reasons": list(self.reasons)}


# --- the parse tree ---------------------------------------------------------------------


def _squash(text: str) -> str:
    return " ".join(text.split())


def _scope_name(node: tree_sitter.Node) -> str:
    """``llama_model_x`` of ``llama_model_x``, ``llama_model_x::graph`` or ``graph<iswa>``."""
    while node.type == "qualified_identifier":
        scope = node.child_by_field_name("scope")
        if scope is None:
            break
        node = scope
    if node.type == "template_type":
        name = node.child_by_field_name("name")
        return node_text(name) if name is not None else node_text(node)
    return node_text(node)


def _function_of(node: tree_sitter.Node) -> str:
    """The name of the function that encloses ``node`` (whitespace collapsed)."""
    parent = node.parent
    while parent is not None and parent.type != "function_definition":
        parent = parent.parent
    name = None if parent is None else function_name(parent)
    return "file scope" if name is None else _squash(node_text(name))


# --- the definitions of a family file -----------------------------------------------------


@dataclass(frozen=True)
class Definition:
    """A function definition of a family file."""

    #: as written, whitespace collapsed (``llama_model_x::graph<iswa>::graph``)
    name: str
    #: the class it belongs to (``llama_model_qwen2``, ``llm_build_mamba_base``), None for a free function
    owner: str | None
    #: graph code: a member of a nested ``graph*`` struct of a family, or of a shared graph base
    graph: bool
    #: its text, whitespace collapsed
    body: str = field(repr=False)


@dataclass(frozen=True)
class FamilyFile:
    """What a family file defines, and what it holds outside its definitions."""

    definitions: Mapping[str, Definition]
    #: the text outside the definitions (includes, instantiations, globals), whitespace collapsed
    rest: str = field(repr=False)

    @property
    def owners(self) -> set[str]:
        return {d.owner for d in self.definitions.values() if d.owner is not None}


def read_family_file(source: bytes) -> FamilyFile:
    """The function definitions of ``source`` by name (a second one of the same name gets ``#2``)."""
    root = parse(source).root_node
    found: dict[str, Definition] = {}
    spans: list[tuple[int, int]] = []
    builders = {name for _cls, name, _line in find_builders(source)}
    for node in walk(root, opaque=frozenset({"compound_statement", "field_declaration_list"})):
        if node.type != "function_definition":
            continue
        named = function_name(node)
        if named is None:
            continue
        name = _squash(node_text(named))
        owner = _scope_name(named) if named.type == "qualified_identifier" else None
        member = named.child_by_field_name("name") if named.type == "qualified_identifier" else None
        nested = _scope_name(member) if member is not None and member.type == "qualified_identifier" else ""
        family = owner is not None and owner.startswith(FAMILY_PREFIX)
        graph = name in builders or (family and nested.startswith("graph")) or (owner is not None and not family)
        key, n = name, 1
        while key in found:
            n += 1
            key = f"{name}#{n}"
        found[key] = Definition(key, owner, graph, _squash(node_text(node)))
        spans.append((node.start_byte, node.end_byte))
    rest, at = [], 0
    for start, end in sorted(spans):
        rest.append(source[at:start])
        at = max(at, end)
    rest.append(source[at:])
    return FamilyFile(found, _squash(b"".join(rest).decode("utf-8", "replace")))


# --- models.h: who builds with whom, who derives from whom --------------------------------


@dataclass(frozen=True)
class Classes:
    """The family classes of ``models.h`` and what they share."""

    #: family -> the family whose builder it uses (an alias, or derived with no graph of its own)
    shared: Mapping[str, str] = field(default_factory=dict)
    #: family -> the family it derives from
    bases: Mapping[str, str] = field(default_factory=dict)
    #: family -> the classes its nested ``graph*`` structs derive from (``llm_build_mamba_base``,
    #: another family whose ``graph`` it extends)
    graph_bases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def graph_users(self, owner: str) -> dict[str, str]:
        """The families whose graph is built with ``owner``'s graph code, each with how (transitive)."""
        found: dict[str, str] = {}
        todo = [(owner, owner)]
        while todo:
            current, chain = todo.pop()
            users = {f for f, used in self.shared.items() if used == current}
            users |= {f for f, bases in self.graph_bases.items() if current in bases and f != current}
            for user in sorted(users - set(found) - {owner}):
                found[user] = f"{user} builds its graph with {chain}"
                todo.append((user, f"{user} -> {chain}"))
        return found

    def heirs(self, owner: str) -> dict[str, str]:
        """The families that derive from ``owner`` (transitively), each with how."""
        found: dict[str, str] = {}
        todo = [owner]
        while todo:
            current = todo.pop()
            for heir in sorted(f for f, base in self.bases.items() if base == current and f not in found):
                found[heir] = f"{heir} derives from {current}"
                todo.append(heir)
        return found


def _base_names(specifier: tree_sitter.Node) -> list[str]:
    return [
        _scope_name(b)
        for clause in specifier.named_children
        if clause.type == "base_class_clause"
        for b in clause.named_children
        if b.type in ("type_identifier", "qualified_identifier", "template_type")
    ]


def read_classes(models_h: bytes | None) -> Classes:
    """:class:`Classes` from ``models.h`` (none without one)."""
    if models_h is None:
        return Classes()
    bases: dict[str, str] = {}
    graph_bases: dict[str, tuple[str, ...]] = {}
    for node in walk(parse(models_h).root_node, opaque=frozenset({"compound_statement"})):
        name, body = node.child_by_field_name("name"), node.child_by_field_name("body")
        if node.type != "struct_specifier" or name is None or body is None:
            continue
        family = node_text(name)
        if not family.startswith(FAMILY_PREFIX):
            continue
        direct = [b for b in _base_names(node) if b.startswith(FAMILY_PREFIX) and b != FAMILY_PREFIX + "base"]
        if direct:
            bases[family] = direct[0]
        used: list[str] = []
        for inner in walk(body, opaque=frozenset({"compound_statement"})):
            inner_name = inner.child_by_field_name("name")
            if (
                inner.type == "struct_specifier"
                and inner_name is not None
                and node_text(inner_name).startswith("graph")
            ):
                used += [b for b in _base_names(inner) if not b.startswith("graph") and b != family]
        if used:
            graph_bases[family] = tuple(dict.fromkeys(used))
    return Classes(shared_graphs(models_h), bases, graph_bases)


# --- llama-model.cpp: the switches over LLM_ARCH_* ----------------------------------------


def _arch_label(case: tree_sitter.Node) -> str | None:
    value = case.child_by_field_name("value")
    if value is None:
        return None
    if value.type == "qualified_identifier":
        value = value.child_by_field_name("name") or value
    label = node_text(value)
    return label if value.type == "identifier" and label.startswith(ARCH_PREFIX) else None


@dataclass(frozen=True)
class ArchSwitch:
    """One switch over ``LLM_ARCH_*``: each arch label with the text of the branch it runs."""

    #: the function it is in
    where: str
    branches: Mapping[str, str]


def _branches(body: tree_sitter.Node) -> dict[str, str]:
    """A switch body's arch labels -> the text of the branch each runs (labels that fall through
    share the next branch)."""
    branches: dict[str, str] = {}
    pending: list[str] = []
    for case in (c for c in body.named_children if c.type == "case_statement"):
        label = _arch_label(case)
        if label is not None:
            pending.append(label)
        value = case.child_by_field_name("value")
        statements = [s for s in case.named_children if s != value and s.type != "comment"]
        if not statements:
            continue
        branches.update(dict.fromkeys(pending, _squash(" ".join(node_text(s) for s in statements))))
        pending = []
    branches.update(dict.fromkeys(pending, ""))  # labels at the end, with no statement
    return branches


def arch_switches(source: bytes) -> dict[str, ArchSwitch]:
    """Every switch of ``source`` with ``LLM_ARCH_*`` case labels, keyed by where it is (the
    function, the switch's subject, and which of the same)."""
    found: dict[str, ArchSwitch] = {}
    for node in walk(parse(source).root_node):
        body = node.child_by_field_name("body") if node.type == "switch_statement" else None
        if body is None:
            continue
        branches = _branches(body)
        if not branches:
            continue
        condition = node.child_by_field_name("condition")
        subject = _squash(node_text(condition)) if condition is not None else "()"
        where = f"{_function_of(node)} switch {subject}"
        key, n = where, 1
        while key in found:
            n += 1
            key = f"{where} #{n}"
        found[key] = ArchSwitch(_function_of(node), branches)
    return found


def _switch_reasons(old: Mapping[str, ArchSwitch], new: Mapping[str, ArchSwitch]) -> dict[str, list[str]]:
    """arch -> why: its case added to, dropped from, or changed in a switch of llama-model.cpp."""
    reasons: dict[str, list[str]] = {}
    for key in sorted(set(old) | set(new)):
        before = old[key].branches if key in old else {}
        after = new[key].branches if key in new else {}
        where = (new.get(key) or old[key]).where
        for arch in sorted(set(before) | set(after)):
            if arch not in before:
                verb = "added to"
            elif arch not in after:
                verb = "dropped from"
            elif before[arch] != after[arch]:
                verb = "changed in"
            else:
                continue
            reasons.setdefault(arch, []).append(f"{MODEL_CPP}: case {arch} {verb} the switch in {where}")
    return reasons


# --- the families -------------------------------------------------------------------------


def _family_file_changes(path: str, old: FamilyFile, new: FamilyFile, classes: Classes) -> dict[str, list[str]]:
    """class -> why, for one family file that differs between the trees."""
    out: dict[str, list[str]] = {}

    def touch(owner: str, what: str, *, graph: bool, members: bool) -> None:
        out.setdefault(owner, []).append(f"{path}: {what}")
        related = {**(classes.graph_users(owner) if graph else {}), **(classes.heirs(owner) if members else {})}
        for other, how in related.items():
            out.setdefault(other, []).append(f"{path}: {what} ({how})")

    loose = old.rest != new.rest
    for name in sorted(set(old.definitions) | set(new.definitions)):
        before, after = old.definitions.get(name), new.definitions.get(name)
        if before is not None and after is not None and before.body == after.body:
            continue
        verb = "added" if before is None else "removed" if after is None else "changed"
        definition = after or before
        assert definition is not None
        if definition.owner is None:
            loose = True  # a free helper: whatever in the file calls it
            continue
        # graph code reaches the families that build with it; another member, the families that inherit it
        touch(definition.owner, f"{definition.name} {verb}", graph=definition.graph, members=not definition.graph)
    if loose:
        for owner in sorted(old.owners | new.owners):
            touch(owner, "changed outside its member functions", graph=True, members=True)
    return out


def _is_family_file(path: str) -> bool:
    return path.startswith(MODELS_DIR) and path.endswith(".cpp") and "/" not in path[len(MODELS_DIR) :]


def _class_reasons(family_files: list[str], base: Reader, new: Reader) -> dict[str, list[str]]:
    """class -> why, over the family files that differ."""
    if not family_files:
        return {}
    classes_new, classes_old = read_classes(new(MODELS_H)), read_classes(base(MODELS_H))
    classes = Classes(
        {**classes_old.shared, **classes_new.shared},
        {**classes_old.bases, **classes_new.bases},
        {**classes_old.graph_bases, **classes_new.graph_bases},
    )
    by_class: dict[str, list[str]] = {}
    for path in family_files:
        old, now = read_family_file(base(path) or b""), read_family_file(new(path) or b"")
        for owner, why in _family_file_changes(path, old, now, classes).items():
            by_class.setdefault(owner, []).extend(why)
    return by_class


def families_touched(changed: Iterable[str], base: Reader, new: Reader) -> tuple[Touched, ...]:
    """The families a change touches (pure over the two trees' readers), sorted by family.

    ``changed``: the paths that differ between the trees (only family files and
    ``src/llama-model.cpp`` are read; the others touch no family)."""
    paths = sorted(set(changed))
    family_files = [p for p in paths if _is_family_file(p)]
    if not family_files and MODEL_CPP not in paths:
        return ()
    by_class = _class_reasons(family_files, base, new)
    model_old, model_new = base(MODEL_CPP), new(MODEL_CPP)
    switches_old = arch_switches(model_old) if model_old is not None else {}
    switches_new = switches_old if model_new == model_old else arch_switches(model_new or b"")
    # a class's archs: those llama_model_mapping makes one for, in either tree
    makes: dict[str, set[str]] = {}
    for model in (model_old, model_new):
        for arch, cls in arch_classes(model or b"").items():
            makes.setdefault(cls, set()).add(arch)
    by_arch: dict[str, list[str]] = {}
    for cls, why in by_class.items():
        for arch in sorted(makes.get(cls, ())):
            by_arch.setdefault(arch, []).extend(why)
    for arch, why in _switch_reasons(switches_old, switches_new).items():
        by_arch.setdefault(arch, []).extend(why)
    names = {**arch_names(_decoded(base(ARCH_CPP))), **arch_names(_decoded(new(ARCH_CPP)))}
    touched = [
        Touched(names.get(arch) or arch.removeprefix(ARCH_PREFIX).lower(), arch, tuple(dict.fromkeys(why)))
        for arch, why in by_arch.items()
        if arch not in NOT_MODEL_ARCHS
    ]
    return tuple(sorted(touched, key=lambda t: (t.family, t.arch)))


def _decoded(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "replace")


# --- from git -----------------------------------------------------------------------------


def at_commit(repo: Repo, commit: str) -> Reader:
    """A reader of ``commit``'s files."""

    def read(path: str) -> bytes | None:
        result = repo.git("cat-file", "blob", f"{commit}:{path}", check=False)
        return result.stdout.encode("utf-8") if result.ok else None

    return read


def in_work_tree(root: Path) -> Reader:
    """A reader of the work tree's files (a link or a folder is no file)."""

    def read(path: str) -> bytes | None:
        target = root / path
        return target.read_bytes() if target.is_file() and not target.is_symlink() else None

    return read


def _names(output: str) -> list[str]:
    return [p for p in output.split("\0") if p]


def touched_between(repo: Repo, base: str, new: str) -> tuple[Touched, ...]:
    """The families touched between two commits of ``repo``."""
    changed = _names(repo.git("diff", "--name-only", "--no-renames", "-z", base, new, "--").stdout)
    return families_touched(changed, at_commit(repo, base), at_commit(repo, new))


def touched_in_work_tree(repo: Repo, base: str) -> tuple[Touched, ...]:
    """The families touched between ``base`` and the work tree as it stands (staged or not, and the
    untracked files git does not ignore); read-only git commands."""
    changed = _names(repo.git("diff", "--name-only", "--no-renames", "-z", base, "--").stdout)
    changed += _names(repo.git("ls-files", "--others", "--exclude-standard", "-z").stdout)
    return families_touched(changed, at_commit(repo, base), in_work_tree(repo.path))
