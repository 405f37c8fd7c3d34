"""The registry of build backends: one ``Final`` mapping ``Backend -> BackendSpec``.

Adding a backend is one entry here (plus its toolchain probe in
:mod:`skippy.build.toolchain`).  Everything in a spec is data: the CMake defines it
forces, the languages whose compiler launcher it enables, the programs its
toolchain needs, how to install them per platform, and how the spot check
runs the server it builds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final


class Backend(enum.StrEnum):
    CPU = "cpu"
    METAL = "metal"
    CUDA = "cuda"
    VULKAN = "vulkan"
    ROCM = "rocm"


class Platform(enum.StrEnum):
    """Platforms we give install hints for."""

    DEBIAN = "debian"  # Debian and Ubuntu
    ARCH = "arch"
    MACOS = "macos"


#: languages a compiler launcher can be set for (CMAKE_<LANG>_COMPILER_LAUNCHER)
LAUNCHER_LANGUAGES: Final = ("C", "CXX", "CUDA", "HIP", "OBJC", "OBJCXX")

#: the server binary every backend builds, and the RPC server's target names,
#: newest first (``ggml-rpc-server`` on current trees, ``rpc-server`` before)
SERVER_TARGET: Final = "llama-server"
RPC_TARGETS: Final = ("ggml-rpc-server", "rpc-server")

#: defines forced on every build of every backend
COMMON_DEFINES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "CMAKE_BUILD_TYPE": "Release",
        "GGML_RPC": "ON",
        "BUILD_SHARED_LIBS": "OFF",
        # we set the compiler launchers ourselves; ggml's own detection is off
        "GGML_CCACHE": "OFF",
    }
)

#: defines set only when the tree declares the option (``option(NAME ...)``),
#: so older or newer trees never see a variable they do not use.
#: LLAMA_OPENSSL/LLAMA_CURL: no TLS/HTTP client in the server we test;
#: LLAMA_BUILD_UI/LLAMA_USE_PREBUILT_UI: the web UI would run npm or download
#: prebuilt assets on every build; a build must not need the network.
TREE_OPTIONAL_DEFINES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "LLAMA_OPENSSL": "OFF",
        "LLAMA_CURL": "OFF",
        "LLAMA_BUILD_UI": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",
    }
)

#: the backend switches, all OFF unless a backend turns its own ON
_SWITCHES: Final = ("GGML_METAL", "GGML_CUDA", "GGML_HIP", "GGML_VULKAN")


def _switches(on: str | None) -> dict[str, str]:
    return {name: ("ON" if name == on else "OFF") for name in _SWITCHES}


#: CUDA architectures used when none is given and no GPU is visible
#: (PTX for Turing/Ampere/Hopper, real code for the common RTX 30/40 cards;
#: needs CUDA >= 11.8).  Override with -DCMAKE_CUDA_ARCHITECTURES=...,
#: CUDAARCHS, or [tool.skippy.build] cuda_architectures.
DEFAULT_CUDA_ARCHITECTURES: Final = "75-virtual;80-virtual;86-real;89-real;90-virtual"

#: AMD GPU targets used when none is given and no GPU is visible
#: (MI100/MI200/MI300, RDNA2/RDNA3).  Override with -DAMDGPU_TARGETS=... or
#: [tool.skippy.build] amdgpu_targets.
DEFAULT_AMDGPU_TARGETS: Final = "gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101;gfx1102"


@dataclass(frozen=True)
class InstallHint:
    """How to install a backend's toolchain; ``None`` means not available there."""

    debian: str | None
    arch: str | None
    macos: str | None

    def for_platform(self, platform: Platform) -> str | None:
        return {Platform.DEBIAN: self.debian, Platform.ARCH: self.arch, Platform.MACOS: self.macos}[platform]

    def render(self, first: Platform | None = None) -> str:
        order = [Platform.DEBIAN, Platform.ARCH, Platform.MACOS]
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        labels = {Platform.DEBIAN: "Debian/Ubuntu", Platform.ARCH: "Arch", Platform.MACOS: "macOS"}
        lines = []
        for platform in order:
            hint = self.for_platform(platform)
            lines.append(f"{labels[platform]}: {hint if hint is not None else 'not available'}")
        return "\n".join(lines)


@dataclass(frozen=True)
class BackendSpec:
    backend: Backend
    #: one line for ``nox -l`` and the README table
    title: str
    #: defines forced for this backend (on top of COMMON_DEFINES)
    defines: Mapping[str, str]
    #: languages the backend compiles (compiler launchers are set only for these)
    languages: tuple[str, ...]
    #: programs the toolchain probe requires on PATH (besides cmake, ninja, a C++ compiler)
    tools: tuple[str, ...]
    install: InstallHint
    #: ``platform.system()`` values it can build on; empty = any
    host_systems: frozenset[str] = frozenset()
    #: what a host outside ``host_systems`` is told
    host_requirement: str = ""
    gpu: bool = False
    #: the targets built (the RPC server's name is resolved from the tree)
    default_targets: tuple[str, ...] = (SERVER_TARGET, RPC_TARGETS[0])
    #: environment for llama-server during the spot check ({cache_dir} is replaced)
    spot_check_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: extra llama-server arguments for the spot check
    spot_check_args: tuple[str, ...] = ()

    @property
    def session(self) -> str:
        return f"build-{self.backend.value}"


BACKENDS: Final[Mapping[Backend, BackendSpec]] = MappingProxyType(
    {
        Backend.CPU: BackendSpec(
            backend=Backend.CPU,
            title="CPU only (any host)",
            defines=MappingProxyType(_switches(None)),
            languages=("C", "CXX"),
            tools=(),
            install=InstallHint(
                debian="apt-get install g++ (cmake and ninja come with `pip install -e .`)",
                arch="pacman -S gcc",
                macos="xcode-select --install",
            ),
        ),
        Backend.METAL: BackendSpec(
            backend=Backend.METAL,
            title="Apple Metal (macOS with Xcode command line tools)",
            defines=MappingProxyType(_switches("GGML_METAL")),
            languages=("C", "CXX", "OBJC", "OBJCXX"),
            tools=("xcrun",),
            install=InstallHint(debian=None, arch=None, macos="xcode-select --install"),
            host_systems=frozenset({"Darwin"}),
            host_requirement="needs macOS with Xcode command line tools",
            gpu=True,
            spot_check_args=("-ngl", "99"),
        ),
        Backend.CUDA: BackendSpec(
            backend=Backend.CUDA,
            title="NVIDIA CUDA (nvcc; GPU optional to build)",
            defines=MappingProxyType(_switches("GGML_CUDA")),
            languages=("C", "CXX", "CUDA"),
            tools=("nvcc",),
            install=InstallHint(
                debian="apt-get install nvidia-cuda-toolkit (or NVIDIA's cuda-toolkit-12-x packages)",
                arch="pacman -S cuda",
                macos=None,
            ),
            host_systems=frozenset({"Linux", "Windows"}),
            host_requirement="needs Linux or Windows with the CUDA toolkit",
            gpu=True,
            spot_check_args=("-ngl", "99"),
        ),
        Backend.VULKAN: BackendSpec(
            backend=Backend.VULKAN,
            title="Vulkan (glslc, Vulkan and SPIR-V headers; lavapipe works without a GPU)",
            defines=MappingProxyType(_switches("GGML_VULKAN")),
            languages=("C", "CXX"),
            tools=("glslc",),
            install=InstallHint(
                debian=(
                    "apt-get install glslc libvulkan-dev spirv-headers mesa-vulkan-drivers "
                    "(Debian 12's Vulkan headers are too old: unpack trixie's libvulkan-dev and pass "
                    "-DVulkan_INCLUDE_DIR=<dir>/usr/include)"
                ),
                arch="pacman -S vulkan-headers vulkan-icd-loader shaderc spirv-headers",
                macos="brew install vulkan-headers vulkan-loader shaderc spirv-headers molten-vk",
            ),
            gpu=True,
            spot_check_env=MappingProxyType(
                {
                    # use device 0 even when it is a software (lavapipe) device
                    "GGML_VK_VISIBLE_DEVICES": "0",
                    # lavapipe segfaults on the first request with graph optimisation
                    "GGML_VK_DISABLE_GRAPH_OPTIMIZE": "1",
                    "MESA_SHADER_CACHE_DIR": "{cache_dir}/mesa-shader-cache",
                }
            ),
            spot_check_args=("-ngl", "99"),
        ),
        Backend.ROCM: BackendSpec(
            backend=Backend.ROCM,
            title="AMD ROCm/HIP (hipconfig, hipBLAS, rocBLAS)",
            defines=MappingProxyType({**_switches("GGML_HIP"), "CMAKE_POSITION_INDEPENDENT_CODE": "ON"}),
            languages=("C", "CXX", "HIP"),
            tools=("hipconfig",),
            install=InstallHint(
                debian="apt-get install hipcc libhipblas-dev librocblas-dev rocminfo (or AMD's ROCm repository)",
                arch="pacman -S rocm-hip-sdk rocminfo",
                macos=None,
            ),
            host_systems=frozenset({"Linux", "Windows"}),
            host_requirement="needs Linux or Windows with ROCm",
            gpu=True,
            spot_check_args=("-ngl", "99"),
        ),
    }
)


def parse_backend(name: str | Backend) -> Backend:
    """``"cuda"`` -> Backend.CUDA; raises ValueError listing the known names."""
    if isinstance(name, Backend):
        return name
    try:
        return Backend(name.strip().lower())
    except ValueError:
        known = ", ".join(b.value for b in Backend)
        raise ValueError(f"unknown backend {name!r}; known: {known}") from None


def spec(backend: Backend | str) -> BackendSpec:
    return BACKENDS[parse_backend(backend)]
