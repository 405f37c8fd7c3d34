"""CUDA without a GPU or a system toolkit: the toolkit assembled from the pinned wheels
compiles and links a cuBLAS + cub program against the driver stub, the CUDA probe reports
it, and the patched llama.cpp tree configures with GGML_CUDA=ON from it and compiles a
few of its real CUDA objects (never the whole build: that is ``nox -s bench``'s).

The first run downloads about 500 MiB of wheels into the project cache (``.deps/cache/
cuda/``), where later runs find the assembled toolkit.  Heavy steps run under ``nice``.
"""

from __future__ import annotations

import io
import re
import shutil
import time
from pathlib import Path

import pytest

from skippy.compile.builder import execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.configure import parse_cmake_cache
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import Toolchain, check_tree_needs, inspect_tree, parse_ninja_targets, probe_toolchain
from skippy.core import proc
from skippy.core.errors import NetworkError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.e2e.needs import cannot_run

pytestmark = pytest.mark.e2e

#: a program using cuBLAS (host API), cub (device code) and the driver API (the stub)
PROGRAM = r"""
#include <cstdio>
#include <cuda.h>
#include <cublas_v2.h>
#include <cub/cub.cuh>

__global__ void block_sum(const float *in, float *out, int n) {
    typedef cub::BlockReduce<float, 128> BlockReduce;
    __shared__ typename BlockReduce::TempStorage tmp;
    float v = threadIdx.x < n ? in[threadIdx.x] : 0.0f;
    float s = BlockReduce(tmp).Sum(v);
    if (threadIdx.x == 0) *out = s;
}

int main() {
    int driver = 0;
    CUresult r = cuDriverGetVersion(&driver);
    cublasHandle_t handle;
    cublasStatus_t status = cublasCreate(&handle);
    block_sum<<<1, 128>>>(nullptr, nullptr, 0);
    std::printf("driver %d (%d), cublas %d\n", driver, (int)r, (int)status);
    return 0;
}
"""

#: small ggml-cuda sources (mean.cu goes through cub): enough to prove the toolkit and the tree
CUDA_OBJECTS = ("arange.cu", "clamp.cu", "mean.cu")


@pytest.fixture(scope="module")
def wheel_settings(project_settings: Settings) -> Settings:
    return Settings.load(project_settings.root, {**project_settings.env, "SKIPPY_CUDA_TOOLKIT": "wheels"})


@pytest.fixture(scope="module")
def wheel_toolchain(wheel_settings: Settings) -> Toolchain:
    started = time.monotonic()
    try:
        toolchain = probe_toolchain("cuda", wheel_settings)
    except NetworkError as exc:
        cannot_run(f"cannot download the CUDA wheels: {exc.what}")
    print(f"probe (assembly included when not cached): {time.monotonic() - started:.1f} s", *toolchain.notes)
    return toolchain


def _nice(argv: list[str]) -> list[str]:
    nice = shutil.which("nice")
    return [nice, "-n", "10", *argv] if nice else argv


def test_the_probe_reports_the_wheel_toolkit(wheel_toolchain: Toolchain, wheel_settings: Settings) -> None:
    facts = wheel_toolchain.facts
    assert facts["cuda_toolkit"] == "wheels"
    assert facts["cuda_version"] == "13.0.88"
    root = Path(facts["cuda_toolkit_root"])
    assert root.is_relative_to(wheel_settings.cache_dir / "cuda")
    assert facts["cuda_compiler"] == str(root / "bin" / "nvcc")
    versions = wheel_toolchain.tool_versions()
    assert versions["nvcc"]["version"].endswith("V13.0.88")
    assert versions["cuda-toolkit"]["version"].startswith("wheels 13.0.88 (pins ")
    assert (root / "lib64" / "stubs" / "libcuda.so").is_file()
    # a second probe reuses the assembled toolkit
    started = time.monotonic()
    again = probe_toolchain("cuda", wheel_settings)
    assert again.facts == facts
    assert time.monotonic() - started < 30


def test_nvcc_from_the_wheels_compiles_and_links_cublas_and_cub(
    wheel_toolchain: Toolchain, wheel_settings: Settings, tmp_path: Path
) -> None:
    nvcc = wheel_toolchain.facts["cuda_compiler"]
    source = tmp_path / "blas.cu"
    source.write_text(PROGRAM, encoding="utf-8")
    binary = tmp_path / "blas"
    env = dict(wheel_settings.env)  # nvcc finds its host compiler on PATH
    started = time.monotonic()
    proc.run(
        _nice([nvcc, "-arch=sm_80", "-o", str(binary), str(source), "-lcublas", "-lcuda"]),
        env=env,
        timeout=900,
    )
    print(f"nvcc compiled and linked the cuBLAS + cub program in {time.monotonic() - started:.1f} s")
    assert binary.is_file()
    readelf = shutil.which("readelf", path=env.get("PATH"))
    if readelf is None:
        pytest.skip("no readelf to read the binary's needs")
    needed = set(
        re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", proc.run([readelf, "-d", binary], env=env).stdout)
    )
    assert {"libcublas.so.13", "libcuda.so.1"} <= needed


def test_the_patched_tree_configures_with_cuda_and_compiles_a_few_objects(
    wheel_toolchain: Toolchain, wheel_settings: Settings
) -> None:
    from skippy.queue.prepare import Target, prepare

    console = Console(env={}, stream=io.StringIO())
    try:
        prepared = prepare(wheel_settings, Target.pinned(), console=console)
    except NetworkError as exc:
        cannot_run(f"cannot fetch the pinned sources: {exc.what}")
    tree = inspect_tree(prepared.workdir)
    check_tree_needs(tree, wheel_toolchain)
    plan = plan_build(
        build_request("cuda", wheel_settings),
        wheel_settings,
        tree=tree,
        toolchain=wheel_toolchain,
        patched_sha=prepared.patched_sha,
    )
    assert plan.define("CMAKE_CUDA_ARCHITECTURES") == "80"
    # the toolkit's kind and version are in the stamp (and in the build dir's name: see the unit tests)
    assert plan.stamp["tools"]["cuda-toolkit"]["version"].startswith("wheels 13.0.88 ")
    assert plan.provenance["CUDAToolkit_ROOT"] == "CUDA toolkit: wheels 13.0.88"
    started = time.monotonic()
    report = execute_plan(plan, console, build=False)
    print(f"configure: {time.monotonic() - started:.1f} s ({report.configure_reason})")
    cache = parse_cmake_cache((plan.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
    root = wheel_toolchain.facts["cuda_toolkit_root"]
    assert cache["CMAKE_CUDA_COMPILER"] == f"{root}/bin/nvcc"
    assert cache["GGML_CUDA"] == "ON"
    assert cache["GGML_CUDA_FA_ALL_QUANTS"] == "ON"
    assert cache["CMAKE_CUDA_ARCHITECTURES"] == "80"
    assert cache["CUDAToolkit_ROOT"] == root
    assert str(cache.get("CUDA_cuda_driver_LIBRARY", "")).startswith(root), "the link stub, not a system libcuda"
    ninja = plan.build_argv[0]
    listed = proc.run([ninja, "-C", str(plan.build_dir), "-t", "targets", "all"], env=plan.env).stdout
    objects = sorted(
        name
        for name in parse_ninja_targets(listed)
        if "ggml-cuda.dir" in name and name.endswith(tuple(f"/{src}.o" for src in CUDA_OBJECTS))
    )
    assert len(objects) == len(CUDA_OBJECTS), objects
    for name in objects:  # compiled on every run (the compiler cache serves a run of an unchanged tree)
        (plan.build_dir / name).unlink(missing_ok=True)
    if plan.launcher is not None:
        # start the compiler cache's server before ninja's parallel jobs race to start two
        proc.run([plan.launcher.path, "--zero-stats"], env=plan.env, check=False, timeout=120)
    started = time.monotonic()
    try:
        proc.run(_nice([ninja, "-C", str(plan.build_dir), "-j", "2", *objects]), env=dict(plan.env), timeout=1800)
    finally:
        stop_cache_server(plan)
    print(f"compiled {len(objects)} ggml-cuda objects in {time.monotonic() - started:.1f} s")
    for name in objects:
        assert (plan.build_dir / name).is_file()
