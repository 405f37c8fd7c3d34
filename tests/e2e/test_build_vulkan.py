"""Vulkan in the suite: ``nox -s build-vulkan`` on Mesa's software device (lavapipe).

The whole session as a user runs it: the toolchain probe (on Debian 12 it takes the
newer Vulkan headers from the system's Debian mirror into the project cache), the
pinned tree built with GGML_VULKAN=ON, and the spot check on the real model:
``--list-devices`` lists the Vulkan device, the model's layers go there (not to the
CPU), the chat answer is clean, the fingerprint agrees with the committed CPU
reference, and the RPC path offloads to a fresh RPC server.  Mesa's shader cache
lives under the project cache, so only the first run compiles the shaders (about a
minute on 2 cores).

``.ci/run`` installs what it needs (glslc, the SPIR-V and Vulkan headers, the
loader and mesa-vulkan-drivers); elsewhere the test skips saying what is missing.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from skippy.compile.configure import parse_cmake_cache
from skippy.compile.request import build_request
from skippy.core import proc
from skippy.core.errors import ToolchainMissing
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionRequest, run_build_session
from skippy.spot.report import SpotCheckReport
from tests.e2e.needs import cannot_run

pytestmark = pytest.mark.e2e

#: Mesa's Vulkan driver manifest for lavapipe (mesa-vulkan-drivers)
LAVAPIPE_ICDS = (
    Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"),
    Path("/usr/share/vulkan/icd.d/lvp_icd.aarch64.json"),
)


def test_build_vulkan_runs_on_lavapipe_and_computes_like_the_cpu(
    project_settings: Settings, default_model: Path
) -> None:
    if not any(icd.is_file() for icd in LAVAPIPE_ICDS):
        cannot_run("no lavapipe: install mesa-vulkan-drivers (see .ci/run)")
    stream = io.StringIO()
    try:
        # --recheck: the spot check runs on lavapipe even when an earlier run kept its proofs
        outcome = run_build_session(
            SessionRequest(build_request("vulkan", project_settings), recheck=True),
            project_settings,
            Console(env={}, stream=stream),
        )
    except ToolchainMissing as exc:
        cannot_run(f"the Vulkan toolchain is missing here: {exc.what} (see .ci/run)")
    assert outcome.skipped is None
    report = outcome.build
    assert report is not None
    cache = parse_cmake_cache((report.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
    assert cache["GGML_VULKAN"] == "ON"
    assert cache.get("GGML_CUDA", "OFF") == "OFF"
    include = Path(cache["Vulkan_INCLUDE_DIR"])
    header = (include / "vulkan" / "vulkan_core.h").read_text(encoding="utf-8", errors="replace")
    assert "#define VK_EXT_layer_settings 1" in header, "the build used headers new enough for the tree"

    spot = outcome.spot
    assert isinstance(spot, SpotCheckReport)
    assert spot.not_run is None, spot.not_run
    assert spot.devices is not None and "Vulkan0" in spot.devices, spot.devices
    # the default model first, then the tiny models of the families the build followed
    result, *followed = spot.results
    assert not result.model.startswith("tiny:"), result.model
    assert all(r.model.startswith("tiny:") and r.ok for r in followed), [(r.model, r.reason) for r in followed]
    assert result.ok, result.reason
    assert "layers offloaded; model buffers on Vulkan0" in result.compute.device
    assert result.content.strip(), "an answer"
    agreement = result.compute.agreement
    assert agreement is not None and agreement.status == "agrees", agreement
    assert result.compute.rpc["ok"] is True, result.compute.rpc
    shaders = project_settings.cache_dir / "mesa-shader-cache"
    assert shaders.is_dir() and any(shaders.rglob("*")), "Mesa's shader cache is under the project cache"

    devices = proc.run(
        [report.binaries["llama-server"], "--list-devices"],
        env={**project_settings.env, "GGML_VK_VISIBLE_DEVICES": "0"},
        check=False,
    )
    assert "Vulkan0" in devices.stdout + devices.stderr


#: the time box of the ops subset in the suite (the default is 300 s): ADD, MUL, SCALE and RMS_NORM take
#: about 20 s on lavapipe with a warm Mesa shader cache, the rest of the box goes to the ops after them
OPS_BUDGET_S = 75


def test_vulkan_ops_against_the_cpu_on_lavapipe_within_the_time_box(project_settings: Settings) -> None:
    """``--upstream-tests`` on a GPU backend: upstream's test-backend-ops compares the forward
    pass's ops on Vulkan0 with the CPU, one op at a time, inside the time box."""
    if not any(icd.is_file() for icd in LAVAPIPE_ICDS):
        cannot_run("no lavapipe: install mesa-vulkan-drivers (see .ci/run)")
    env = {**project_settings.env, "SKIPPY_OPS_BUDGET": str(OPS_BUDGET_S)}
    settings = Settings.load(project_settings.root, env)
    stream = io.StringIO()
    try:
        outcome = run_build_session(
            SessionRequest(build_request("vulkan", settings), spot_check=False, upstream_tests=True),
            settings,
            Console(env={}, stream=stream),
        )
    except ToolchainMissing as exc:
        cannot_run(f"the Vulkan toolchain is missing here: {exc.what} (see .ci/run)")
    report = outcome.upstream
    assert report is not None, stream.getvalue()[-3000:]
    assert report.ops_device == "Vulkan0"
    assert report.ok, "\n".join(report.render())
    ran = {o.op: o for o in report.ops}
    # the first ops of the subset ran on the device and agreed with the CPU
    for op in ("ADD", "MUL", "RMS_NORM"):
        assert ran[op].passed > 0 and ran[op].failed == 0, ran[op]
    assert sum(o.seconds for o in report.ops) <= OPS_BUDGET_S + 30
    # what the box cut short or did not reach is named, never silently dropped
    for o in report.ops:
        assert o.verdict == "passed" or o.cut_short, o
    assert "test-backend-ops on Vulkan0" in stream.getvalue()
