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
from pathlib import Path

import pytest

from skippy.build.builder import BuildReport, read_stamp
from skippy.build.configure import parse_cmake_cache
from skippy.check.report import SpotCheckReport
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionArgs, run_build_session, session_ending
from skippy.flows.follow import FOLLOWED

pytestmark = pytest.mark.e2e


def test_build_cpu_builds_and_spot_checks_the_pinned_tree(
    project_settings: Settings, cpu_build: BuildReport, default_model: Path
) -> None:
    """The whole session, as ``nox -s build-cpu`` runs it: probe, prepare, build, spot check,
    and the block it ends with."""
    project = project_settings
    stream = io.StringIO()
    console = Console(env={}, stream=stream)
    outcome = run_build_session("cpu", project, console)
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


def test_up_to_date_build_configures_and_compiles_nothing(project_settings: Settings, cpu_build: BuildReport) -> None:
    again = run_build_session(
        "cpu", project_settings, Console(env={}, stream=io.StringIO()), SessionArgs(spot_check=False)
    )
    assert again.build is not None
    assert again.build.build_dir == cpu_build.build_dir
    assert not again.build.configured
    assert again.build.configure_reason == "up to date"
    assert again.build.compiled == 0
