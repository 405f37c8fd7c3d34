"""Bench section ``graph-parse``: the two C++ parsers from the package index on the family files.

The generated lane edits each family's graph builder (``src/models/*.cpp`` of the
prepared tree).  This section parses every family file with tree-sitter-cpp
(the parser :mod:`skippy.maintain.cppparse`) and with libclang, and counts
on each side, independently:

* ``parse_s``: parsing all files (tree-sitter: the median of several rounds;
  libclang: one round, seconds per file);
* ``files_with_errors``: tree-sitter's files with ERROR or MISSING nodes, libclang's
  files with an error diagnostic;
* ``builders``: the constructors ``llama_model_<family>::graph::graph`` defined in the
  files, template and specialized forms included;
* ``anchors``: ``cb(..., "l_out", il)`` calls inside a ``for`` loop of a builder.

libclang gets the include paths of the CPU build's compile line for these files and the
system compiler's builtin headers (its wheel ships none: without them ``stdbool.h`` is not
found).  The rewrite itself is timed too: the hook placed in every family, the families
refused (with the reason), and a second pass over the result (it must change nothing).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skippy.core import proc
from skippy.core.errors import CommandError, ToolchainMissing
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppparse, graphcode, graphedit

#: rounds of the (fast) tree-sitter parse; libclang runs once
TREE_SITTER_ROUNDS = 5


def family_files(tree: Path) -> list[Path]:
    return sorted((tree / "src" / "models").glob("*.cpp"))


def tree_sitter_figures(files: list[Path], *, rounds: int = TREE_SITTER_ROUNDS) -> dict[str, Any]:
    sources = [f.read_bytes() for f in files]
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        trees = [cppparse.parse(s) for s in sources]
        samples.append(time.perf_counter() - started)
    errors = [f.name for f, t in zip(files, trees, strict=True) if cppparse.error_nodes(t.root_node)]
    builders = anchors = 0
    for tree in trees:
        found = graphcode.builder_nodes(tree.root_node)
        builders += len(found)
        anchors += sum(graphedit.anchors_in_loops(node) for node in found)
    return {
        "version": _version("tree-sitter") + " + tree-sitter-cpp " + _version("tree-sitter-cpp"),
        "parse_s": round(statistics.median(samples), 4),
        "rounds": rounds,
        "files_with_errors": len(errors),
        "error_files": errors,
        "builders": builders,
        "anchors": anchors,
    }


def builtin_include(env: Mapping[str, str]) -> str | None:
    """The system C compiler's builtin header directory (``stddef.h``, ``stdbool.h``)."""
    try:
        out = proc.run(["cc", "-print-file-name=include"], env=env).stdout.strip()
    except (ToolchainMissing, CommandError):
        return None
    return out if out and Path(out).is_dir() else None


def libclang_figures(tree: Path, files: list[Path], env: Mapping[str, str]) -> dict[str, Any]:
    try:
        import clang.cindex as ci
    except ImportError:
        return {"skipped": "libclang is not installed (pip install -e '.[test]')"}
    args = ["-x", "c++", "-std=c++17", *(f"-I{tree / d}" for d in ("src", "include", "ggml/include"))]
    include = builtin_include(env)
    if include is not None:
        args += ["-isystem", include]
    index = ci.Index.create()
    seconds = 0.0
    error_files: list[str] = []
    builders = anchors = 0
    for path in files:
        started = time.perf_counter()
        unit = index.parse(str(path), args=args)
        seconds += time.perf_counter() - started
        if any(d.severity >= ci.Diagnostic.Error for d in unit.diagnostics):
            error_files.append(path.name)
        found = _clang_builders(ci, unit, path)
        builders += len(found)
        anchors += sum(_clang_anchors(ci, cursor) for cursor in found)
    return {
        "version": _version("libclang"),
        "parse_s": round(seconds, 2),
        "per_file_s": round(seconds / max(len(files), 1), 3),
        "rounds": 1,
        "args": [a.replace(str(tree), "<tree>") if a != include else "<cc -print-file-name=include>" for a in args],
        "builtin_headers": include is not None,
        "files_with_errors": len(error_files),
        "error_files": error_files,
        "builders": builders,
        "anchors": anchors,
    }


def _clang_builders(ci: Any, unit: Any, path: Path) -> list[Any]:
    """Constructor definitions in ``path`` whose class is ``graph`` inside a ``llama_model_*`` class
    (plain, class template or explicit specialization: libclang resolves all three)."""
    found = []
    for cursor in unit.cursor.get_children():
        if cursor.location.file is None or Path(cursor.location.file.name) != path:
            continue
        if cursor.kind != ci.CursorKind.CONSTRUCTOR or not cursor.is_definition():
            continue
        parent = cursor.semantic_parent
        family = parent.semantic_parent if parent is not None else None
        if parent is None or family is None or parent.spelling != "graph":
            continue
        if family.spelling.startswith(graphcode.FAMILY_PREFIX):
            found.append(cursor)
    return found


def _clang_anchors(ci: Any, builder: Any) -> int:
    """``cb`` calls naming ``"l_out"`` inside a for loop of ``builder`` (each counted once)."""
    kinds = ci.CursorKind
    found: set[tuple[int, int]] = set()  # by position: a loop inside a loop counts its calls once
    for node in builder.walk_preorder():
        if node.kind != kinds.FOR_STMT:
            continue
        for call in node.walk_preorder():
            if call.kind != kinds.CALL_EXPR or call.spelling != "cb":
                continue
            if any(a.kind == kinds.STRING_LITERAL and a.spelling == '"l_out"' for a in call.walk_preorder()):
                found.add((call.location.line, call.location.column))
    return len(found)


def rewrite_figures(tree: Path, files: list[Path]) -> dict[str, Any]:
    """The hook placed in every family file: placed, refused (why), shared builders, second pass."""
    started = time.perf_counter()
    sources = {f"src/models/{path.name}": path.read_bytes() for path in files}
    done = graphedit.rewrite_tree(sources, (tree / "src" / "models" / "models.h").read_bytes())
    second_pass_changed = [
        Path(path).name
        for path, edit in done.edits.items()
        if graphedit.place_layer_hooks(edit.source, path=path).changed
    ]
    seconds = time.perf_counter() - started
    hows = Counter(p.how for edit in done.edits.values() for p in edit.placements)
    return {
        "seconds": round(seconds, 3),
        "families_placed": len(done.edits),
        "hooks": sum(len(edit.placements) for edit in done.edits.values()),
        "by_placement": dict(hows),
        "refused": {Path(path).name: reason for path, reason in done.refused.items()},
        "sharing_another_builder": {Path(path).name: cls for path, cls in done.sharing.items()},
        "without_a_family_builder": [Path(path).name for path in done.not_families],
        "second_pass_changed": second_pass_changed,
        "idempotent": not second_pass_changed,
    }


def bench_graph_parse(settings: Settings, console: Console) -> dict[str, Any]:
    tree = settings.workdir
    files = family_files(tree)
    if not files:
        return {"skipped": f"no src/models/*.cpp in {tree}: run `invoke prepare --pinned` first"}
    console.info(f"bench: tree-sitter-cpp on {len(files)} family files, {TREE_SITTER_ROUNDS} rounds")
    ts = tree_sitter_figures(files)
    console.info(f"bench: libclang on {len(files)} family files (one round; seconds per file)")
    clang = libclang_figures(tree, files, settings.env)
    rewrite = rewrite_figures(tree, files)
    ratio = clang.get("parse_s", 0.0) / ts["parse_s"] if ts["parse_s"] else None
    console.info(summary(len(files), ts, clang, rewrite))
    return {
        "files": len(files),
        "tree_sitter": ts,
        "libclang": clang,
        "libclang_over_tree_sitter": None if ratio is None else round(ratio, 1),
        "chosen": "tree-sitter",
        "rewrite": rewrite,
    }


def summary(files: int, ts: Mapping[str, Any], clang: Mapping[str, Any], rewrite: Mapping[str, Any]) -> str:
    clang_text = (
        f"libclang: {clang['skipped']}"
        if "skipped" in clang
        else f"libclang {clang['parse_s']:.1f} s ({clang['builders']} builders, {clang['anchors']} anchors, "
        f"{clang['files_with_errors']} file(s) with errors)"
    )
    second = "a no-op" if rewrite["idempotent"] else "CHANGED " + ", ".join(rewrite["second_pass_changed"])
    return (
        f"graph parse of {files} family files: tree-sitter {ts['parse_s']:.3f} s ({ts['builders']} builders, "
        f"{ts['anchors']} anchors, {ts['files_with_errors']} file(s) with errors); {clang_text}; hook placed in "
        f"{rewrite['families_placed']} families ({rewrite['hooks']} hooks), {len(rewrite['refused'])} refused, "
        f"{len(rewrite['sharing_another_builder'])} sharing another's builder; second pass {second}"
    )


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"
