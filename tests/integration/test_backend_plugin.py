"""Adding a backend is one module and one registry entry: a fake backend, declared by a
distribution's ``skippy.backends`` entry point (nothing in skippy names it), is probed,
planned, configured and built by the same code as the real ones, and gets its own nox
session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).parent / "cmake_probe"

PLUGIN = """
from dataclasses import dataclass
from types import MappingProxyType

from skippy.build.backends.base import BackendSpec, Choice, Found, InstallHint, PlanFacts, ProbeContext


@dataclass(frozen=True)
class _FakeGpu(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        tool = ctx.require("fakegpu-cc")
        arch = ctx.output((tool.path, "--arch"))
        return Found(tools=(tool,), facts=MappingProxyType({"arch": (arch or "").strip()}))

    def choices(self, plan: PlanFacts) -> tuple[Choice, ...]:
        return (Choice("PROBE_FAKEGPU_ARCH", plan.facts["arch"], source="detected (fakegpu-cc --arch)"),)


BACKEND = _FakeGpu(
    name="fakegpu",
    title="a fake GPU backend from a plug-in distribution",
    switch="PROBE_FAKEGPU",
    install=InstallHint(debian="apt-get install fakegpu-cc", arch=None, macos=None),
    gpu=True,
    spot_check_args=("-ngl", "99"),
)
"""

DRIVER = """
import json, sys
from pathlib import Path
from skippy.build.backends import registry
from skippy.build.plan import BuildOptions, plan_build
from skippy.build.builder import execute_plan
from skippy.build.cachestats import stop_cache_server
from skippy.build.toolchain import inspect_tree, probe_toolchain
from skippy.core.errors import ToolchainMissing
from skippy.core.settings import Settings
from skippy.core.ui import Console
import os

src, proj = Path(sys.argv[1]), Path(sys.argv[2])
env = dict(os.environ)
settings = Settings.from_table(proj, {"build": {"compiler_cache": "none"}}, env)
out = {"registry": list(registry())}
try:
    # the same PATH without the fake tool's directory (its first entry)
    without = os.pathsep.join(env["PATH"].split(os.pathsep)[1:])
    probe_toolchain("fakegpu", Settings.from_table(proj, {}, {**env, "PATH": without}))
except ToolchainMissing as exc:
    out["missing"] = exc.render()
tc = probe_toolchain("fakegpu", settings)
plan = plan_build("fakegpu", settings, tree=inspect_tree(src), toolchain=tc, patched_sha="1" * 40,
                  options=BuildOptions())
report = execute_plan(plan, Console(env={}, stream=sys.stderr))
stop_cache_server(plan)
out["build_dir"] = plan.build_dir.name
out["provenance"] = dict(plan.provenance)
out["values"] = dict(
    line.split("=", 1) for line in (plan.build_dir / "probe-values.txt").read_text().splitlines()
)
out["binaries"] = sorted(report.binaries)
print(json.dumps(out))
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """A distribution on PYTHONPATH declaring the fake backend, and its tool on PATH."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "skippy_fakegpu.py").write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    info = site / "skippy_fakegpu-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: skippy-fakegpu\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[skippy.backends]\nfakegpu = skippy_fakegpu:BACKEND\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "fakegpu-cc"
    tool.write_text('#!/bin/sh\ncase "$1" in --arch) echo fx9;; *) echo "fakegpu-cc 1.2.3";; esac\n', encoding="utf-8")
    tool.chmod(0o755)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return env


def test_a_plugin_backend_is_probed_planned_and_built_through_the_registry(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    src = tmp_path / "src"
    shutil.copytree(PROBE, src)
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(src), str(tmp_path / "proj")],
        env=plugin_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["registry"] == ["cpu", "metal", "cuda", "vulkan", "rocm", "fakegpu"]
    # the probe's ToolchainMissing carries the plug-in's own install hint
    assert "the fakegpu backend needs `fakegpu-cc`" in out["missing"]
    assert "apt-get install fakegpu-cc" in out["missing"]
    # its switch is ON, every real switch OFF; its choice reached CMake with its provenance
    values = out["values"]
    assert values["PROBE_FAKEGPU"] == "ON"
    assert values["GGML_CUDA"] == values["GGML_VULKAN"] == values["GGML_METAL"] == values["GGML_HIP"] == "OFF"
    assert values["PROBE_FAKEGPU_ARCH"] == "fx9"
    assert out["provenance"]["PROBE_FAKEGPU_ARCH"] == "detected (fakegpu-cc --arch)"
    assert out["build_dir"].startswith("fakegpu-")
    assert out["binaries"] == ["ggml-rpc-server", "llama-server"]


def test_a_plugin_backend_gets_a_nox_session(plugin_env: dict[str, str]) -> None:
    nox = shutil.which("nox", path=plugin_env["PATH"])
    assert nox is not None
    listed = subprocess.run(
        [nox, "--list", "-f", str(ROOT / "noxfile.py")],
        env=plugin_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = {line.split(" -> ")[0][2:].split(" [")[0]: line for line in listed.stdout.splitlines() if " -> " in line}
    assert "build-fakegpu" in lines
    assert "[build,gpu]" in lines["build-fakegpu"]
    assert "a fake GPU backend from a plug-in distribution" in lines["build-fakegpu"]
    assert {f"build-{b}" for b in ("cpu", "metal", "cuda", "vulkan", "rocm")} <= set(lines)
