"""The reference tables of README.md and docs/, made from the code and the bench's figures.

A generated block sits between two markers, anywhere in a Markdown file::

    <!-- NAME: made from SOURCE by `python -m skippy.cli.docs` -->
    ...
    <!-- NAME: end -->

``NAME`` picks a renderer of :data:`RENDERERS` (``options``, ``settings``, ``exit-codes``, ``backends``,
``bench``, ``build-ending``...).  ``python -m skippy.cli.docs`` rewrites every block of README.md and every
``docs/**/*.md``; ``--check`` changes nothing and names the stale blocks (exit code 1).
A unit test runs the check, so a table the code no longer produces fails the suite.

``--record-build`` runs ``nox -s build-cpu`` twice, on the path the nox session takes (proofs made
with ``--recheck``, then kept), stores each run's ``--json`` report and ending in
``docs/figures/build-cpu.json``, then makes the blocks again: the sample endings of
docs/building.md are shown by the ending's own code (:meth:`skippy.spot.report.Ending.show`).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippy.cli.commands import README_BEGIN, README_END, readme_block
from skippy.cli.exitcodes import render_exit_codes
from skippy.compile.backends import registry
from skippy.compile.backends.base import COMMON_DEFINES, TREE_OPTIONAL_DEFINES, BackendSpec
from skippy.core import specs
from skippy.core.specs import Spec
from skippy.core.ui import Console
from skippy.spot.report import Ending, shown_time

#: the command every marker names
COMMAND: Final = "python -m skippy.cli.docs"
#: the committed copy of the bench's figures (``nox -s bench`` writes ``.bench/bench.json``)
BENCH_JSON: Final = "docs/figures/bench.json"

_BLOCK: Final = re.compile(
    r"<!-- (?P<name>[a-z][a-z0-9-]*): made from (?P<source>[^\n]*?) by `python -m skippy\.cli\.docs` -->\n"
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


# --- the option reference --------------------------------------------------------------------


def render_options(_root: Path) -> str:
    """One table per command, in the option table's order: the option table's own reference block,
    without its markers (this module's markers stand around it)."""
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


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_settings_table(table: str, declared: Sequence[Spec]) -> str:
    """A Markdown table of one ``[tool.skippy...]`` table's keys: type, default, variable, meaning."""
    lines = [f"`{table}`", "", "| key | type | default | variable | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in declared:
        env = f"`{s.env}`" if s.env else ""
        expected = _cell(s.expected()).replace("*", "\\*")
        lines.append(f"| `{s.key}` | {expected} | {_toml(s.default)} | {env} | {_cell(s.doc)} |")
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


def render_backends(backends: Mapping[str, BackendSpec]) -> str:
    """The build sessions, their CMake switches and spot check, and the install hints, from a registry."""
    lines = [
        "| session | backend | CMake switches | `[tool.skippy.build]` keys | builds on | spot check | device | "
        "artifact gate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in backends.values():
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
        row = [f"`{b.session}`", _cell(b.title), switches, keys, hosts]
        lines.append("| " + " | ".join([*row, check, device, markers]) + " |")
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
        lines.append(f"| {b.name} | " + " | ".join(_cell(h) if h else "not available" for h in hints) + " |")
    return "\n".join(lines)


# --- the bench figures -----------------------------------------------------------------------


def _s(value: object) -> str:
    return f"{value} s" if value is not None else "?"


def _met(section: Mapping[str, Any]) -> str:
    met = section.get("met")
    return "?" if met is None else ("met" if met else "**missed**")


def _bench_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    prepare = report.get("prepare")
    if prepare:
        cold, noop = prepare["cold_prepare"], prepare["noop_prepare"]
        rows.append(
            (
                "cold `invoke prepare --pinned` vs raw clone + checkout + `git am --3way`",
                f"{cold['ratio']}x (median {_s(cold['skippy']['median_s'])} vs {_s(cold['raw_git']['median_s'])})",
                f"at most {cold['target_ratio']}x",
                _met(cold),
            )
        )
        rows.append(
            (
                "no-op `invoke prepare --pinned`, median",
                f"{_s(noop['median_s'])}, {noop['files_with_changed_mtime']} file(s) with a changed mtime",
                f"at most {_s(noop['target_s'])}, 0 files",
                _met(noop),
            )
        )
    touch = report.get("minimal_touch")
    if touch:
        one = touch["one_patch_changed"]
        steps = (
            f"{one['compile_steps_skippy_reprepare']} / {one['compile_steps_by_hand']} / "
            f"{one['compile_steps_reset_reapply']}"
        )
        rows.append(
            (
                "compile steps after one patch changes: skippy re-prepare / by hand / reset + re-apply",
                steps,
                "skippy = by hand",
                "met" if one["skippy_equals_minimum"] else "**missed**",
            )
        )
        noop_steps = touch["nothing_changed"]["after_skippy_noop"]
        rows.append(
            (
                "compile steps after a re-prepare with nothing changed",
                str(noop_steps),
                "0",
                _met({"met": not noop_steps}),
            )
        )
    builds = report.get("builds")
    if builds:
        cold_build, up, cache = builds["cold_build"], builds["up_to_date_nox_build_cpu"], builds["compiler_cache"]
        rows.append(
            (
                "cold CPU build, skippy vs the same cmake + ninja argv raw",
                f"{_s(cold_build['skippy_s'])} vs {_s(cold_build['raw_s'])} ({cold_build['overhead_pct']:+} %; "
                f"{_s(cold_build['overhead_outside_cmake_ninja_s'])} outside cmake and ninja)",
                f"at most {cold_build['target_pct']} %",
                _met(cold_build),
            )
        )
        rows.append(
            (
                "`nox -s build-cpu` when up to date (before the spot check), median",
                _s(up["median_s"]),
                f"under {_s(up['target_s'])}",
                _met(up),
            )
        )
        counts = (
            "" if cache.get("warm_hits") is None else f" ({cache['warm_hits']} hits, {cache['warm_misses']} misses)"
        )
        rows.append(
            (
                "rebuild into a fresh dir, warm compiler cache vs cold",
                f"{_s(cache['warm_fresh_dir_s'])} vs {_s(cache['cold_s'])} = {cache['ratio']}{counts}",
                f"at most {cache['target_ratio']}",
                _met(cache),
            )
        )
    shared = report.get("shared_objects")
    if shared:
        ours, raw = shared["patched"], shared["unpatched"]
        rows.append(
            (
                "compile lines a CPU and a Vulkan build dir of one tree share: with the queue vs the unpatched pin "
                "(lines that differ only in `GGML_USE_*`)",
                f"{ours['shared']} of {ours['cpu_lines']} ({ours['only_backend_use']}) vs {raw['shared']} of "
                f"{raw['cpu_lines']} ({raw['only_backend_use']})",
                "only sources that read a backend differ",
                _met(shared),
            )
        )
    rows += _pin_move_rows(report)
    rows += _proof_rows(report)
    rows += _graph_parse_rows(report)
    rows += _parse_rows(report)
    rows += _generate_all_rows(report)
    rows += _scale_rows(report)
    rows += _dist_rows(report)
    return rows


def _graph_parse_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The graph-parse section: the two C++ parsers on the family files, and the rewrite's result."""
    graph = report.get("graph_parse")
    if not graph or "skipped" in graph:
        return []
    ts, clang, rewrite = graph["tree_sitter"], graph["libclang"], graph["rewrite"]
    found = f"{ts['builders']} builders / {ts['anchors']} anchors, {ts['files_with_errors']} file(s) with errors"
    if "skipped" not in clang:
        found = (
            f"{_s(ts['parse_s'])} vs {_s(clang['parse_s'])}; {found} vs {clang['builders']} / {clang['anchors']}, "
            f"{clang['files_with_errors']}"
        )
    second = "a no-op" if rewrite["idempotent"] else "changed " + ", ".join(rewrite["second_pass_changed"])
    return [
        (
            f"the {graph['files']} family files (`src/models/*.cpp`) parsed by tree-sitter-cpp vs libclang: seconds; "
            "graph builders / `l_out` anchors in their loops found; the layer hook placed by the rewrite "
            "(`--only graph-parse`)",
            f"{found}; hook placed in {rewrite['families_placed']} families ({rewrite['hooks']} hooks), "
            f"{len(rewrite['refused'])} refused, {len(rewrite['sharing_another_builder'])} sharing another's builder; "
            f"second pass {second}",
            "a second pass changes nothing",
            "met" if rewrite["idempotent"] else "**missed**",
        )
    ]


def _parse_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The parse section: the parity audit's C++ reading, tree-sitter vs the text scanner it replaced."""
    section = report.get("parse")
    if not section or "skipped" in section:
        return []
    ts, old, agree = section["tree_sitter"], section["old"], section["agreement"]
    parsed = (
        f"{ts['files_parsed']} files naming an arch parsed; all {section['files']} parsed in {_s(ts['parse_s'])}, "
        f"{ts['files_with_errors']} with errors"
    )
    if "skipped" in old:
        return [("the parity audit's C++ reading (`--only parse`)", f"{_s(ts['scan_s'])} ({parsed})", "-", "-")]
    totals = agree["cppscan"]
    counts = (
        f"{totals['switches']} switches / {totals['cases']} cases, {totals['tables']} table(s) / "
        f"{totals['entries']} entries"
    )
    told = (
        f"the same counts in all {agree['default_files']} default files ({counts})"
        if agree["agree"]
        else "different counts in " + ", ".join(d["file"] for d in agree["disagreeing"])
    )
    return [
        (
            f"the parity audit's C++ reading of the pin's {section['files']} C/C++ files of `src/` and `ggml/src/` "
            f"({section['bytes'] / 1e6:.1f} MB): tree-sitter (cppscan) vs the text scanner it replaced, seconds; "
            "the parity counts of the default files (`--only parse`)",
            f"{_s(ts['scan_s'])} vs {_s(old['scan_s'])} ({parsed}); {told}",
            "the same counts as the old scanner",
            "met" if agree["agree"] else "**missed**",
        )
    ]


def _generate_all_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The generate-all section: the built-in generator over every family, the queue applied, built."""
    section = report.get("generate_all")
    if not section:
        return []
    gen, refusal, apply, build = section["generate"], section["refusal"], section["apply"], section["build"]
    refused = ", ".join(f"{name} ({f['file']})" for name, f in refusal["families"].items()) or "none"
    whole = (
        refusal["met"]
        and refusal["lane_untouched"]
        and gen["shards"] == gen["families_covered"]
        and gen["rerun_same_bytes"]
        and gen["check_clean"]
        and not apply["second_pass_on_applied_tree_changed"]
    )
    rows = [
        (
            "the built-in generator over every family with a graph builder in `src/models/` of the pinned tree "
            "(`--only generate-all`): `invoke generate`; shards / builder files; refused; second pass; `--check`",
            f"{_s(gen['seconds'])}; {gen['shards']} shards / {gen['families_with_builders']} files "
            f"({gen['archs_covered']} of {gen['archs_mapped']} archs); refused with file and reason: {refused}, "
            f"the lane {'untouched' if refusal['lane_untouched'] else 'CHANGED'}; second pass {gen['second_pass']}, "
            f"a rerun {'writes the same bytes' if gen['rerun_same_bytes'] else 'DIFFERS'}; `--check` "
            f"{'clean' if gen['check_clean'] else 'DRIFTED'} ({_s(gen['check_seconds'])})",
            "one shard per family; refusals named; a second pass changes nothing",
            "met" if whole else "**missed**",
        ),
        (
            f"that {apply['patches']}-patch queue applied: cold `invoke prepare --pinned` vs raw clone + checkout + "
            "`git am --3way` of the same files",
            f"{apply['ratio']}x (median {apply['skippy_cold_prepare']['median_s']:.1f} s vs "
            f"{apply['raw_clone_checkout_am']['median_s']:.1f} s; `git am` alone "
            f"{apply['raw_am_only']['median_s']:.1f} s); same tree: {'yes' if apply['same_tree_as_raw'] else 'NO'}; "
            f"{apply['hooks_in_tree']} hooks in the tree, {apply['hooks_added']} added by the shards",
            "the same tree as raw",
            "met" if apply["same_tree_as_raw"] and not apply["shards_off"] else "**missed**",
        ),
    ]
    if "skipped" not in build:
        ours, raw = build["skippy"], build["raw"]
        hits = f"; {ours['cache_hits']} hits, {ours['cache_misses']} misses" if "cache_hits" in ours else ""
        rows.append(
            (
                f"target `{build['target']}` of that tree in a fresh build dir: skippy's CPU build with the "
                "project's compiler cache vs plain cmake + ninja (no cache)",
                f"{_s(ours['seconds'])} ({ours['compiled']} compiles{hits}) vs {_s(raw['seconds'])} "
                f"({raw['compiled']} compiles)",
                "-",
                "-",
            )
        )
    return rows


#: the scale section's commands (benchmarks/bench_scale.py COMMANDS): what runs, beside what raw
_SCALE_COMMANDS: Final = {
    "cold_prepare": ("cold `invoke prepare --pinned`", "`git clone` + `checkout` + `git am --3way`"),
    "reprepare": ("re-prepare after one patch in the middle changed", "`git reset --hard` + `git am` from it"),
    "noop_prepare": ("no-op `invoke prepare --pinned`", "`invoke --version`"),
    "status": ("`invoke status`", "`git status`"),
    "parity": ("`invoke parity`", "one raw apply"),
    "generate_check": ("`invoke generate --check`", "one raw apply"),
    "check": ("`invoke check`", "one raw apply"),
    "regenerate": ("`invoke regenerate` after a fixup commit + autosquash", "one raw apply"),
}


def _scale_cell(command: Mapping[str, Any]) -> str:
    ratio = command.get("ratio")
    git = command["git"]
    return (
        f"{command['skippy']['median_s']:.2f} s ({'?' if ratio is None else f'{ratio:g}'}x; "
        f"{git['skippy']} / {git['raw']} git)"
    )


def _scale_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The scale section: each queue command at each queue size, beside its raw baseline."""
    section = report.get("scale")
    if not section:
        return []
    sizes = section["sizes"]
    ns = " / ".join(str(r["n"]) for r in sizes)
    lanes = "; ".join(
        f"{r['n']}: {r['lanes']['core']} / {r['lanes']['model_support']} / {r['lanes']['generated']}"
        + (
            f" ({r['lanes']['generated_moved_to_model_support']} of the generated share in model_support)"
            if r["lanes"].get("generated_moved_to_model_support")
            else ""
        )
        for r in sizes
    )
    rows = [
        (
            f"the synthesized queues at N = {ns} on the pinned import (`--only scale`, "
            f"{section['rounds']} round(s) per side): core / model_support / generated patches",
            lanes,
            "-",
            "-",
        )
    ]
    targets = section.get("targets", {})
    for key, (label, raw) in _SCALE_COMMANDS.items():
        measured = [r for r in sizes if key in r["commands"]]
        if not measured:
            continue
        target = targets.get(key, {})
        met = target.get("met")
        shown = " / ".join(_scale_cell(r["commands"][key]) for r in measured)
        if target.get("per_patch_s"):
            # the JSON's keys are strings, written sorted as strings ("130" before "40")
            by_n = sorted(target["per_patch_s"].items(), key=lambda kv: int(kv[0]))
            per = " / ".join(f"{s * 1000:.1f}" for _n, s in by_n)
            shown += f"; ms per patch from N = {min(map(int, target['per_patch_s']))}: {per}"
        if target.get("growth") is not None:
            shown += f" (at most {target['growth']:g}x the first)"
        elif target.get("spread") is not None:
            shown += f" (largest / smallest {target['spread']:g})"
        rows.append(
            (
                f"{label} at N = {' / '.join(str(r['n']) for r in measured)}: median seconds (ratio to {raw}; "
                "git processes, skippy / raw)",
                shown,
                str(target.get("target", "-")),
                "-" if met is None else ("met" if met else "**missed**"),
            )
        )
    return rows


#: the pin-move section's upstream moves, in the order the row gives them (others after, by name)
_MOVES: Final = {"readme_only": "README only", "one_source": "one source"}


def _pin_move_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The pin-move section: compile steps of each upstream move, skippy's beside the raw build's."""
    pin = report.get("pin_move")
    if not pin:
        return []
    lines = pin["commit_on_compile_lines"]
    order = list(_MOVES)
    moves = sorted(pin["moves"].items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
    measured = "; ".join(
        f"{_MOVES.get(name, name.replace('_', ' '))}: {m['skippy']['compile_steps']} in "
        f"{_s(m['skippy']['wall_s'])} / {m['raw_fixed_commit']['compile_steps']} in "
        f"{_s(m['raw_fixed_commit']['rebuild_s'])}"
        for name, m in moves
    )
    unpatched = lines["unpatched_upstream"]
    return [
        (
            "compile steps and seconds of a pin move (README only, one source changed): skippy's prepare + CPU "
            "build / the raw Ninja rebuild of the same tree configured with the commit string held fixed "
            "(`--only pin-move`)",
            f"{measured}; the commit is on {lines['skippy']} of skippy's {lines['compile_lines']} compile lines "
            f"(unpatched tree: {unpatched['carrying_commit']} of {unpatched['compile_lines']})",
            f"README only at most {pin['target_readme_only_steps']}; at most raw + {pin['target_extra_steps']}",
            _met(pin),
        )
    ]


def _proof_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    spot = report.get("spot_check")
    if spot:
        rows.append(
            (
                "whole spot check on the CPU build (chat + fingerprint + RPC), median (`--only spot-check`)",
                f"{_s(spot['median_s'])}; a raw llama-server start + one chat: "
                f"{_s(spot['raw_start_and_one_chat_median_s'])}",
                f"at most {_s(spot['target_s'])}",
                _met(spot),
            )
        )
    remote = report.get("remote_cache")
    if remote:
        rows.append(
            (
                "a new machine on a shared Redis cache vs the cold build that filled it (`--only remote-cache`)",
                f"{_s(remote['new_machine_s'])} ({remote['new_machine_hits']} hits / {remote['new_machine_misses']} "
                f"misses) vs {_s(remote['cold_s'])} = {remote['ratio']}",
                f"at most {remote['target_ratio']}",
                _met(remote),
            )
        )
    cuda = report.get("cuda")
    if cuda:
        gate = "passed" if not cuda.get("artifact_gate_missing") else "FAILED"
        rows.append(
            (
                "whole `nox -s build-cuda -- --no-spot-check` from the wheel toolkit: cold / a fresh dir from "
                "the cache (`--only cuda`)",
                f"{_s(cuda['cold_s'])} ({cuda['cold_compile_steps']} compiles), artifact gate {gate} / "
                f"{_s(cuda['fresh_dir_s'])} ({cuda['fresh_dir_hits']} hits, {cuda['fresh_dir_misses']} misses)",
                "-",
                "-",
            )
        )
    profile = report.get("cuda_profile")
    if profile:
        e = profile["estimate"]
        ccache = e.get("ccache_depend_wall_s")
        rows.append(
            (
                f"where a fresh CUDA dir's time goes, sampled (`--only cuda-profile`): its {profile['cu_objects']} "
                f".cu objects as sccache hits on {e['cores']} cores, vs raw nvcc; as ccache depend-mode hits",
                f"{_s(e['sccache_wall_s'])} ({e['sccache_hit_over_raw']} of raw nvcc's {_s(e['raw_wall_s'])}"
                + (
                    f"; fatbinary, run again on each hit: {_s(fat['size'])} summed with the tree's size "
                    f"compression, {_s(fat['balance'])} with balance"
                    if (fat := e.get("fatbinary_sum_s"))
                    else ""
                )
                + "); "
                + (f"{_s(ccache)}" if ccache is not None else "ccache not found"),
                f"at most {_s(e['target_s'])} for the whole fresh dir",
                "-",
            )
        )
    tests = report.get("upstream_tests")
    if tests:
        cold = tests.get("cold_no_cache")
        warm = tests["fresh_dir_from_cache"]
        blame = tests["attribution"]
        rows.append(
            (
                "upstream's tests (`--upstream-tests`, `--only upstream-tests`): the tests' build dir cold (no "
                "compiler cache) / fresh from the cache; `ctest -L main`; one broken test's baseline + attribution",
                (f"{_s(cold['build_s'])} / " if cold else "- / ")
                + f"{_s(warm['build_s'])} ({warm['hits']} hits, {warm['misses']} misses); "
                f"{_s(tests['ctest']['wall_s'])}; {_s(blame['baseline_s'])} + {_s(blame['attribution_s'])} "
                f"({blame['probes']} probes)",
                "-",
                "-",
            )
        )
    rocm = report.get("rocm")
    if rocm:
        fresh = (
            f"{_s(rocm['fresh_dir_s'])} ({rocm['fresh_dir_hits']} hits, {rocm['fresh_dir_misses']} misses)"
            if "fresh_dir_s" in rocm
            else str(rocm.get("fresh_dir", "?"))
        )
        rows.append(
            (
                "whole `nox -s build-rocm -- --no-spot-check` in the Debian root: cold configure + build / "
                "up to date / a fresh dir from the cache (`--only rocm`)",
                f"{_s(rocm['configure_s'])} + {_s(rocm['build_s'])} ({rocm['compile_steps']} compiles), "
                f"artifact gate {rocm['artifact_gate']} / {_s(rocm['up_to_date_session_s'])} "
                f"({rocm['up_to_date_compile_steps']} compiles) / {fresh}",
                "-",
                "-",
            )
        )
    return rows


def _sent(
    local: Mapping[str, Any], sent: Mapping[str, Any], overhead: float, per: str, estimate: Mapping[str, float]
) -> str:
    """A dist figure: the local build beside the one sent, where the compiles ran, the overhead
    per compile (``per``: what one is), the estimate for N servers."""
    counts = sent.get("counts") or {}
    by_n = " / ".join(f"{n}: {_s(s)}" for n, s in sorted(estimate.items(), key=lambda kv: int(kv[0])))
    return (
        f"{_s(local['build_s'])} / {_s(sent['build_s'])}: {counts.get('remote', '?')} ran remotely, "
        f"{counts.get('local', '?')} locally, {counts.get('failed_over', '?')} failed over; overhead "
        f"{overhead:g} core-s per {per}; estimate (an upper bound) {by_n}"
    )


def _dist_rows(report: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """The dist section: the CPU build (and CUDA's sampled objects, when measured) sent to a cluster."""
    dist = report.get("dist")
    if not dist:
        return []
    local, sent, servers, cores = dist["local"], dist["dist"], dist["servers"], dist["cores"]
    rows = [
        (
            f"the CPU build (llama-server and the RPC server), {local['compiles']} compiles: a local build / sent "
            f"to {servers} build servers on the same {cores} cores (`--only dist`); estimate with N real servers",
            _sent(local, sent, sent["overhead_per_compile_s"], "compile", dist["estimate_build_s"]),
            "-",
            "-",
        )
    ]
    cuda = dist.get("cuda")
    if cuda:
        rows.append(
            (
                f"a sample of CUDA's objects ({cuda['sample']} of {cuda['objects']}, every k-th by name): a local "
                f"build / sent to {servers} build servers on the same {cores} cores (`--only dist`); estimate of "
                "every object with N servers",
                _sent(
                    cuda["local"], cuda["dist"], cuda["overhead_per_compile_s"], "object", cuda["estimate_objects_s"]
                ),
                "-",
                "-",
            )
        )
    steps = dist.get("compile_steps") or {}
    if steps:
        rows.append(
            (
                "compile steps of each backend's build (one remote-cache entry each at least; configure only)",
                ", ".join(f"{name} {n}" for name, n in sorted(steps.items()) if n is not None),
                "-",
                "-",
            )
        )
    return rows


#: the bench report's keys the table reads (the others are named under it)
_BENCH_KEYS: Final = frozenset(
    {
        "schema",
        "machine",
        "provenance",
        "prepare",
        "minimal_touch",
        "builds",
        "shared_objects",
        "spot_check",
        "remote_cache",
        "cuda",
        "cuda_profile",
        "rocm",
        "upstream_tests",
        "pin_move",
        "graph_parse",
        "parse",
        "generate_all",
        "scale",
        "dist",
    }
)


def render_bench(report: Mapping[str, Any]) -> str:
    """The figures of one bench report (the JSON ``nox -s bench`` writes), one row per figure."""
    machine = report.get("machine", {})
    lines = ["| figure | measured | target | |", "| --- | --- | --- | --- |"]
    lines += [f"| {_cell(a)} | {_cell(b)} | {_cell(c)} | {d} |" for a, b, c, d in _bench_rows(report)]
    about = [f"Machine: {machine.get('cpus', '?')} CPUs."]
    if "prepare" in report:
        up, queue = report["prepare"]["upstream"], report["prepare"]["queue"]
        about.append(
            f"Prepare figures: the {up.get('files', '?')}-file tree of llama-cpp-python {up.get('version', '?')} "
            f"with a {queue['patches']}-patch queue."
        )
    unshown = sorted(set(report) - _BENCH_KEYS)
    if unshown:
        about.append(f"Sections in the JSON this table does not show yet: {', '.join(unshown)}.")
    if report.get("provenance"):
        about.append(str(report["provenance"]))
    return "\n".join(lines) + "\n\n" + " ".join(about)


def _bench_from_file(root: Path) -> str:
    path = root / BENCH_JSON
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DocsError(f"{BENCH_JSON}: cannot read the bench figures ({exc})") from exc
    return render_bench(report)


# --- how a build ends ------------------------------------------------------------------------

#: the committed record of real ``nox -s build-cpu`` runs: each one's ``--json`` report and ending
BUILD_JSON: Final = "docs/figures/build-cpu.json"
#: the command that records them again (it builds the CPU backend: quick in a warm build dir)
RECORD: Final = f"{COMMAND} --record-build"
#: the runs recorded, in order, with the session's arguments: the proofs made, then the same
#: binaries again (the spot check's proofs kept)
BUILD_RUNS: Final[Mapping[str, tuple[str, ...]]] = {"fresh": ("--recheck",), "kept": ()}

#: one run of the session: its arguments -> (exit code, its ``--json`` report, its ending or None)
SessionRun = Callable[[Sequence[str]], tuple[int, Mapping[str, Any], Ending | None]]


def build_cpu_runner(root: Path, env: Mapping[str, str]) -> SessionRun:
    """``nox -s build-cpu -- ARGS`` as the nox session runs it (:func:`skippy.cli.run.nox_main`),
    the ending the session showed kept beside its report."""
    from skippy.cli.build import build
    from skippy.cli.command import Report
    from skippy.cli.entries import nox_main
    from skippy.core.settings import Settings

    def one(args: Sequence[str]) -> tuple[int, Mapping[str, Any], Ending | None]:
        endings: list[Ending | None] = []

        def action(options: Any, settings: Settings, console: Console) -> Report:
            report = build(options, settings, console)
            endings.append(report.ending)
            return report

        ran = nox_main("build", args, env, root=root, backend="cpu", action=action)
        return ran.code, ran.report, endings[-1] if endings else None

    return one


def _relative(value: Any, root: Path, home: str | None) -> Any:
    """``value`` with the project's paths relative to it (as the ending shows them), the home folder ``~``."""
    if isinstance(value, str):
        text = value.replace(f"{root}/", "").replace(str(root), ".")
        return text.replace(f"{home}/", "~/") if home else text
    if isinstance(value, Mapping):
        return {k: _relative(v, root, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, root, home) for v in value]
    return value


def record_build(root: Path, run: SessionRun, *, now: str, home: str | None = None) -> dict[str, Any]:
    """The recording of :data:`BUILD_RUNS`, paths relative; DocsError when a run failed or the
    second one kept no proof (nothing is written then)."""
    runs: dict[str, Any] = {}
    for name, args in BUILD_RUNS.items():
        shown = " ".join(("nox -s build-cpu", *(("--", *args) if args else ())))
        code, report, ending = run(args)
        if code != 0 or ending is None or not report.get("ok") or not ending.ok:
            raise DocsError(
                f"`{shown}` failed (exit code {code}); {BUILD_JSON} was left as it was: make the build pass, "
                f"then run `{RECORD}` again"
            )
        kept = [p.name for p in ending.proofs if p.kept_from is not None]
        if (name == "kept") != bool(kept):
            said = "kept no proof" if not kept else f"kept {', '.join(kept)}"
            raise DocsError(f"`{shown}` {said}; {BUILD_JSON} was left as it was: run `{RECORD}` again")
        runs[name] = {"command": shown, "report": report, "ending": ending.as_dict()}
    recording = {"schema": 1, "recorded_by": RECORD, "recorded_at": now, "runs": runs}
    relative: dict[str, Any] = _relative(recording, root, home)
    return relative


def _recording(root: Path) -> Mapping[str, Any]:
    path = root / BUILD_JSON
    try:
        recording: Mapping[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DocsError(f"{BUILD_JSON}: cannot read the recorded build ({exc}); record it: `{RECORD}`") from exc
    return recording


def render_build_ending(recording: Mapping[str, Any], run: str) -> str:
    """One recorded run's ending as the session showed it (:meth:`Ending.show`, without colour),
    then which run it was and when."""
    recorded = recording["runs"][run]
    stream = io.StringIO()
    Ending.from_dict(recorded["ending"]).show(Console(env={}, stream=stream))
    when = shown_time(str(recording["recorded_at"]))
    return (
        f"```text\n{stream.getvalue().rstrip()}\n```\n\n"
        f"(`{recorded['command']}`, recorded {when} by `{recording['recorded_by']}`)"
    )


# --- the modules of each layer --------------------------------------------------------------

#: the package's layers, top first (pyproject.toml [tool.importlinter])
LAYERS: Final = ("cli", "flows", "maintain", "spot", "queue", "compile", "core")


_ROLE: Final = re.compile(r":[a-z]+:`~?([^`]+)`")


def _summary(path: Path) -> str:
    """The first paragraph of a module's docstring (read, not imported), as Markdown; "" without one."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return _ROLE.sub(r"`\1`", first).replace("``", "`")


def render_modules(root: Path) -> str:
    """Every module of every layer, and of the benchmarks, with the first paragraph of its docstring."""
    lines = ["| module | what it holds |", "| --- | --- |"]
    folders = [root / "skippy" / layer for layer in LAYERS] + [root / "benchmarks"]
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            summary = _summary(path)
            if path.name == "__init__.py" and not summary:
                continue
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            lines.append(f"| `{name}` | {_cell(summary) or '(no docstring)'} |")
    return "\n".join(lines)


def render_blocks(_root: Path) -> str:
    """The kinds of generated block themselves."""
    lines = ["| name | made from |", "| --- | --- |"]
    lines += [f"| `{r.name}` | {_cell(r.source)} |" for r in RENDERERS.values()]
    return "\n".join(lines)


#: every kind of generated block, by the name its markers carry
RENDERERS: Final[Mapping[str, Renderer]] = {
    r.name: r
    for r in (
        Renderer("options", "skippy/cli/options.py", render_options),
        Renderer("settings", "skippy/core/specs.py", render_settings),
        Renderer("exit-codes", "skippy/core/errors.py", render_exit_codes),
        Renderer("backends", "skippy.compile.backends.registry()", lambda _root: render_backends(registry())),
        Renderer("bench", BENCH_JSON, _bench_from_file),
        Renderer("build-ending", BUILD_JSON, lambda root: render_build_ending(_recording(root), "fresh")),
        Renderer("build-ending-kept", BUILD_JSON, lambda root: render_build_ending(_recording(root), "kept")),
        Renderer("modules", "the docstrings of skippy/*/", render_modules),
        Renderer("blocks", "skippy/cli/docs.py", render_blocks),
    )
}


# --- the one mechanism -----------------------------------------------------------------------


def rewrite(text: str, root: Path, *, where: str, renderers: Mapping[str, Renderer] = RENDERERS) -> str:
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


def doc_files(root: Path) -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def stale(root: Path) -> list[str]:
    """``file: block`` for every generated block that differs from what its renderer makes now."""
    out = []
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        fresh = rewrite(text, root, where=str(path.relative_to(root)))
        for old, new in zip(_BLOCK.finditer(text), _BLOCK.finditer(fresh), strict=True):
            if old[0] != new[0]:
                out.append(f"{path.relative_to(root)}: {old['name']}")
    return out


def write_all(root: Path) -> list[str]:
    """Rewrite every file's blocks (none when one cannot be made); the files changed."""
    made = {}
    for path in doc_files(root):  # every block made before any file is written
        text = path.read_text(encoding="utf-8")
        fresh = rewrite(text, root, where=str(path.relative_to(root)))
        if fresh != text:
            made[path] = fresh
    for path, fresh in made.items():
        path.write_text(fresh, encoding="utf-8")
    return [str(path.relative_to(root)) for path in made]


def record(root: Path, run: SessionRun, *, now: str, home: str | None = None) -> None:
    """``--record-build``: the runs recorded into :data:`BUILD_JSON`, then every block made again."""
    recording = record_build(root, run, now=now, home=home)
    (root / BUILD_JSON).write_text(json.dumps(recording, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"recorded {BUILD_JSON}", file=sys.stderr)


def main(argv: Sequence[str], root: Path, *, run: SessionRun | None = None) -> int:
    """``--check``, ``--record-build`` (``run`` replaces the real session in tests), or every block made again."""
    check = "--check" in argv
    try:
        if "--record-build" in argv:
            env = dict(os.environ)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record(root, run or build_cpu_runner(root, env), now=now, home=env.get("HOME"))
        if check:
            found = stale(root)
            for line in found:
                print(f"stale: {line}", file=sys.stderr)
            if found:
                print(f"run `{COMMAND}` to make them again", file=sys.stderr)
            return 1 if found else 0
        for name in write_all(root):
            print(f"rewrote {name}", file=sys.stderr)
    except DocsError as exc:
        print(f"error: {exc}; no file was written", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], Path.cwd()))
