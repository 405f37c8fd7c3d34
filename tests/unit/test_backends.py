"""The backend registry: one module per backend behind one protocol, complete and consistent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skippy.compile.backends import (
    failure_patterns,
    languages,
    names,
    parse_backend,
    reference_backend,
    registry,
    spec,
    switches,
    upstream_areas,
)
from skippy.compile.backends.base import BASE_LANGUAGES, RPC_TARGETS, SERVER_TARGET, Platform

#: the backends this package ships (a plug-in distribution may add more: the tests below
#: iterate the registry, and hold these only to what each of them is)
SHIPPED = ("cpu", "metal", "cuda", "vulkan", "rocm")


def test_every_backend_is_registered_once_under_its_own_name() -> None:
    assert names()[: len(SHIPPED)] == SHIPPED
    assert reference_backend() == "cpu"
    for name, entry in registry().items():
        assert entry.name == name
        assert entry.session == f"build-{name}"


@pytest.mark.parametrize("backend", names())
def test_spec_is_complete(backend: str) -> None:
    entry = spec(backend)
    assert entry.title
    assert set(entry.languages) <= set(languages())
    assert set(BASE_LANGUAGES) <= set(entry.languages)
    assert entry.default_targets == (SERVER_TARGET, RPC_TARGETS[0])
    # a backend names its own switch only; on a host where the tree turns another one on by
    # default (Metal on macOS) that one is turned off
    for system in ("Linux", "Darwin", "Windows"):
        own = switches(backend, system)
        assert {k for k, v in own.items() if v == "ON"} == ({entry.switch} if entry.switch else set())
        others_off = {
            b.switch for b in registry().values() if b.switch != entry.switch and system in b.default_on_systems
        }
        assert {k for k, v in own.items() if v == "OFF"} == others_off
    assert entry.reference is (backend == reference_backend())
    # every pattern compiles, and a CI job for every backend
    for rx, why in entry.failure_patterns:
        assert re.compile(rx) and why
    assert entry.ci_jobs
    assert all(job.title for job in entry.ci_jobs)
    # an install hint for at least one platform, and an explicit None elsewhere
    assert any(entry.install.for_platform(p) for p in Platform)
    if entry.host_systems:
        assert entry.host_requirement


def test_gpu_backends_offload_layers_in_the_spot_check() -> None:
    for backend, entry in registry().items():
        if entry.gpu:
            assert entry.spot_check_args == ("-ngl", "99"), backend
        else:
            assert "-ngl" not in entry.spot_check_args


def test_metal_is_macos_only_and_says_so() -> None:
    metal = spec("metal")
    assert metal.host_systems == frozenset({"Darwin"})
    assert "macOS with Xcode command line tools" in metal.host_requirement
    assert metal.install.debian is None
    assert metal.install.macos == "xcode-select --install"


def test_rocm_forces_position_independent_code() -> None:
    assert spec("rocm").extra_defines["CMAKE_POSITION_INDEPENDENT_CODE"] == "ON"
    assert "CMAKE_POSITION_INDEPENDENT_CODE" not in spec("cpu").extra_defines


def test_vulkan_spot_check_env_targets_the_software_device() -> None:
    env = spec("vulkan").spot_check_env
    assert env["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert env["GGML_VK_DISABLE_GRAPH_OPTIMIZE"] == "1"
    assert "{cache_dir}" in env["MESA_SHADER_CACHE_DIR"]


def test_install_hint_render_puts_the_host_first() -> None:
    text = spec("cuda").install.render(Platform.ARCH)
    lines = text.splitlines()
    assert lines[0].startswith("Arch: pacman -S cuda")
    assert "macOS: not available" in lines


def test_parse_backend() -> None:
    assert parse_backend(" CUDA ") == "cuda"
    assert parse_backend("cpu") == "cpu"
    with pytest.raises(ValueError, match="known: " + ", ".join(names())):
        parse_backend("opencl")


def test_gpu_backends_name_their_devices_and_artifact_markers() -> None:
    for backend, entry in registry().items():
        assert "ggml_backend_rpc_reg" in entry.artifact_markers, backend  # GGML_RPC=ON on every build
        if entry.gpu:
            assert entry.device_prefix, backend
            assert any(m != "ggml_backend_rpc_reg" for m in entry.artifact_markers), backend
        else:
            assert entry.device_prefix is None
    assert spec("rocm").artifact_markers[0] == "ggml_backend_cuda_reg"  # HIP registers under CUDA's names


def test_the_backends_own_their_upstream_areas_and_log_patterns() -> None:
    areas = upstream_areas()
    assert areas["CUDA"] == ("ggml/src/ggml-cuda/", "ggml/include/ggml-cuda.h")
    assert areas["ROCm"] == ("ggml/src/ggml-hip/", "ggml/src/ggml-cuda/vendors/hip.h")
    assert {"Metal", "Vulkan"} <= set(areas) and "CPU" not in areas
    whys = {why for _rx, why in failure_patterns()}
    assert {"Metal shader library failed to build", "CUDA error", "HIP/ROCm error", "Vulkan error"} <= whys
    assert languages()[:2] == ("C", "CXX") and {"CUDA", "HIP", "OBJC", "OBJCXX"} <= set(languages())


def test_nvcc_names_its_version_on_its_release_line() -> None:
    output = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0\n"
    assert spec("cuda").version_line("nvcc", output) == "Cuda compilation tools, release 13.0, V13.0.88"
    assert spec("cuda").version_line("nvidia-smi", output) is None
    assert spec("cpu").version_line("nvcc", output) is None


def test_vulkans_ci_job_keeps_the_shader_cache_its_spot_check_fills() -> None:
    (job,) = spec("vulkan").ci_jobs
    assert job.keep is not None
    # the project's default cache dir (.deps/cache): the folder the spot check points Mesa at
    assert spec("vulkan").spot_check_env_for(Path(".deps/cache"))["MESA_SHADER_CACHE_DIR"] == job.keep[1]
