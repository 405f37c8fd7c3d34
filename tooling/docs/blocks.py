"""A generated block and its markers: what a renderer is, how a page's blocks are found and made
again, and the pages that hold them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: the command every marker names
COMMAND: Final = "python -m tooling.docs"

_BLOCK: Final = re.compile(
    r"<!-- (?P<name>[a-z][a-z0-9-]*): made from (?P<source>[^\n]*?) by `" + re.escape(COMMAND) + r"` -->\n"
    r"(?P<body>.*?)"
    r"<!-- (?P=name): end -->",
    re.DOTALL,
)
_OPENING: Final = re.compile(r"<!-- ([a-z][a-z0-9-]*): made from ")


class DocsError(ValueError):
    """A generated block that cannot be made: the file, the block and what to do."""


@dataclass(frozen=True)
class Renderer:
    """One kind of generated block: its name, what it is made from, and how (``root`` -> Markdown)."""

    name: str
    source: str
    render: Callable[[Path], str]

    @property
    def begin(self) -> str:
        return f"<!-- {self.name}: made from {self.source} by `{COMMAND}` -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.name}: end -->"

    def block(self, root: Path) -> str:
        return f"{self.begin}\n\n{self.render(root).rstrip()}\n\n{self.end}"


def cell(text: str) -> str:
    """``text`` as a Markdown table cell."""
    return text.replace("|", "\\|")


def rewrite(text: str, root: Path, *, where: str, renderers: Mapping[str, Renderer]) -> str:
    """``text`` with every generated block made again; DocsError for an unknown or unclosed block."""
    found = _BLOCK.findall(text)
    opened = _OPENING.findall(text)
    if len(found) != len(opened):
        closed = {name for name, _source, _body in found}
        lost = sorted(set(opened) - closed) or sorted(opened)
        raise DocsError(f"{where}: block {', '.join(lost)} has no end marker (<!-- NAME: end -->)")

    def made(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in renderers:
            raise DocsError(f"{where}: unknown generated block {name!r}; known: {', '.join(renderers)}")
        return renderers[name].block(root)

    return _BLOCK.sub(made, text)


def block_names(text: str) -> list[str]:
    return [name for name, _source, _body in _BLOCK.findall(text)]


def changed_blocks(old: str, new: str) -> list[str]:
    """The names of the blocks of ``old`` that ``new`` (the same page made again) holds otherwise."""
    pairs = zip(_BLOCK.finditer(old), _BLOCK.finditer(new), strict=True)
    return [before["name"] for before, after in pairs if before[0] != after[0]]


def doc_files(root: Path) -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
