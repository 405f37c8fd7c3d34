"""The figures table's rows of the queue's own work: the C++ parsers (the family files' graph
builders, the parity audit's reading), the built-in generator over every family, and the queue
commands on synthesized queues of growing size."""

from __future__ import annotations

from typing import Final

from tooling.bench_schema import (
    GenerateAll,
    GeneratedBuild,
    GraphParse,
    Parse,
    Scale,
    ScaleCommand,
    ScaleTarget,
    Skipped,
)
from tooling.docs.bench_cells import Row, seconds, verdict


def graph_parse_rows(graph: GraphParse | Skipped | None) -> list[Row]:
    """The graph-parse section: the two C++ parsers on the family files, and the rewrite's result."""
    if not graph or isinstance(graph, Skipped):
        return []
    ts, clang, rewrite = graph.tree_sitter, graph.libclang, graph.rewrite
    found = f"{ts.builders} builders / {ts.anchors} anchors, {ts.files_with_errors} file(s) with errors"
    if not isinstance(clang, Skipped):
        found = (
            f"{seconds(ts.parse_s)} vs {seconds(clang.parse_s)}; {found} vs {clang.builders} / {clang.anchors}, "
            f"{clang.files_with_errors}"
        )
    second = "a no-op" if rewrite.idempotent else "changed " + ", ".join(rewrite.second_pass_changed)
    return [
        (
            f"the {graph.files} family files (`src/models/*.cpp`) parsed by tree-sitter-cpp vs libclang: seconds; "
            "graph builders / `l_out` anchors in their loops found; the layer hook placed by the rewrite "
            "(`--only graph-parse`)",
            f"{found}; hook placed in {rewrite.families_placed} families ({rewrite.hooks} hooks), "
            f"{len(rewrite.refused)} refused, {len(rewrite.sharing_another_builder)} sharing another's builder; "
            f"second pass {second}",
            "a second pass changes nothing",
            verdict(rewrite.idempotent),
        )
    ]


def parse_rows(section: Parse | Skipped | None) -> list[Row]:
    """The parse section: the parity audit's C++ reading, tree-sitter vs the text scanner it replaced."""
    if not section or isinstance(section, Skipped):
        return []
    ts, old, agree = section.tree_sitter, section.old, section.agreement
    parsed = (
        f"{ts.files_parsed} files naming an arch parsed; all {section.files} parsed in {seconds(ts.parse_s)}, "
        f"{ts.files_with_errors} with errors"
    )
    if isinstance(old, Skipped) or isinstance(agree, Skipped):
        return [("the parity audit's C++ reading (`--only parse`)", f"{seconds(ts.scan_s)} ({parsed})", "-", "-")]
    totals = agree.cppscan
    counts = f"{totals.switches} switches / {totals.cases} cases, {totals.tables} table(s) / {totals.entries} entries"
    told = (
        f"the same counts in all {agree.default_files} default files ({counts})"
        if agree.agree
        else "different counts in " + ", ".join(d.file for d in agree.disagreeing)
    )
    return [
        (
            f"the parity audit's C++ reading of the pin's {section.files} C/C++ files of `src/` and `ggml/src/` "
            f"({section.bytes / 1e6:.1f} MB): tree-sitter (cppscan) vs the text scanner it replaced, seconds; "
            "the parity counts of the default files (`--only parse`)",
            f"{seconds(ts.scan_s)} vs {seconds(old.scan_s)} ({parsed}); {told}",
            "the same counts as the old scanner",
            verdict(agree.agree),
        )
    ]


def _generated_build_row(build: GeneratedBuild) -> Row:
    ours, raw = build.skippy, build.raw
    hits = f"; {ours.cache_hits} hits, {ours.cache_misses} misses" if ours.cache_hits is not None else ""
    return (
        f"target `{build.target}` of that tree in a fresh build dir: skippy's CPU build with the "
        "project's compiler cache vs plain cmake + ninja (no cache)",
        f"{seconds(ours.seconds)} ({ours.compiled} compiles{hits}) vs {seconds(raw.seconds)} ({raw.compiled} compiles)",
        "-",
        "-",
    )


def generate_all_rows(section: GenerateAll | None) -> list[Row]:
    """The generate-all section: the built-in generator over every family, the queue applied, built."""
    if not section:
        return []
    gen, refusal, apply = section.generate, section.refusal, section.apply
    refused = ", ".join(f"{name} ({f.file})" for name, f in refusal.families.items()) or "none"
    whole = (
        refusal.met
        and refusal.lane_untouched
        and gen.shards == gen.families_covered
        and gen.rerun_same_bytes
        and gen.check_clean
        and not apply.second_pass_on_applied_tree_changed
    )
    rows: list[Row] = [
        (
            "the built-in generator over every family with a graph builder in `src/models/` of the pinned tree "
            "(`--only generate-all`): `invoke generate`; shards / builder files; refused; second pass; `--check`",
            f"{seconds(gen.seconds)}; {gen.shards} shards / {gen.families_with_builders} files "
            f"({gen.archs_covered} of {gen.archs_mapped} archs); refused with file and reason: {refused}, "
            f"the lane {'untouched' if refusal.lane_untouched else 'CHANGED'}; second pass {gen.second_pass}, "
            f"a rerun {'writes the same bytes' if gen.rerun_same_bytes else 'DIFFERS'}; `--check` "
            f"{'clean' if gen.check_clean else 'DRIFTED'} ({seconds(gen.check_seconds)})",
            "one shard per family; refusals named; a second pass changes nothing",
            verdict(whole),
        ),
        (
            f"that {apply.patches}-patch queue applied: cold `invoke prepare --pinned` vs raw clone + checkout + "
            "`git am --3way` of the same files",
            f"{apply.ratio}x (median {apply.skippy_cold_prepare.median_s:.1f} s vs "
            f"{apply.raw_clone_checkout_am.median_s:.1f} s; `git am` alone "
            f"{apply.raw_am_only.median_s:.1f} s); same tree: {'yes' if apply.same_tree_as_raw else 'NO'}; "
            f"{apply.hooks_in_tree} hooks in the tree, {apply.hooks_added} added by the shards",
            "the same tree as raw",
            verdict(apply.same_tree_as_raw and not apply.shards_off),
        ),
    ]
    if not isinstance(section.build, Skipped):
        rows.append(_generated_build_row(section.build))
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


def _scale_cell(command: ScaleCommand) -> str:
    ratio = "?" if command.ratio is None else f"{command.ratio:g}"
    return f"{command.skippy.median_s:.2f} s ({ratio}x; {command.git.skippy} / {command.git.raw} git)"


def _scale_lanes(section: Scale) -> Row:
    """The first row: the sizes measured, and each queue's patches per lane."""
    ns = " / ".join(str(r.n) for r in section.sizes)
    lanes = "; ".join(
        f"{r.n}: {r.lanes.core} / {r.lanes.model_support} / {r.lanes.generated}"
        + (
            f" ({r.lanes.generated_moved_to_model_support} of the generated share in model_support)"
            if r.lanes.generated_moved_to_model_support
            else ""
        )
        for r in section.sizes
    )
    return (
        f"the synthesized queues at N = {ns} on the pinned import (`--only scale`, "
        f"{section.rounds} round(s) per side): core / model_support / generated patches",
        lanes,
        "-",
        "-",
    )


def _scale_measured(shown: str, target: ScaleTarget) -> str:
    """One command's cells, then what its target judges: ms per patch, growth or spread."""
    if target.per_patch_s:
        # the JSON's keys are strings, written sorted as strings ("130" before "40")
        by_n = sorted(target.per_patch_s.items(), key=lambda kv: int(kv[0]))
        per = " / ".join(f"{s * 1000:.1f}" for _n, s in by_n)
        shown += f"; ms per patch from N = {min(map(int, target.per_patch_s))}: {per}"
    if target.growth is not None:
        shown += f" (at most {target.growth:g}x the first)"
    elif target.spread is not None:
        shown += f" (largest / smallest {target.spread:g})"
    return shown


def scale_rows(section: Scale | None) -> list[Row]:
    """The scale section: each queue command at each queue size, beside its raw baseline."""
    if not section:
        return []
    rows = [_scale_lanes(section)]
    for key, (label, raw) in _SCALE_COMMANDS.items():
        measured = [r for r in section.sizes if key in r.commands]
        if not measured:
            continue
        target = section.targets.get(key, ScaleTarget())
        shown = _scale_measured(" / ".join(_scale_cell(r.commands[key]) for r in measured), target)
        rows.append(
            (
                f"{label} at N = {' / '.join(str(r.n) for r in measured)}: median seconds (ratio to {raw}; "
                "git processes, skippy / raw)",
                shown,
                "-" if target.target is None else target.target,
                "-" if target.met is None else verdict(target.met),
            )
        )
    return rows
