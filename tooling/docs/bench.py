"""The figures table: one row per figure of the bench report (docs/figures/bench.json, the JSON
``nox -s bench`` writes), read through its schema (:mod:`tooling.bench_schema`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from tooling.bench_schema import SECTIONS, BenchReport, parse_report
from tooling.docs.bench_builds import build_rows, dist_rows, pin_move_rows, proof_rows
from tooling.docs.bench_cells import Row
from tooling.docs.bench_queue import generate_all_rows, graph_parse_rows, parse_rows, scale_rows
from tooling.docs.blocks import DocsError, cell
from tooling.typed_json import ShapeError

#: the committed copy of the bench's figures (``nox -s bench`` writes ``.bench/bench.json``)
BENCH_JSON: Final = "docs/figures/bench.json"


def bench_rows(report: BenchReport) -> list[Row]:
    """Every figure of the report, in the table's order."""
    return [
        *build_rows(report),
        *pin_move_rows(report.pin_move),
        *proof_rows(report),
        *graph_parse_rows(report.graph_parse),
        *parse_rows(report.parse),
        *generate_all_rows(report.generate_all),
        *scale_rows(report.scale),
        *dist_rows(report.dist),
    ]


def render_bench(raw: Mapping[str, Any]) -> str:
    """The figures of one bench report (the JSON ``nox -s bench`` writes, loaded), one row per figure;
    ShapeError names a key the table reads that the report lacks or holds otherwise."""
    report = parse_report(raw)
    lines = ["| figure | measured | target | |", "| --- | --- | --- | --- |"]
    lines += [f"| {cell(a)} | {cell(b)} | {cell(c)} | {d} |" for a, b, c, d in bench_rows(report)]
    cpus = report.machine.cpus if report.machine and report.machine.cpus is not None else "?"
    about = [f"Machine: {cpus} CPUs."]
    if report.prepare:
        up, queue = report.prepare.upstream, report.prepare.queue
        files = "?" if up.files is None else up.files
        version = "?" if up.version is None else up.version
        about.append(
            f"Prepare figures: the {files}-file tree of llama-cpp-python {version} with a {queue.patches}-patch queue."
        )
    unshown = sorted(set(raw) - SECTIONS)
    if unshown:
        about.append(f"Sections in the JSON this table does not show yet: {', '.join(unshown)}.")
    if report.provenance:
        about.append(report.provenance)
    return "\n".join(lines) + "\n\n" + " ".join(about)


def bench_from_file(root: Path) -> str:
    """The figures table of the committed report; DocsError when it cannot be read or does not hold
    what the table reads."""
    path = root / BENCH_JSON
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return render_bench(raw)
    except (OSError, ValueError) as exc:  # ShapeError is a ValueError
        kind = "does not hold the figures" if isinstance(exc, ShapeError) else "cannot read the bench figures"
        raise DocsError(f"{BENCH_JSON}: {kind} ({exc})") from exc
