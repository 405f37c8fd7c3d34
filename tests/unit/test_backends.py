"""The backend registry: one entry per backend, complete and consistent."""

from __future__ import annotations

import pytest

from skippy.build.backends import (
    BACKENDS,
    LAUNCHER_LANGUAGES,
    RPC_TARGETS,
    SERVER_TARGET,
    Backend,
    Platform,
    parse_backend,
    spec,
)


def test_every_backend_has_exactly_one_spec() -> None:
    assert set(BACKENDS) == set(Backend)
    for backend, entry in BACKENDS.items():
        assert entry.backend is backend
        assert entry.session == f"build-{backend.value}"


@pytest.mark.parametrize("backend", list(Backend))
def test_spec_is_complete(backend: Backend) -> None:
    entry = spec(backend)
    assert entry.title
    assert set(entry.languages) <= set(LAUNCHER_LANGUAGES)
    assert {"C", "CXX"} <= set(entry.languages)
    assert entry.default_targets == (SERVER_TARGET, RPC_TARGETS[0])
    # every backend names every switch, and turns on at most its own
    switches = {k: v for k, v in entry.defines.items() if k in {"GGML_METAL", "GGML_CUDA", "GGML_HIP", "GGML_VULKAN"}}
    assert len(switches) == 4
    assert sum(v == "ON" for v in switches.values()) == (0 if backend is Backend.CPU else 1)
    # an install hint for at least one platform, and an explicit None elsewhere
    assert any(entry.install.for_platform(p) for p in Platform)
    if entry.host_systems:
        assert entry.host_requirement


def test_gpu_backends_offload_layers_in_the_spot_check() -> None:
    for backend, entry in BACKENDS.items():
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
    assert spec(Backend.ROCM).defines["CMAKE_POSITION_INDEPENDENT_CODE"] == "ON"
    assert "CMAKE_POSITION_INDEPENDENT_CODE" not in spec(Backend.CPU).defines


def test_vulkan_spot_check_env_targets_the_software_device() -> None:
    env = spec(Backend.VULKAN).spot_check_env
    assert env["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert env["GGML_VK_DISABLE_GRAPH_OPTIMIZE"] == "1"
    assert "{cache_dir}" in env["MESA_SHADER_CACHE_DIR"]


def test_install_hint_render_puts_the_host_first() -> None:
    text = spec(Backend.CUDA).install.render(Platform.ARCH)
    lines = text.splitlines()
    assert lines[0].startswith("Arch: pacman -S cuda")
    assert "macOS: not available" in lines


def test_parse_backend() -> None:
    assert parse_backend(" CUDA ") is Backend.CUDA
    assert parse_backend(Backend.CPU) is Backend.CPU
    with pytest.raises(ValueError, match="known: cpu, metal, cuda, vulkan, rocm"):
        parse_backend("opencl")
