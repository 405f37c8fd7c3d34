"""The paths a patch's diff names, and the ones outside the tree it applies to.

A path in a patch is relative to the root of the llama.cpp tree (``diff --git a/<path>
b/<path>``). One with a ``..`` component or an absolute one leaves the tree: git refuses it on
every target, so such a patch is malformed in itself (never a conflict with an upstream, never
fixed by refreshing it). The queue's validation names it before anything is applied.

Only the diff's header lines are read (``diff --git``, ``---``/``+++``, ``rename``/``copy
from``/``to``), never the commit message or the hunks' text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

#: one path of a ``diff --git`` line: C-quoted (``"a/caf\303\251"``) or plain
_QUOTED_PAIR = re.compile(r'^(?P<a>"(?:[^"\\]|\\.)*"|\S+) (?P<b>"(?:[^"\\]|\\.)*"|\S+)$')
_NAMED = ("rename from ", "rename to ", "copy from ", "copy to ")


def _unquote(path: str) -> str:
    """A path as git writes it, without its C quotes (escapes never stand for ``/`` or ``.``)."""
    return path[1:-1] if len(path) >= 2 and path[0] == path[-1] == '"' else path


def _strip(path: str, prefix: str) -> str:
    path = _unquote(path)
    return path[len(prefix) :] if path.startswith(prefix) else path


def _git_line_paths(rest: str) -> list[str]:
    """The two paths of ``diff --git <rest>``."""
    if not rest.startswith('"') and '"' not in rest:
        a, sep, b = rest.partition(" b/")  # plain paths may hold spaces: the b/ side starts at " b/"
        return [_strip(a, "a/"), b] if sep else [rest]
    pair = _QUOTED_PAIR.match(rest)
    return [_strip(pair["a"], "a/"), _strip(pair["b"], "b/")] if pair else [rest]


def header_paths(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line, path) for each path the diff's header lines name."""
    in_header = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith("diff --git "):
            in_header = True
            for path in _git_line_paths(line[len("diff --git ") :]):
                yield lineno, path
            continue
        if not in_header:
            continue
        if line.startswith("@@"):
            in_header = False
        elif line.startswith(_NAMED):
            yield lineno, _unquote(line.split(" ", 2)[2])
        elif line.startswith(("--- ", "+++ ")):
            path = line[4:].split("\t")[0]
            if path != "/dev/null":
                yield lineno, _strip(path, "a/" if line[0] == "-" else "b/")


def outside_the_tree(path: str) -> bool:
    """``path`` (relative to the tree's root, as a patch names it) leaves the tree."""
    return path.startswith("/") or ".." in path.split("/")


def paths_outside_the_tree(text: str) -> list[tuple[int, str]]:
    """(first line, path) for each distinct path of the diff that leaves the tree."""
    found: dict[str, int] = {}
    for lineno, path in header_paths(text):
        if outside_the_tree(path) and path not in found:
            found[path] = lineno
    return [(lineno, path) for path, lineno in found.items()]
