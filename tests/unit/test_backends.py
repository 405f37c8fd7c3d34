"""The backend registry: one module per backend behind one protocol, complete and consistent."""

from __future__ import annotations

import pytest

from skippy.build.backends import names, parse_backend, registry, spec, switches
from skippy.build.backends.base import LAUNCHER_LANGUAGES, RPC_TARGETS, SERVER_TARGET, Platform


def test_every_backend_is_registered_once_under_its_own_name() -> None:
    assert names() == ("cpu", "metal", "cuda", "vulkan", "rocm")
    for name, entry in registry().items():
        assert entry.name == name
        assert entry.session == f"build-{name}"


@pytest.mark.parametrize("backend", names())
def test_spec_is_complete(backend: str) -> None:
    entry = spec(backend)
    assert entry.title
    assert set(entry.languages) <= set(LAUNCHER_LANGUAGES)
    assert {"C", "CXX"} <= set(entry.languages)
    assert entry.default_targets == (SERVER_TARGET, RPC_TARGETS[0])
    # every backend names every switch, and turns on at most its own
    own = switches(backend)
    assert set(own) == {"GGML_METAL", "GGML_CUDA", "GGML_HIP", "GGML_VULKAN"}
    assert sum(v == "ON" for v in own.values()) == (0 if backend == "cpu" else 1)
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
    with pytest.raises(ValueError, match="known: cpu, metal, cuda, vulkan, rocm"):
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
