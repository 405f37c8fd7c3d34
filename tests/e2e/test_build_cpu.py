"""The real thing: prepare the pinned tree, build llama-server and the RPC
server for the CPU, spot-check them on the real model; then the up-to-date
rebuild configures nothing and compiles nothing.

The first run on a machine takes about 7 minutes on 2 cores (the build dir
under build_root and the compiler cache under cache_dir make later runs
fast, exactly as for ``nox -s build-cpu``).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from skippy.build.builder import parse_cmake_cache, read_stamp, run_build_session
from skippy.core import proc
from skippy.core.errors import NetworkError
from skippy.core.settings import Settings
from skippy.core.ui import Console

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project() -> Settings:
    # the environment a maintainer runs nox in (package index settings for
    # the first fetch of the sources and the model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return Settings.load(ROOT, env)


def test_build_cpu_builds_and_spot_checks_the_pinned_tree(project: Settings) -> None:
    stream = io.StringIO()
    try:
        outcome = run_build_session("cpu", project, Console(env={}, stream=stream))
    except NetworkError as exc:  # only the first fetch needs the package index
        pytest.skip(f"cannot fetch the pinned sources: {exc.what}")
    assert outcome.skipped is None
    report = outcome.build
    assert report is not None
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


def test_up_to_date_build_configures_and_compiles_nothing(project: Settings) -> None:
    console = Console(env={}, stream=io.StringIO())
    try:
        run_build_session("cpu", project, console, ["--no-spot-check"])
    except NetworkError as exc:
        pytest.skip(f"cannot fetch the pinned sources: {exc.what}")
    again = run_build_session("cpu", project, console, ["--no-spot-check"])
    assert again.build is not None
    assert not again.build.configured
    assert again.build.configure_reason == "up to date"
    assert again.build.compiled == 0
