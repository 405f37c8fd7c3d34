"""Adding a backend is one module: a fake backend, declared by a distribution's
``skippy.backends`` entry point (nothing in skippy names it), is probed, planned, configured
and built by the same code as the real ones, gets its own nox session, its row of the build
workflow's matrix (with its variables), its log patterns and upstream area, and the tests that
iterate the registry run for it too; no other backend's build dir changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.workflowtools import load

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).parent / "cmake_probe"

PLUGIN = """
from dataclasses import dataclass
from types import MappingProxyType

from skippy.compile.backends.base import BackendSpec, Choice, CiJob, Found, InstallHint, PlanFacts, ProbeContext


@dataclass(frozen=True)
class _FakeGpu(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        tool = ctx.require("fakegpu-cc")
        arch = ctx.output((tool.path, "--arch"))
        return Found(tools=(tool,), facts=MappingProxyType({"arch": (arch or "").strip()}))

    def choices(self, plan: PlanFacts) -> tuple[Choice, ...]:
        arch = plan.facts.get("arch")
        return (Choice("PROBE_FAKEGPU_ARCH", arch, source="detected (fakegpu-cc --arch)"),) if arch else ()


BACKEND = _FakeGpu(
    name="fakegpu",
    title="a fake GPU backend from a plug-in distribution",
    switch="PROBE_FAKEGPU",
    install=InstallHint(debian="apt-get install fakegpu-cc", arch=None, macos=None),
    gpu=True,
    spot_check_args=("-ngl", "99"),
    device_prefix="FakeGpu",
    artifact_markers=("ggml_backend_fakegpu_reg", "ggml_backend_rpc_reg"),
    label="FakeGPU",
    upstream_areas=("ggml/src/ggml-fakegpu/",),
    failure_patterns=((r"fakegpu: device lost", "FakeGPU device lost"),),
    ci=(
        CiJob(
            "ubuntu, FakeGPU SDK, build only: hosted runners have no GPU",
            apt=("fakegpu-cc",),
            env=MappingProxyType({"FAKEGPU_SDK": "/opt/fakegpu"}),
            posargs=("--no-spot-check",),
            notes=("a plug-in's job: nothing in the workflow names it",),
        ),
    ),
)
"""

#: the build-dir names of the shipped backends, planned purely (no tool runs): with and without
#: the plug-in installed they must be the same
KEYS = """
import json
from pathlib import Path
from skippy.compile.backends import failure_patterns, names, upstream_areas
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, TreeInfo
from skippy.spot.chat import scan_log
from skippy.core.settings import Settings

proj = Path("/nonexistent/proj")
settings = Settings.from_table(proj, {}, {})
tree = TreeInfo(source_dir=proj / ".deps" / "llama.cpp", options=frozenset({"GGML_RPC"}),
                languages=frozenset({"C", "CXX"}), rpc_target="ggml-rpc-server")
dirs = {}
for backend in ("cpu", "vulkan"):
    for system in ("Linux", "Darwin"):
        tc = Toolchain(backend=backend, system=system, cmake=Tool("cmake", "/t/cmake", "4"),
                       ninja=Tool("ninja", "/t/ninja", "1"))
        planned = plan_build(build_request(backend, settings), settings, tree=tree, toolchain=tc, patched_sha="1" * 40)
        dirs[f"{backend} {system}"] = planned.build_dir.name
print(json.dumps({
    "dirs": dirs,
    "names": list(names()),
    "areas": upstream_areas(),
    "patterns": [why for _rx, why in failure_patterns()],
    "scan": scan_log(["ok", "fakegpu: device lost (code 7)"]),
}))
"""

DRIVER = """
import json, sys
from pathlib import Path
from skippy.compile.backends import registry
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.builder import execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.toolchain import inspect_tree, probe_toolchain
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
plan = plan_build(build_request("fakegpu", settings), settings, tree=inspect_tree(src), toolchain=tc,
                  patched_sha="1" * 40)
report = execute_plan(plan, Console(env={}, stream=sys.stderr))
stop_cache_server(plan)
out["build_dir"] = plan.build_dir.name
out["provenance"] = dict(plan.provenance)
out["given"] = [d.name for d in plan.defines]
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
    assert out["registry"][-1] == "fakegpu" and {"cpu", "vulkan"} <= set(out["registry"])
    # the probe's ToolchainMissing carries the plug-in's own install hint
    assert "the fakegpu backend needs `fakegpu-cc`" in out["missing"]
    assert "apt-get install fakegpu-cc" in out["missing"]
    # its switch is ON and no other backend's is named (the tree leaves them OFF); its choice
    # reached CMake with its provenance
    values = out["values"]
    assert values["PROBE_FAKEGPU"] == "ON"
    assert not {"GGML_CUDA", "GGML_VULKAN", "GGML_METAL", "GGML_HIP"} & set(out["given"])
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
    assert {f"build-{b}" for b in _python(plugin_env, KEYS)["names"]} <= set(lines)


def _python(env: dict[str, str], code: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert isinstance(out, dict)
    return out


def _without_plugin(plugin_env: dict[str, str]) -> dict[str, str]:
    return {**plugin_env, "PYTHONPATH": str(ROOT)}


def test_a_plugin_backend_changes_no_other_backends_build_dir_and_brings_its_own_facts(
    plugin_env: dict[str, str],
) -> None:
    with_plugin = _python(plugin_env, KEYS)
    without = _python(_without_plugin(plugin_env), KEYS)
    assert "fakegpu" in with_plugin["names"] and "fakegpu" not in without["names"]
    # the shipped backends' build dirs (hence their configured trees) do not move
    assert with_plugin["dirs"] == without["dirs"]
    assert with_plugin["dirs"]["cpu Linux"] != with_plugin["dirs"]["cpu Darwin"], "Metal is OFF on macOS"
    # its upstream area (invoke summary) and its log pattern (the spot check) come with it
    assert with_plugin["areas"]["FakeGPU"] == ["ggml/src/ggml-fakegpu/"]
    assert "FakeGPU" not in without["areas"]
    assert with_plugin["scan"] == [["fakegpu: device lost (code 7)", "FakeGPU device lost"]]
    assert without["scan"] == []


def test_a_plugin_backend_gets_its_row_of_the_build_matrix(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    workflow = tmp_path / "build.yml"
    shutil.copy(ROOT / ".github" / "workflows" / "build.yml", workflow)
    generate = [sys.executable, "-m", "skippy.compile.backends.matrix", str(workflow)]
    stale = subprocess.run([*generate, "--check"], env=plugin_env, capture_output=True, text=True, check=False)
    assert stale.returncode == 1, stale.stdout + stale.stderr
    subprocess.run(generate, env=plugin_env, capture_output=True, text=True, check=True, timeout=120)
    text = workflow.read_text(encoding="utf-8")
    job = load(workflow)["jobs"]["build"]
    rows = {row["key"]: row for row in job["strategy"]["matrix"]["include"]}
    assert rows["fakegpu"] == {
        "backend": "fakegpu",
        "key": "fakegpu",
        "session": "build-fakegpu",
        "title": "build-fakegpu (ubuntu, FakeGPU SDK, build only: hosted runners have no GPU)",
        "runs-on": "ubuntu-24.04",
        "container": "",
        "apt": "fakegpu-cc",
        "posargs": "--no-spot-check",
        "FAKEGPU_SDK": "/opt/fakegpu",
    }
    assert "# a plug-in's job: nothing in the workflow names it" in text
    # the build step passes its variable from its row; the other rows are as they were
    (build,) = [s for s in job["steps"] if "nox --report" in str(s.get("run", ""))]
    assert build["env"]["FAKEGPU_SDK"] == "${{ matrix.FAKEGPU_SDK }}"
    shipped = load(ROOT / ".github" / "workflows" / "build.yml")
    before = {row["key"]: row for row in shipped["jobs"]["build"]["strategy"]["matrix"]["include"]}
    assert {k: v for k, v in rows.items() if k != "fakegpu"} == before


#: the unit tests that iterate the registry (they once listed the backends by name)
ITERATING = ("tests/unit/test_backends.py", "tests/unit/test_build_plan.py")


def test_the_tests_that_iterate_the_registry_run_for_a_plugin_backend_too(plugin_env: dict[str, str]) -> None:
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    collected = subprocess.run(
        [*pytest_argv, "--collect-only", *ITERATING],
        env=plugin_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert collected.returncode == 0, collected.stdout + collected.stderr
    ids = [line for line in collected.stdout.splitlines() if "[fakegpu]" in line]
    assert any("test_spec_is_complete[fakegpu]" in i for i in ids), collected.stdout
    assert any("test_a_backend_names_no_other_backends_switch" in i for i in ids), collected.stdout
    ran = subprocess.run(
        [*pytest_argv, "-k", "fakegpu or registered or upstream_areas", *ITERATING],
        env=plugin_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "passed" in ran.stdout and "failed" not in ran.stdout


def test_a_plugin_backend_gets_its_row_of_the_docs_backends_table(plugin_env: dict[str, str]) -> None:
    """The reference's backends table is made from the registry: with the plug-in installed the
    shipped table is stale (``--check`` names it, writing nothing) and the made one has its row."""
    check = subprocess.run(
        [sys.executable, "-m", "tooling.docs", "--check"],
        cwd=ROOT,
        env=plugin_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert check.returncode == 1, check.stdout + check.stderr
    assert "backends" in check.stdout + check.stderr
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "from skippy.compile.backends import registry\n"
            "from tooling.docs.reference import render_backends\n"
            "print(render_backends(registry()))",
        ],
        env=plugin_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "build-fakegpu" in made and "PROBE_FAKEGPU" in made, made
    # the built-in rows are the shipped table's own
    from skippy.compile.backends import registry
    from tooling.docs.reference import render_backends

    shipped = render_backends(registry())
    assert all(line in made for line in shipped.splitlines()), made
