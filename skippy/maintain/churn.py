"""A pin move reviewed by function: what each patch changes, and what upstream did there.

For a move OLD -> NEW, :func:`churn_map` lists, for each patch of the queue, the
*entities* it changes (functions by file and qualified name, and the enums, types
and file-scope tables it edits), and for each of them the upstream commits of
OLD..NEW that change the same entity, with what each did there:

* ``body edited``: its statements changed;
* ``statements reordered``: statements both sides hold run in another order (a
  check moved ahead of a call: the change that applies cleanly, compiles, and
  breaks the behaviour);
* ``signature changed``: the text before its body (return type, parameters,
  qualifiers, a constructor's initializers) changed;
* ``renamed to <name>``, ``moved to <file>``, ``deleted``.

An entity is followed through renames and moves: a later commit that edits the
renamed function is counted against the patch too.  Patches are ranked by
exposure: how many (entity, upstream commit) pairs touch them, the kinds that
break behaviour silently (reordered, signature, renamed, moved, deleted) weighing
double.

How: the queue is applied to OLD in a temporary index (``git apply --cached
--3way``, nothing checked out), one tree per patch; the two sides of every patch
and of every upstream commit are parsed with tree-sitter-cpp (the parser of the
generated lane, :mod:`skippy.maintain.cppparse`) and compared entity by entity,
with comments and whitespace ignored.  Only the files a patch changed are ever
parsed, and each version of a file once.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Final

import tree_sitter

from skippy.core import gitbulk
from skippy.core.annotations import Annotation, patch_line
from skippy.core.git import Repo
from skippy.maintain.cppparse import function_name, node_text, parse, walk
from skippy.maintain.upstream_log import UpstreamCommit, upstream_commits
from skippy.queue.indexapply import IndexApplier
from skippy.queue.model import Queue

#: the files parsed as C or C++ (CUDA, Metal and Objective-C++ are close enough for tree-sitter-cpp)
CPP_SUFFIXES: Final[frozenset[str]] = frozenset(
    {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".inc", ".cu", ".cuh", ".metal", ".mm", ".m"}
)
#: the exposure from which a patch is annotated in CI (one silent change, or two edits)
HIGH_EXPOSURE: Final[int] = 2
#: git's empty tree: the parent side of a root commit
EMPTY_TREE: Final[str] = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
#: what an upstream commit can do to an entity, the ones that break behaviour without a conflict first
SILENT: Final[tuple[str, ...]] = ("statements reordered", "signature changed", "renamed", "moved", "deleted")
#: how alike two bodies must be (difflib's ratio over their tokens) to call a vanished entity renamed
RENAME_RATIO: Final[float] = 0.6
#: statements that hold other statements: their own text is their head (the nested ones are their own)
_NESTED_FIELDS: Final[tuple[str, ...]] = ("body", "consequence", "alternative")
_TEXT_LIMIT: Final[int] = 4 * 1024 * 1024  # a file bigger than this is not parsed (generated data)


def is_cpp(path: str) -> bool:
    return PurePosixPath(path).suffix.lower() in CPP_SUFFIXES


# --------------------------------------------------------------------------- entities of a source


def _tokens(node: tree_sitter.Node, skip: Sequence[tuple[int, int]] = ()) -> tuple[str, ...]:
    """The leaf tokens under ``node`` (comments dropped), leaving out the byte ranges ``skip``."""
    out: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == "comment":
            continue
        if any(a <= current.start_byte and current.end_byte <= b for a, b in skip):
            continue
        if current.child_count == 0 or current.type in ("string_literal", "raw_string_literal", "char_literal"):
            out.append(node_text(current))
            continue
        stack.extend(reversed(current.children))
    return tuple(out)


def _is_statement(node: tree_sitter.Node) -> bool:
    return (node.type.endswith("_statement") and node.type != "compound_statement") or (
        node.type == "declaration" and node.parent is not None and node.parent.type == "compound_statement"
    )


def _statements(body: tree_sitter.Node) -> tuple[str, ...]:
    """Every statement under ``body`` in source order, each as its own tokens (a compound statement's
    head only: ``if (x)``, ``for (...)``; the statements it holds come after it)."""
    out: list[str] = []
    for node in walk(body):
        if not _is_statement(node):
            continue
        nested = [
            (child.start_byte, child.end_byte)
            for name in _NESTED_FIELDS
            if (child := node.child_by_field_name(name)) is not None
        ]
        nested += [(c.start_byte, c.end_byte) for c in node.children if c.type in ("else_clause", "case_statement")]
        out.append(" ".join(_tokens(node, nested)))
    return tuple(out)


@dataclass(frozen=True)
class Entity:
    """A function, type, enum or file-scope table of one version of a file."""

    name: str
    kind: str  # "function" | "type" | "enum" | "table"
    line: int
    node: tree_sitter.Node = field(repr=False, compare=False)

    @property
    def end(self) -> int:
        return self.node.end_point[0] + 1

    @cached_property
    def head(self) -> tuple[str, ...]:
        """A function's tokens before its body (signature, initializers); empty for the others."""
        body = self.node.child_by_field_name("body") if self.kind == "function" else None
        if body is None:
            return ()
        return _tokens(self.node, [(body.start_byte, self.node.end_byte)])

    @cached_property
    def body(self) -> tuple[str, ...]:
        """Its tokens after the head; a type's member function bodies left out (their own entities)."""
        if self.kind == "function":
            body = self.node.child_by_field_name("body")
            return _tokens(body) if body is not None else ()
        skip = [(n.start_byte, n.end_byte) for n in walk(self.node) if n.type == "function_definition"]
        return _tokens(self.node, skip)

    @cached_property
    def statements(self) -> tuple[str, ...]:
        body = self.node.child_by_field_name("body") if self.kind == "function" else None
        return _statements(body) if body is not None else ()


def _scopes(node: tree_sitter.Node) -> list[str]:
    """The names of the namespaces and classes around ``node``, outermost first."""
    names: list[str] = []
    parent = node.parent
    while parent is not None:
        if parent.type in ("namespace_definition", "class_specifier", "struct_specifier", "union_specifier"):
            name = parent.child_by_field_name("name")
            if name is not None:
                names.append(" ".join(node_text(name).split()))
        parent = parent.parent
    return names[::-1]


def _qualify(node: tree_sitter.Node, name: str) -> str:
    return "::".join([*_scopes(node), name]) if "::" not in name else name


def _named(node: tree_sitter.Node) -> tuple[str, str] | None:
    """(kind, name) of an entity node, or None when ``node`` is not one."""
    if node.type == "function_definition":
        declarator = function_name(node)
        return None if declarator is None else ("function", _qualify(node, " ".join(node_text(declarator).split())))
    if node.type in ("class_specifier", "struct_specifier", "union_specifier", "enum_specifier"):
        return _named_type(node)
    if node.type == "init_declarator" and node.parent is not None and node.parent.type == "declaration":
        return _named_table(node)
    return None


def _named_type(node: tree_sitter.Node) -> tuple[str, str] | None:
    name = node.child_by_field_name("name")
    if name is None or node.child_by_field_name("body") is None:
        return None
    kind = "enum" if node.type == "enum_specifier" else "type"
    return kind, _qualify(node, " ".join(node_text(name).split()))


def _named_table(node: tree_sitter.Node) -> tuple[str, str] | None:
    value = node.child_by_field_name("value")
    declarator = node.child_by_field_name("declarator")
    if value is None or value.type != "initializer_list" or declarator is None:
        return None
    if any(p.type == "compound_statement" for p in _ancestors(node)):
        return None  # a local table: part of its function
    return "table", _qualify(node, " ".join(node_text(declarator).split()))


def _ancestors(node: tree_sitter.Node) -> Iterable[tree_sitter.Node]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def entities(source: bytes) -> dict[str, Entity]:
    """The entities of one C/C++ source by name.  Overloads (one name defined twice) are told
    apart by their parameter lists: ``f(int)``, ``f(float)``."""
    found: list[Entity] = []
    root = parse(source).root_node
    for node in walk(root, opaque=frozenset({"compound_statement", "initializer_list", "enumerator_list"})):
        named = _named(node)
        if named is None:
            continue
        kind, name = named
        found.append(Entity(name, kind, node.start_point[0] + 1, node))
    counts = Counter(e.name for e in found)
    out: dict[str, Entity] = {}
    for entity in found:
        key = entity.name
        if counts[key] > 1 and entity.kind == "function":
            key = f"{key}{_parameters(entity.node)}"
        while key in out:
            key += "'"
        out[key] = Entity(key, entity.kind, entity.line, entity.node)
    return out


def _parameters(definition: tree_sitter.Node) -> str:
    declarator = definition.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    if params is None:
        return "()"
    names = [(n.start_byte, n.end_byte) for n in walk(params) if n.type == "identifier"]
    return " ".join(_tokens(params, names)).replace("( ", "(").replace(" )", ")").replace(" ,", ",")


# --------------------------------------------------------------------------- comparing two versions


def changes(old: Entity, new: Entity) -> tuple[str, ...]:
    """What changed between two versions of one entity ((), when only comments or spacing did)."""
    did: list[str] = []
    if old.head != new.head:
        did.append("signature changed")
    if old.body != new.body:
        before, after = Counter(old.statements), Counter(new.statements)
        if _out_of_order(old.statements, new.statements, sum((before & after).values())):
            did.append("statements reordered")
        if before != after or not did or (not old.statements and not new.statements):
            did.append("body edited")
    return tuple(dict.fromkeys(did))


def _out_of_order(old: Sequence[str], new: Sequence[str], common: int) -> bool:
    """Whether statements both versions hold run in another order: the longest run of them kept in
    order (difflib's matching blocks) is shorter than all of them."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) < common


def changed_entities(old: Mapping[str, Entity], new: Mapping[str, Entity]) -> dict[str, str]:
    """name -> how (``added``, ``deleted``, or what :func:`changes` says) for every entity that differs."""
    out: dict[str, str] = {}
    for name in old.keys() | new.keys():
        if name not in new:
            out[name] = "deleted"
        elif name not in old:
            out[name] = "added"
        else:
            did = changes(old[name], new[name])
            if did:
                out[name] = ", ".join(did)
    return dict(sorted(out.items()))


def _similar(a: Entity, b: Entity) -> float:
    if a.kind != b.kind:
        return 0.0
    left, right = (*a.head, *a.body), (*b.head, *b.body)
    matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
    return matcher.ratio() if matcher.real_quick_ratio() >= RENAME_RATIO else 0.0


# --------------------------------------------------------------------------- the map


@dataclass(frozen=True)
class Touch:
    """One upstream commit's change to an entity a patch changes."""

    sha: str
    subject: str
    did: tuple[str, ...]

    @property
    def silent(self) -> bool:
        return any(d.startswith(SILENT) for d in self.did)


@dataclass(frozen=True)
class EntityChurn:
    file: str
    name: str
    kind: str
    line: int  # in the patch's postimage (its preimage, for an entity the patch deletes)
    end: int
    patch_did: str  # what the patch does to it
    commits: tuple[Touch, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "name": self.name,
            "kind": self.kind,
            "line": self.line,
            "end_line": self.end,
            "patch_did": self.patch_did,
            "upstream": [{"sha": t.sha, "subject": t.subject, "did": list(t.did)} for t in self.commits],
        }


@dataclass(frozen=True)
class PatchChurn:
    patch: str  # the patch's label
    path: Path  # the patch file
    entities: tuple[EntityChurn, ...]
    #: why the entities are unknown, when they are (the patch did not apply at the old pin)
    unknown: str | None = None

    @property
    def exposure(self) -> int:
        return sum((2 if t.silent else 1) for e in self.entities for t in e.commits)

    @property
    def exposed(self) -> tuple[EntityChurn, ...]:
        return tuple(e for e in self.entities if e.commits)

    def as_dict(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "exposure": self.exposure,
            "functions": [e.as_dict() for e in self.entities],
            "unknown": self.unknown,
        }


@dataclass(frozen=True)
class ChurnMap:
    old: str
    new: str
    patches: tuple[PatchChurn, ...]  # ranked: most exposed first
    #: upstream commits walked (None when the two sides have no history between them)
    commits: int | None

    @property
    def review(self) -> tuple[PatchChurn, ...]:
        return tuple(p for p in self.patches if p.exposure)

    def as_dict(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "commits_walked": self.commits,
            "review": [p.patch for p in self.review],
            "patches": [p.as_dict() for p in self.patches],
        }

    def annotations(self, relative: Callable[[Path], str]) -> list[Annotation]:
        """One warning per patch of exposure :data:`HIGH_EXPOSURE` or more, on the hunk of its most
        exposed entity (``relative``: a patch file's path as the repository names it)."""
        out: list[Annotation] = []
        for p in self.review:
            if p.exposure < HIGH_EXPOSURE:
                continue
            top = max(p.exposed, key=lambda e: sum(2 if t.silent else 1 for t in e.commits))
            try:
                data = p.path.read_bytes()
            except OSError:
                data = b""
            did = "; ".join(
                f"{e.name}: " + ", ".join(f"{t.sha[:12]} {'/'.join(t.did)}" for t in e.commits) for e in p.exposed
            )
            out.append(
                Annotation(
                    relative(p.path),
                    patch_line(data, top.file, top.line, top.end),
                    f"review: upstream changed what this patch changes (exposure {p.exposure})",
                    did,
                )
            )
        return out

    def markdown(self, link: Any = None) -> list[str]:
        """The "review these" section (``link``: sha -> Markdown, as the summary shows commits)."""
        show = link or (lambda sha: f"`{sha[:12]}`")
        out = ["### Review these (upstream changed what the patches change)", ""]
        if not self.review:
            out.append("No upstream commit changes a function, type or table the queue changes.")
        for p in self.review:
            out.append(f"- **{p.patch}** (exposure {p.exposure})")
            for e in p.exposed:
                out.append(f"  - `{e.file}` `{e.name}` ({e.kind}; the patch: {e.patch_did})")
                out += [f"    - {show(t.sha)} {t.subject}: {', '.join(t.did)}" for t in e.commits]
        unknown = [p for p in self.patches if p.unknown]
        if unknown:
            out += ["", "Not mapped: " + "; ".join(f"{p.patch} ({p.unknown})" for p in unknown)]
        return out


class _Files:
    """Blob contents and their entities, each blob read and parsed once."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self.parsed: dict[str, dict[str, Entity]] = {}

    def blobs(self, tree: str, paths: Iterable[str]) -> dict[str, str]:
        wanted = sorted(set(paths))
        if not wanted:
            return {}
        out = self.repo.git("ls-tree", "-z", tree, "--", *wanted).stdout
        blobs: dict[str, str] = {}
        for record in out.split("\0"):
            meta, _, path = record.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob":
                blobs[path] = parts[2]
        return blobs

    def entities(self, blob: str | None) -> dict[str, Entity]:
        if blob is None:
            return {}
        if blob not in self.parsed:
            self.read([blob])
        return self.parsed[blob]

    def read(self, blobs: Iterable[str]) -> None:
        """Read and parse the blobs not parsed yet, in one git process (a blob over the size limit
        has no entities)."""
        unread = [b for b in dict.fromkeys(blobs) if b not in self.parsed]
        texts = gitbulk.read_blobs(self.repo, unread, limit=_TEXT_LIMIT)
        for blob in unread:
            self.parsed[blob] = entities(texts.get(blob, "").encode("utf-8"))

    def at(self, tree: str, paths: Iterable[str]) -> dict[str, dict[str, Entity]]:
        blobs = self.blobs(tree, paths)
        self.read(blobs.values())
        return {path: self.entities(blobs.get(path)) for path in paths}


def _queue_trees(repo: Repo, queue: Queue, old: str, scratch: Path) -> list[tuple[str | None, str | None]]:
    """(tree before, tree after) each patch on ``old`` in a temporary index; (None, None) for a
    patch that does not apply (left out, the next ones tried on the rest)."""
    steps = IndexApplier(repo, scratch, "churn").steps(old, queue.patches, trees=True)
    return [(step.before, step.after) if step.applied else (None, None) for step in steps]


def _changed_paths(repo: Repo, a: str, b: str) -> list[str]:
    out = repo.git("diff-tree", "-r", "--no-renames", "--name-only", "-z", a, b).stdout
    return [p for p in out.split("\0") if p]


@dataclass
class _Tracked:
    """An entity a patch changes, as upstream calls it now (renames and moves followed)."""

    file: str
    name: str
    touches: list[Touch] = field(default_factory=list)


def _follow(files: _Files, tracked: list[_Tracked], commit: UpstreamCommit) -> None:
    """Record what ``commit`` did to each tracked entity, and follow renames and moves."""
    hit = sorted({t.file for t in tracked} & set(commit.paths))
    if not hit:
        return
    parent = commit.parent or EMPTY_TREE
    before = files.at(parent, hit)
    after = files.at(commit.sha, hit)
    added: dict[str, dict[str, Entity]] | None = None
    for t in tracked:
        if t.file not in hit:
            continue
        old = before[t.file].get(t.name)
        if old is None:
            continue  # not there before this commit (the patch adds it): upstream cannot have touched it
        new = after[t.file].get(t.name)
        if new is not None:
            did = changes(old, new)
            if did:
                t.touches.append(Touch(commit.sha, commit.subject, did))
            continue
        if added is None:  # what the commit defines anew, where a vanished entity may have gone
            paths = [p for p in commit.paths if is_cpp(p)]
            pre, post = files.at(parent, paths), files.at(commit.sha, paths)
            added = {p: {n: e for n, e in post[p].items() if n not in pre[p]} for p in paths}
        t.touches.append(Touch(commit.sha, commit.subject, (_vanished(t, old, added),)))


def _vanished(t: _Tracked, old: Entity, candidates: Mapping[str, Mapping[str, Entity]]) -> str:
    """What became of an entity that left its file (``t`` follows it to its new place)."""
    for path, ents in candidates.items():
        if path != t.file and old.name in ents:
            t.file = path
            return f"moved to {path}"
    best: tuple[float, str, str] = (0.0, "", "")
    for path, ents in candidates.items():
        for name, entity in ents.items():
            ratio = _similar(old, entity)
            if ratio > best[0]:
                best = (ratio, path, name)
    ratio, path, name = best
    if ratio >= RENAME_RATIO:
        moved = path != t.file
        t.file, t.name = path, name
        return f"renamed to {name}" + (f" (moved to {path})" if moved else "")
    return "deleted"


def churn_map(repo: Repo, queue: Queue, old: str, new: str, *, scratch: Path, history: bool = True) -> ChurnMap:
    """The map of ``old -> new`` for ``queue`` (local commits; see the module docstring).

    ``history=False`` (a side known only from its source archive): the two trees are compared as
    one change, named by ``new``."""
    files = _Files(repo)
    per_patch: list[tuple[int, PatchChurn, list[tuple[EntityChurn, _Tracked]]]] = []
    tracked: list[_Tracked] = []
    for n, (patch, (before, after)) in enumerate(
        zip(queue.patches, _queue_trees(repo, queue, old, scratch), strict=True)
    ):
        if before is None or after is None:
            per_patch.append((n, PatchChurn(patch.label, patch.path, (), "it does not apply at the old pin"), []))
            continue
        paths = [p for p in _changed_paths(repo, before, after) if is_cpp(p)]
        pre, post = files.at(before, paths), files.at(after, paths)
        rows: list[tuple[EntityChurn, _Tracked]] = []
        for path in paths:
            for name, how in changed_entities(pre[path], post[path]).items():
                entity = post[path].get(name) or pre[path][name]
                row = EntityChurn(path, name, entity.kind, entity.line, entity.end, how)
                follow = _Tracked(path, name)
                if name in pre[path]:
                    tracked.append(follow)
                rows.append((row, follow))
        per_patch.append((n, PatchChurn(patch.label, patch.path, ()), rows))
    if history:  # every commit: an entity followed to another file is looked for there from then on
        line = upstream_commits(repo, old, new, oldest_first=True)
    else:
        compared = "(the two trees compared: no history between them)"
        line = [UpstreamCommit(new, compared, tuple(_changed_paths(repo, old, new)), old)]
    for commit in line:
        _follow(files, tracked, commit)
    patches: list[tuple[int, PatchChurn]] = []
    for n, churn, rows in per_patch:
        ents = tuple(EntityChurn(r.file, r.name, r.kind, r.line, r.end, r.patch_did, tuple(t.touches)) for r, t in rows)
        patches.append((n, PatchChurn(churn.patch, churn.path, ents, churn.unknown)))
    patches.sort(key=lambda item: (-item[1].exposure, item[0]))
    return ChurnMap(old, new, tuple(p for _n, p in patches), len(line) if history else None)
