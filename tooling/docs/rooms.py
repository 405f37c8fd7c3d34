"""The rooms of the code and what each holds: one row per package (the product's layers, the rooms
inside them, the benchmarks and the tooling) with its layer from pyproject.toml's import-linter
contracts, and one row per module, each from the first paragraph of its docstring."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tooling.docs.blocks import cell

#: the shipped package, whose layers the import-linter contract orders
PACKAGE: Final = "skippy"
#: the folders beside it that hold code of their own (each imports the package; it imports neither)
BESIDE: Final = ("benchmarks", "tooling")
#: what a room without a docstring shows (and a unit test refuses)
NO_DOCSTRING: Final = "(no docstring: say in its `__init__.py` what this room holds)"

_ROLE: Final = re.compile(r":[a-z]+:`~?([^`]+)`")


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring (read, not imported), as Markdown; "" without one."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return _ROLE.sub(r"`\1`", first).replace("``", "`")


@dataclass(frozen=True)
class Contracts:
    """pyproject.toml's import-linter contracts, as the tables read them."""

    #: the package's layers, top first; each a tuple of the sub-packages side by side in it
    layers: tuple[tuple[str, ...], ...]
    #: container -> its inner layers, top first (each a tuple of names side by side)
    inner: Mapping[str, tuple[tuple[str, ...], ...]]
    #: the root packages the package never imports (forbidden contracts from it)
    above: frozenset[str]

    @classmethod
    def load(cls, root: Path) -> Contracts:
        config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
        contracts: Sequence[Mapping[str, Any]] = config["tool"]["importlinter"]["contracts"]

        def split(layers: Sequence[str]) -> tuple[tuple[str, ...], ...]:
            return tuple(tuple(name.strip() for name in layer.split("|")) for layer in layers)

        (top,) = [c for c in contracts if c["type"] == "layers" and "containers" not in c]
        inner = {
            str(box): split(c["layers"]) for c in contracts if c["type"] == "layers" for box in c.get("containers", ())
        }
        above = {
            str(m)
            for c in contracts
            if c["type"] == "forbidden" and c["source_modules"] == [PACKAGE]
            for m in c["forbidden_modules"]
        }
        return cls(split(top["layers"]), inner, frozenset(above))

    def layer_folders(self) -> list[str]:
        """The package's layers as folder names, top first (side by side ones in the contract's order)."""
        return [name.removeprefix(f"{PACKAGE}.") for layer in self.layers for name in layer]

    def where(self, name: str) -> str:
        """The layer column of the room ``name``."""
        for i, layer in enumerate(self.layers, start=1):
            if name in layer:
                end = " (top)" if i == 1 else " (ground)" if i == len(self.layers) else ""
                return f"{i} of {len(self.layers)}{end}"
        if name in self.above:
            return f"over `{PACKAGE}`, which never imports it"
        parent, _, last = name.rpartition(".")
        for i, layer in enumerate(self.inner.get(parent, ()), start=1):
            if last in layer:
                return f"inside `{parent}`: {i} of {len(self.inner[parent])}"
        return f"inside `{parent}`"


def _packages(folder: Path) -> list[Path]:
    """``folder`` and every package under it, each followed by its own sub-packages (by name)."""
    found = [folder]
    for child in sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file()):
        found += _packages(child)
    return found


def _dotted(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def render_rooms(root: Path) -> str:
    """One row per room: its dotted name, its layer, the first paragraph of its ``__init__.py`` docstring."""
    contracts = Contracts.load(root)
    tops = [root / PACKAGE / name for name in contracts.layer_folders()] + [root / name for name in BESIDE]
    lines = ["| room | layer | what it holds |", "| --- | --- | --- |"]
    for top in tops:
        for package in _packages(top):
            name = _dotted(package, root)
            said = summary(package / "__init__.py") or NO_DOCSTRING
            lines.append(f"| `{name}` | {contracts.where(name)} | {cell(said)} |")
    return "\n".join(lines)


def render_modules(root: Path) -> str:
    """Every module of every layer, of the benchmarks and of the tooling, with the first paragraph of
    its docstring."""
    lines = ["| module | what it holds |", "| --- | --- |"]
    folders = [root / PACKAGE / layer for layer in Contracts.load(root).layer_folders()] + [root / b for b in BESIDE]
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            said = summary(path)
            if path.name == "__init__.py" and not said:
                continue
            lines.append(f"| `{_dotted(path, root)}` | {cell(said) or '(no docstring)'} |")
    return "\n".join(lines)
