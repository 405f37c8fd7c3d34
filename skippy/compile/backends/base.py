"""What every backend shares, and the one protocol a backend module implements.

A backend is a :class:`BackendSpec` instance in a module of its own
(``skippy/compile/backends/<name>.py``): data (title, CMake switch, languages,
install hints, spot-check environment and arguments) and a handful of hooks
with do-nothing defaults (probe the toolchain, choose CMake values, check the
tree).  The registry (:mod:`skippy.compile.backends`) lists the modules;
``plan_build``, ``probe_toolchain``, the nox sessions and the workflows' matrix
are driven by it, and no code outside a backend module branches on a backend.

This module imports from the build layer only what lies below the backends (the
roots and :class:`~skippy.compile.tool.Tool`): the probe helpers reach a backend
through :class:`ProbeContext`, so each backend can be tested alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Protocol

from skippy.compile.rootfs import Rootfs
from skippy.compile.tool import Tool

if TYPE_CHECKING:
    from skippy.core.errors import ToolchainMissing

#: a backend's registry name ("cpu", "cuda", ...): the key of the registry and of every report
Backend = str


class Platform(enum.StrEnum):
    """Platforms we give install hints for."""

    DEBIAN = "debian"  # Debian and Ubuntu
    ARCH = "arch"
    MACOS = "macos"


#: the languages every backend compiles (a backend adds its own: ``BackendSpec.languages``)
BASE_LANGUAGES: Final = ("C", "CXX")

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
class Found:
    """What a backend's probe adds to the common toolchain (compilers, cmake, ninja)."""

    tools: tuple[Tool, ...] = ()
    #: named facts the backend's own plan hooks read back (e.g. ``cuda_compiler``)
    facts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: feature macros and the like (e.g. the Vulkan header's VK_EXT_* extensions)
    features: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    #: set when the configure and the build run inside a root file system (its cmake and ninja)
    rootfs: Rootfs | None = None


class ProbeContext(Protocol):
    """The probe helpers a backend uses; :func:`skippy.compile.toolchain.probe_toolchain` provides them."""

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def given(self) -> Mapping[str, str]:
        """The user's -D values (they win over detection)."""
        ...

    @property
    def library_dirs(self) -> tuple[Path, ...]:
        """Where a system-installed toolkit keeps its libraries (tests pass their own)."""
        ...

    @property
    def cache_dir(self) -> Path:
        """The project's cache (where a toolchain assembled from downloads is kept)."""
        ...

    @property
    def build_table(self) -> Mapping[str, object]:
        """``[tool.skippy.build]``, for the keys the backend declares (unknown keys are refused when planning)."""
        ...

    @property
    def system(self) -> str:
        """``platform.system()`` of the host (tests pass their own)."""
        ...

    @property
    def machine(self) -> str:
        """``platform.machine()`` of the host (tests pass their own)."""
        ...

    @property
    def well_known_dirs(self) -> bool:
        """Also look in the usual install places (/usr/local/cuda, /opt/rocm, /usr/include ...)."""
        ...

    def require(self, name: str, *, extra_dirs: tuple[Path, ...] = (), label: str | None = None) -> Tool:
        """The program on PATH (or in ``extra_dirs``) with its version, or ToolchainMissing."""
        ...

    def find(self, name: str, extra_dirs: tuple[Path, ...] = ()) -> str | None: ...

    def output(self, argv: tuple[str, ...]) -> str | None:
        """Standard output of a short probe command, or None when it failed."""
        ...

    def version(self, path: str) -> str: ...

    def missing(self, what: str) -> ToolchainMissing:
        """The error for "the <backend> backend <what>", with this backend's install hints."""
        ...


@dataclass(frozen=True)
class Choice:
    """One CMake value a backend chooses, with where it came from."""

    name: str
    value: str
    #: a tool or directory path: kept out of the build-dir digest, not asserted in the cache
    path: bool = False
    source: str | None = None


@dataclass(frozen=True)
class PlanFacts:
    """What a backend's plan hooks see: the user's -D values and the probe's facts."""

    given: Mapping[str, str]
    facts: Mapping[str, str]
    features: frozenset[str]
    source_dir: Path


@dataclass(frozen=True)
class CiJob:
    """One row of the build workflow's matrix (``.github/workflows/build.yml``, written by
    :mod:`skippy.compile.backends.matrix` from the registry): where ``nox -s build-<name>`` runs."""

    #: what the job's title says after the session's name (``ubuntu, build + spot check``)
    title: str
    #: the hosted runner's label
    runs_on: str = "ubuntu-24.04"
    #: appended to the backend's name for the job's key (``arm64`` -> ``cpu-arm64``)
    key_suffix: str = ""
    #: a container image the job runs in ("" for the runner itself)
    container: str = ""
    #: workflow-lint rules ignored on the container line (``unpinned-images``), the why in ``notes``
    container_ignores: tuple[str, ...] = ()
    #: Debian packages installed first (on the runner with sudo, in a container as root)
    apt: tuple[str, ...] = ()
    #: variables the build session gets (``SKIPPY_CUDA_TOOLKIT=wheels``)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: the session's arguments (``--no-spot-check``, ``-DCMAKE_CUDA_ARCHITECTURES=89-real``)
    posargs: tuple[str, ...] = ()
    #: a folder under the project kept between runs by the Actions cache: (cache name, path)
    keep: tuple[str, str] | None = None
    #: comment lines written above the row (why it runs there, what it proves)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendSpec:
    """One backend: data plus hooks.  Subclass it in the backend's module to override a hook."""

    name: Backend
    #: one line for ``nox -l`` and the README table
    title: str
    #: its ``GGML_<X>`` switch (every registered switch is OFF but the backend's own); None for CPU
    switch: str | None
    #: defines forced for this backend besides its switch
    extra_defines: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: languages the backend compiles (compiler launchers are set only for these)
    languages: tuple[str, ...] = ("C", "CXX")
    install: InstallHint = InstallHint(None, None, None)
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
    #: spot-check timeouts (``load_timeout``, ``request_timeout``: seconds) where the defaults are too
    #: short for this backend's devices; ``[tool.skippy.spot_check]`` still wins
    spot_check_timeouts: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: ``[tool.skippy.build]`` keys this backend reads -> the CMake variable each sets
    table_defines: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: other ``[tool.skippy.build]`` keys its ``requested`` hook reads
    extra_table_keys: frozenset[str] = frozenset()
    #: how llama.cpp names this backend's devices (``Vulkan0``, ``CUDA0``): the spot check's proof
    #: that the model's layers went there; None for the CPU
    device_prefix: str | None = None
    #: symbols only a binary that contains the backend has (the artifact gate: a build that
    #: silently fell back to CPU lacks them)
    artifact_markers: tuple[str, ...] = ("ggml_backend_cpu_reg", "ggml_backend_rpc_reg")
    #: the backend every other one is compared with: the default build and spot check, and the
    #: committed fingerprint reference (exactly one registered backend: the CPU)
    reference: bool = False
    #: ``platform.system()`` values where the tree turns ``switch`` ON by default (Metal on macOS):
    #: there every other backend's build sets it OFF.  Elsewhere no other backend's build names it,
    #: so a backend's switch is never part of another backend's build-dir key
    default_on_systems: frozenset[str] = frozenset()
    #: a short name for reports (the upstream summary's area: ``CUDA``, ``Vulkan``); "" = the name
    label: str = ""
    #: the upstream tree's files of this backend (fnmatch; a trailing / means anything below):
    #: ``invoke summary`` counts the upstream commits that touch them
    upstream_areas: tuple[str, ...] = ()
    #: known failure lines of this backend in a llama-server log: (regex, what it means),
    #: matched case-sensitively per line by the spot check
    failure_patterns: tuple[tuple[str, str], ...] = ()
    #: a binary built inside a root (:attr:`Found.rootfs`): what it links from the root, so it
    #: runs only there and the spot check is not run on the host
    root_links: str = "the root's libraries"
    #: ... and the mark of the start-up line its ``llama-server --version`` prints there, which the
    #: gate inside the root reports (``ggml_cuda_init`` for HIP); None: the first line
    rootfs_gate_line: str | None = None
    #: the build workflow's jobs of this backend (empty: one on ubuntu-24.04, built and
    #: spot-checked, or built only for a GPU backend: hosted runners have none)
    ci: tuple[CiJob, ...] = ()

    @property
    def session(self) -> str:
        return f"build-{self.name}"

    @property
    def area(self) -> str:
        return self.label or self.name

    @property
    def ci_jobs(self) -> tuple[CiJob, ...]:
        if self.ci:
            return self.ci
        if self.gpu:
            return (CiJob("ubuntu, build only: hosted runners have no GPU", posargs=("--no-spot-check",)),)
        return (CiJob("ubuntu, build + spot check"),)

    def spot_check_env_for(self, cache_dir: Path) -> dict[str, str]:
        """The spot check's environment for this backend, its caches under ``cache_dir``."""
        return {k: v.replace("{cache_dir}", str(cache_dir)) for k, v in self.spot_check_env.items()}

    @property
    def table_keys(self) -> frozenset[str]:
        return frozenset(self.table_defines) | self.extra_table_keys

    # --- hooks (do nothing by default) ---------------------------------------------

    def probe(self, ctx: ProbeContext) -> Found:
        """Find the backend's own tools (cmake, ninja and the C/C++ compilers are found for every backend)."""
        return Found()

    def requested(self, table: Mapping[str, object], env: Mapping[str, str]) -> dict[str, str]:
        """-D values the user asked for in ``[tool.skippy.build]`` or the environment."""
        return {name: str(table[key]) for key, name in self.table_defines.items() if table.get(key)}

    def choices(self, plan: PlanFacts) -> tuple[Choice, ...]:
        """CMake values this backend sets from the probe's facts (the user's -D values still win)."""
        return ()

    def env_overrides(self, plan: PlanFacts) -> Mapping[str, str]:
        """Variables cmake and ninja need besides the settings' environment."""
        return {}

    def tree_problem(self, plan: PlanFacts) -> str | None:
        """Why this toolchain cannot build the tree (checked before configuring), or None."""
        return None

    def version_line(self, program: str, output: str) -> str | None:
        """The line of one of this backend's programs' ``--version`` output that names its
        version (None: the first line is taken)."""
        return None


def resolve_choice(
    table: Mapping[str, object], env: Mapping[str, str], *, key: str, env_var: str, choices: tuple[str, ...], what: str
) -> str:
    """``env_var``, else ``[tool.skippy.build] key``, else the first of ``choices`` (``auto``)."""
    from skippy.core.errors import SettingsError

    raw = env.get(env_var) or table.get(key) or choices[0]
    choice = str(raw).strip().lower()
    if choice not in choices:
        raise SettingsError(
            f"unknown {what} {raw!r}",
            untouched="everything: nothing was downloaded or built",
            next_step=f"set {env_var} (or [tool.skippy.build] {key}) to {', '.join(choices)}",
        )
    return choice
