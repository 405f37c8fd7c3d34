"""The real thing: prepare the pinned tree, build llama-server and the RPC
server for the CPU, spot-check them on the real model; then the up-to-date
rebuild configures nothing and compiles nothing.

The build itself is the session fixture ``cpu_build`` (tests/e2e/conftest.py).
The first run on a machine takes about 7 minutes on 2 cores (the build dir
under build_root and the compiler cache under cache_dir make later runs
fast, exactly as for ``nox -s build-cpu``).
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, read_stamp
from skippy.compile.configure import parse_cmake_cache
from skippy.compile.request import build_request
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionRequest, run_build_session, session_ending
from skippy.flows.follow import FOLLOWED
from skippy.spot.report import Ending, SpotCheckReport, shown_time

pytestmark = pytest.mark.e2e


def test_build_cpu_builds_and_spot_checks_the_pinned_tree(
    project_settings: Settings, cpu_build: BuildReport, default_model: Path
) -> None:
    """The whole session, as ``nox -s build-cpu`` runs it: probe, prepare, build, spot check,
    and the block it ends with; then the same session again keeps every proof the spot check
    made (the same binaries, model, reference and settings) and starts no server."""
    project = project_settings
    stream = io.StringIO()
    console = Console(env={}, stream=stream)
    # --recheck: the spot check runs even when an earlier run (nox -s build-cpu) kept its proofs
    outcome = run_build_session(SessionRequest(build_request("cpu", project), recheck=True), project, console)
    assert outcome.skipped is None
    ending = session_ending(outcome, project)
    ending.show(console)
    report = outcome.build
    assert report is not None
    assert report.build_dir == cpu_build.build_dir
    assert set(report.binaries) == {"llama-server", "ggml-rpc-server"}
    for binary in report.binaries.values():
        assert binary.is_file()
    stamp = read_stamp(report.build_dir / "skippy-build-stamp.json")
    assert stamp is not None
    assert stamp["patched_sha"] == outcome.patched_sha
    cache = parse_cmake_cache((report.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
    assert cache["GGML_RPC"] == "ON"
    assert cache["BUILD_SHARED_LIBS"] == "OFF"
    assert cache["GGML_CCACHE"] == "OFF"
    assert cache["CMAKE_GENERATOR"] == "Ninja"
    assert cache["CMAKE_HOME_DIRECTORY"] == str(project.workdir)
    assert not report.build_dir.is_relative_to(project.workdir)
    version = proc.run([report.binaries["llama-server"], "--version"], env=project.env, check=False)
    assert "version" in (version.stdout + version.stderr)
    assert "==> spot check " in stream.getvalue(), "the session ran its spot check"
    # the ending: every proof, each a pass, then the binaries and a run line that works as printed
    # (then what the spot check followed: the families the queue touches since the last build)
    assert ending.proofs[5].name == FOLLOWED and ending.proofs[5].verdict == "pass"
    assert [(p.name, p.verdict) for p in ending.proofs[:5]] == [
        ("artifact gate", "pass"),
        ("provenance", "pass"),
        ("chat answer", "pass"),
        ("fingerprint", "pass"),
        ("RPC", "pass"),
    ]
    text = stream.getvalue()
    block = text[text.index("build-cpu: every proof made holds") :]
    # the names are padded to the longest one shown (the followed families' lines make it longer)
    width = max(len(p.name) for p in ending.proofs)
    assert f"✓ {'fingerprint'.ljust(width)}  agrees with the CPU reference (largest difference " in block
    spot = outcome.spot
    assert isinstance(spot, SpotCheckReport)
    assert not spot.results[0].model.startswith("tiny:"), "the default model comes first"
    # a proof over several models (the default one, then the followed families' tiny ones) names each
    first = re.escape(f"{spot.results[0].model}: ") if len(spot.results) > 1 else ""
    assert re.search(
        rf"✓ RPC +{first}\d+/\d+ layers offloaded; model buffers on RPC0.* \(difference \d\.\d{{3}}\)", block
    )
    assert f"✓ {'artifact gate'.ljust(width)}  llama-server contains its backend" in block
    server = project.relative(report.binaries["llama-server"])
    assert f"run: {server} --model {project.relative(default_model)} --port 8080" in block
    assert default_model.is_file()
    assert not any(p.kept_from for p in ending.proofs), "--recheck made every proof"
    _again_every_proof_is_kept(project, report.build_dir, ending)


def _again_every_proof_is_kept(project: Settings, build_dir: Path, made: Ending) -> None:
    """The up-to-date session again: the spot check's proofs kept (when they were made said), no
    server started (no server log written), the build's own gates made again."""
    logs = {log: log.stat().st_mtime_ns for log in (build_dir / "spot-check").glob("*.log")}
    assert logs, "the spot check logs each server it starts"
    stream = io.StringIO()
    console = Console(env={}, stream=stream)
    started = time.monotonic()
    again = run_build_session(SessionRequest(build_request("cpu", project)), project, console)
    ending = session_ending(again, project)
    ending.show(console)
    seconds = time.monotonic() - started
    text = stream.getvalue()
    assert "==> spot check " not in text, "no model was checked again"
    assert {log: log.stat().st_mtime_ns for log in logs} == logs, "no server was started (none wrote its log)"
    assert "build-cpu: every proof made holds" in text
    proofs = {p.name: p for p in ending.proofs}
    when = proofs["chat answer"].kept_from
    assert when is not None
    assert {name for name, p in proofs.items() if p.kept_from} == {"chat answer", "fingerprint", "RPC"}
    assert {p.name for p in made.proofs} >= {"artifact gate", "provenance"}
    assert proofs["artifact gate"].kept_from is None and proofs["provenance"].kept_from is None
    width = max(len(p.name) for p in ending.proofs)
    assert f"✓ {'chat answer'.ljust(width)}  (kept from {shown_time(when)}) " in text
    assert ending.as_dict()["proofs"][2] == {**proofs["chat answer"].as_dict(), "kept": True, "kept_from": when}
    print(f"build-cpu again with every spot-check proof kept: {seconds:.1f} s")


def test_up_to_date_build_configures_and_compiles_nothing(project_settings: Settings, cpu_build: BuildReport) -> None:
    request = SessionRequest(build_request("cpu", project_settings), spot_check=False)
    again = run_build_session(request, project_settings, Console(env={}, stream=io.StringIO()))
    assert again.build is not None
    assert again.build.build_dir == cpu_build.build_dir
    assert not again.build.configured
    assert again.build.configure_reason == "up to date"
    assert again.build.compiled == 0
