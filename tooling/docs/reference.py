"""The reference tables made from the code's own declarations: every option of every command, every
settings key, and the backends with their CMake switches, spot check and install hints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from skippy.cli.commands import README_BEGIN, README_END, readme_block
from skippy.compile.backends.base import COMMON_DEFINES, TREE_OPTIONAL_DEFINES, BackendSpec
from skippy.core import specs
from skippy.core.specs import Spec
from tooling.docs.blocks import cell

# --- the option reference --------------------------------------------------------------------


def render_options(_root: Path) -> str:
    """One table per command, in the option table's order: the option table's own reference block,
    without its markers (the generator's markers stand around it)."""
    return readme_block().removeprefix(README_BEGIN).removesuffix(README_END).strip()


# --- the settings keys -----------------------------------------------------------------------


def _toml(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    return f"`{value}`"


def render_settings_table(table: str, declared: Sequence[Spec]) -> str:
    """A Markdown table of one ``[tool.skippy...]`` table's keys: type, default, variable, meaning."""
    lines = [f"`{table}`", "", "| key | type | default | variable | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in declared:
        env = f"`{s.env}`" if s.env else ""
        expected = cell(s.expected()).replace("*", "\\*")
        lines.append(f"| `{s.key}` | {expected} | {_toml(s.default)} | {env} | {cell(s.doc)} |")
    return "\n".join(lines)


#: the declared tables, as ``pyproject.toml`` names them
SETTINGS_TABLES: Final[Mapping[str, Sequence[Spec]]] = {
    "[tool.skippy]": specs.TOP,
    **{f"[tool.skippy.{name}]": declared for name, declared in specs.SUBTABLES.items()},
}


def render_settings(_root: Path, tables: Mapping[str, Sequence[Spec]] = SETTINGS_TABLES) -> str:
    return "\n\n".join(render_settings_table(name, declared) for name, declared in tables.items())


# --- the backends ----------------------------------------------------------------------------


def _defines(mapping: Mapping[str, str]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in mapping.items())


#: ``platform.system()`` names as readers know them
_SYSTEMS: Final = {"Darwin": "macOS"}


def _backend_row(b: BackendSpec, backends: Mapping[str, BackendSpec]) -> str:
    """One backend's row: its session, title, switches, keys, hosts, spot check, device and markers."""
    # its own switch only (skippy.compile.backends.switches), and OFF a switch the tree turns on by
    # default on some host (Metal's on macOS) where that host builds it
    own = {b.switch: "ON"} if b.switch else {}
    host_off = [
        f"`{o.switch}=OFF` on {', '.join(sorted(_SYSTEMS.get(s, s) for s in o.default_on_systems))}"
        for o in backends.values()
        if o.switch and o.name != b.name and o.default_on_systems
    ]
    switches = ", ".join(filter(None, [_defines({**own, **b.extra_defines}), *host_off])) or "-"
    keys = ", ".join(f"`{k}`" for k in sorted(b.table_keys)) or "-"
    hosts = ", ".join(sorted(_SYSTEMS.get(h, h) for h in b.host_systems)) or "any"
    check = " ".join(b.spot_check_args) or "CPU"
    check = f"`{check}`" if b.spot_check_args else check
    device = f"`{b.device_prefix}0`" if b.device_prefix else "-"
    markers = ", ".join(f"`{m}`" for m in b.artifact_markers)
    row = [f"`{b.session}`", cell(b.title), switches, keys, hosts]
    return "| " + " | ".join([*row, check, device, markers]) + " |"


def render_backends(backends: Mapping[str, BackendSpec]) -> str:
    """The build sessions, their CMake switches and spot check, and the install hints, from a registry."""
    lines = [
        "| session | backend | CMake switches | `[tool.skippy.build]` keys | builds on | spot check | device | "
        "artifact gate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_backend_row(b, backends) for b in backends.values()]
    lines += [
        "",
        f"Every build also sets {_defines(COMMON_DEFINES)}, and, only where the tree declares the option, "
        f"{_defines(TREE_OPTIONAL_DEFINES)}.",
        "",
        "How to get each toolchain (what a failed probe prints):",
        "",
        "| backend | Debian/Ubuntu | Arch | macOS |",
        "| --- | --- | --- | --- |",
    ]
    for b in backends.values():
        hints = (b.install.debian, b.install.arch, b.install.macos)
        lines.append(f"| {b.name} | " + " | ".join(cell(h) if h else "not available" for h in hints) + " |")
    return "\n".join(lines)
