"""NVIDIA CUDA: nvcc and cuBLAS; a GPU is needed only to run, not to build.

The toolkit is a system one (nvcc plus cuBLAS) or one assembled from the package
index's wheels (:mod:`skippy.compile.backends.cuda_toolkit`): ``[tool.skippy.build]
cuda_toolkit`` / ``SKIPPY_CUDA_TOOLKIT`` = ``auto`` (a complete system toolkit, else
the wheels), ``system`` or ``wheels``.  The kind and version are toolchain facts: they
name the build directory and go into the stamp.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.compile.backends.base import BackendSpec, Choice, CiJob, Found, InstallHint, PlanFacts, ProbeContext
from skippy.compile.backends.cuda_toolkit import (
    TOOLKIT_ENV,
    AssemblyContext,
    assemble,
    parse_wheel_pins,
    resolve_toolkit_choice,
    wheels_supported,
)
from skippy.compile.tool import Tool
from skippy.core.errors import ToolchainMissing

#: CUDA architectures used when none is given and no GPU is visible
#: (PTX for Turing/Ampere/Hopper, real code for the common RTX 30/40 cards;
#: needs CUDA >= 11.8).  Override with -DCMAKE_CUDA_ARCHITECTURES=...,
#: CUDAARCHS, or [tool.skippy.build] cuda_architectures.
DEFAULT_CUDA_ARCHITECTURES: Final = "75-virtual;80-virtual;86-real;89-real;90-virtual"

#: the wheel toolkit's default without a GPU: one architecture (Ampere), as it exists to
#: compile-check the tree on machines without a GPU; a GPU or a given value still wins
WHEEL_DEFAULT_ARCHITECTURES: Final = "80"

#: the fatbinary compression of the device code (the tree's option, CUDA >= 12.8; older trees
#: and toolkits ignore it).  The tree's ``size`` makes fatbinary, which runs again on every
#: compiler-cache hit (sccache caches cudafe++, cicc and ptxas, not fatbinary), take seconds per
#: large object: about two thirds of a fresh build dir's cached CUDA objects (the bench's
#: ``cuda-profile`` section); ``balance`` takes a fiftieth of that for a larger binary.
COMPRESSION_MODE: Final = "GGML_CUDA_COMPRESSION_MODE"
DEFAULT_COMPRESSION_MODE: Final = "balance"
_COMPRESSION_SOURCE: Final = (
    "default: fatbinary runs again on every cache hit, and the tree's `size` is slow "
    "(-DGGML_CUDA_COMPRESSION_MODE=size for the smallest binary)"
)

#: the tree file that declares the option
_COMPRESSION_DECLARED_IN: Final = Path("ggml/CMakeLists.txt")


def compression_applies(plan: PlanFacts) -> bool:
    """Whether the tree reads GGML_CUDA_COMPRESSION_MODE: it declares it (trees from 2025 on)
    and the toolkit is CUDA >= 12.8 (or of a version not known here); otherwise CMake would
    report the -D as unused and the build would stop."""
    declared = plan.source_dir / _COMPRESSION_DECLARED_IN
    if not declared.is_file() or COMPRESSION_MODE not in declared.read_text(encoding="utf-8", errors="replace"):
        return False
    version = re.match(r"(\d+)\.(\d+)", plan.facts.get("cuda_version", ""))
    return version is None or (int(version[1]), int(version[2])) >= (12, 8)


_SYSTEM_LIB_DIRS: Final = (
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib/aarch64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/lib"),
)


def parse_cuda_compute_caps(text: str) -> str | None:
    """``nvidia-smi --query-gpu=compute_cap --format=csv,noheader`` -> ``"86;89"``."""
    caps: set[int] = set()
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", line)
        if m:
            caps.add(int(m.group(1)) * 10 + int(m.group(2)))
    return ";".join(str(c) for c in sorted(caps)) or None


def find_cuda_library(name: str, roots: Iterable[Path], system_dirs: Iterable[Path] = _SYSTEM_LIB_DIRS) -> Path | None:
    """``lib<name>.so*`` or ``lib<name>_static.a`` under a CUDA root or the system library dirs."""
    dirs: list[Path] = []
    for root in roots:
        dirs += [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]
    dirs += list(system_dirs)
    for directory in dirs:
        if not directory.is_dir():
            continue
        for pattern in (f"lib{name}.so*", f"lib{name}_static.a", f"{name}*.lib"):
            found = sorted(directory.glob(pattern))
            if found:
                return found[0]
    return None


def nvcc_release(version_line: str) -> str | None:
    """``Cuda compilation tools, release 13.0, V13.0.88`` -> ``13.0.88``."""
    m = re.search(r"\bV(\d+(?:\.\d+)+)", version_line) or re.search(r"release (\d+(?:\.\d+)+)", version_line)
    return m.group(1) if m else None


def _architectures(ctx: ProbeContext, facts: dict[str, str], notes: list[str]) -> None:
    """The visible GPUs' architectures (nvidia-smi), unless the user gave them."""
    if "CMAKE_CUDA_ARCHITECTURES" in ctx.given:
        return
    smi = ctx.find("nvidia-smi")
    if smi is None:
        notes.append("no nvidia-smi: using the default CUDA architectures")
        return
    out = ctx.output((smi, "--query-gpu=compute_cap", "--format=csv,noheader"))
    detected = parse_cuda_compute_caps(out) if out is not None else None
    if detected:
        facts["cuda_architectures"] = detected
    else:
        notes.append("nvidia-smi found no GPU; using the default CUDA architectures")


def _system_toolkit(ctx: ProbeContext) -> Found:
    """An installed toolkit: nvcc on PATH (or CUDA_PATH/CUDA_HOME, /usr/local/cuda) and cuBLAS."""
    env = ctx.env
    cuda_dirs = [Path(env[v]) / "bin" for v in ("CUDA_PATH", "CUDA_HOME") if env.get(v)]
    if ctx.well_known_dirs:
        cuda_dirs.append(Path("/usr/local/cuda/bin"))
    nvcc = ctx.require(env.get("CUDACXX") or "nvcc", extra_dirs=tuple(cuda_dirs), label="nvcc")
    root = Path(os.path.realpath(nvcc.path)).parent.parent
    roots = [root, *(d.parent for d in cuda_dirs)]
    if not find_cuda_library("cublas", roots, ctx.library_dirs):
        raise ctx.missing("needs cuBLAS (libcublas) from the CUDA toolkit, which was not found")
    version = nvcc_release(nvcc.version) or "unknown"
    facts = {
        "cuda_compiler": nvcc.path,
        "cuda_toolkit": "system",
        "cuda_version": version,
        "toolkit": f"cuda system {version}",
    }
    notes: list[str] = []
    _architectures(ctx, facts, notes)
    kit = Tool("cuda-toolkit", str(root), f"system {version}")
    return Found(tools=(nvcc, kit), facts=MappingProxyType(facts), notes=tuple(notes))


def _wheel_toolkit(ctx: ProbeContext, why: str | None) -> Found:
    """The toolkit assembled from the pinned wheels under the project cache."""
    if not wheels_supported(ctx.system, ctx.machine):
        raise ctx.missing(
            f"cannot use the CUDA wheels on {ctx.system} {ctx.machine} (they are Linux x86_64 builds)"
            + (f"; and {why}" if why else "")
        )
    pins = parse_wheel_pins(ctx.build_table.get("cuda_wheels"))
    cc = ctx.find(ctx.env.get("CC") or "cc") or "cc"
    notes: list[str] = []
    kit = assemble(pins, AssemblyContext(cache_dir=ctx.cache_dir, env=ctx.env, cc=cc, log=notes.append))
    if kit.downloaded_bytes:
        notes.append(
            f"CUDA wheels: {kit.downloaded_bytes / (1 << 20):.0f} MiB downloaded in {kit.download_seconds:.1f} s, "
            f"assembled in {kit.assembly_seconds:.1f} s"
        )
    nvcc = Tool("nvcc", str(kit.nvcc), ctx.version(str(kit.nvcc)))
    facts = {
        "cuda_compiler": str(kit.nvcc),
        "cuda_toolkit_root": str(kit.root),
        "cuda_toolkit": "wheels",
        "cuda_version": kit.version,
        "toolkit": f"cuda wheels {kit.version} {kit.digest}",
    }
    notes.append(f"CUDA toolkit: {kit.label} in {kit.root}" + (f" ({why})" if why else ""))
    _architectures(ctx, facts, notes)
    return Found(
        tools=(nvcc, Tool("cuda-toolkit", str(kit.root), kit.label)),
        facts=MappingProxyType(facts),
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class _Cuda(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        choice = resolve_toolkit_choice(ctx.build_table, ctx.env)
        if choice == "wheels":
            return _wheel_toolkit(ctx, None)
        try:
            return _system_toolkit(ctx)
        except ToolchainMissing as exc:
            # auto falls back only where wheels are pinned and can run
            pinned = bool(ctx.build_table.get("cuda_wheels"))
            if choice == "system" or not pinned or not wheels_supported(ctx.system, ctx.machine):
                raise
            return _wheel_toolkit(ctx, f"auto: no complete system toolkit, {exc.what}")

    def requested(self, table: Mapping[str, object], env: Mapping[str, str]) -> dict[str, str]:
        out = super().requested(table, env)
        if "cuda_fa_all_quants" in table:
            out["GGML_CUDA_FA_ALL_QUANTS"] = "ON" if table["cuda_fa_all_quants"] else "OFF"
        if env.get("CUDAARCHS"):
            # CMake's own variable for the default CUDA architectures
            out["CMAKE_CUDA_ARCHITECTURES"] = env["CUDAARCHS"]
        return out

    def choices(self, plan: PlanFacts) -> tuple[Choice, ...]:
        arch_name = "CMAKE_CUDA_ARCHITECTURES"
        if arch_name in plan.given:
            arch = Choice(arch_name, plan.given[arch_name], source="given")
        elif plan.facts.get("cuda_architectures"):
            arch = Choice(arch_name, plan.facts["cuda_architectures"], source="detected (nvidia-smi)")
        elif plan.facts.get("cuda_toolkit") == "wheels":
            source = "default for the wheel toolkit (no GPU visible)"
            arch = Choice(arch_name, WHEEL_DEFAULT_ARCHITECTURES, source=source)
        else:
            arch = Choice(arch_name, DEFAULT_CUDA_ARCHITECTURES, source="default (no GPU visible)")
        out = [
            arch,
            Choice("GGML_CUDA_FA_ALL_QUANTS", "ON", source="default (opt out with -DGGML_CUDA_FA_ALL_QUANTS=OFF)"),
        ]
        if compression_applies(plan):
            out.append(Choice(COMPRESSION_MODE, DEFAULT_COMPRESSION_MODE, source=_COMPRESSION_SOURCE))
        kind = plan.facts.get("cuda_toolkit")
        toolkit = f"CUDA toolkit: {kind} {plan.facts.get('cuda_version', '')}".rstrip() if kind else None
        if plan.facts.get("cuda_compiler"):
            out.append(Choice("CMAKE_CUDA_COMPILER", plan.facts["cuda_compiler"], path=True, source=toolkit))
        if plan.facts.get("cuda_toolkit_root"):
            # else FindCUDAToolkit may take a partial system toolkit's libraries
            out.append(Choice("CUDAToolkit_ROOT", plan.facts["cuda_toolkit_root"], path=True, source=toolkit))
        return tuple(out)

    def version_line(self, program: str, output: str) -> str | None:
        """nvcc's version is its last ``release`` line (its first is a copyright)."""
        if program != "nvcc":
            return None
        lines = [line.strip() for line in output.splitlines() if "release" in line]
        return lines[-1] if lines else None


BACKEND: Final = _Cuda(
    name="cuda",
    title="NVIDIA CUDA (nvcc; GPU optional to build)",
    switch="GGML_CUDA",
    languages=("C", "CXX", "CUDA"),
    install=InstallHint(
        debian="apt-get install nvidia-cuda-toolkit (or NVIDIA's cuda-toolkit-12-x packages)",
        arch="pacman -S cuda",
        macos=None,
    ),
    host_systems=frozenset({"Linux", "Windows"}),
    host_requirement="needs Linux or Windows with the CUDA toolkit",
    gpu=True,
    spot_check_args=("-ngl", "99"),
    device_prefix="CUDA",
    artifact_markers=("ggml_backend_cuda_reg", "ggml_backend_rpc_reg"),
    table_defines=MappingProxyType({"cuda_architectures": "CMAKE_CUDA_ARCHITECTURES"}),
    extra_table_keys=frozenset({"cuda_fa_all_quants", "cuda_toolkit", "cuda_wheels"}),
    label="CUDA",
    upstream_areas=("ggml/src/ggml-cuda/", "ggml/include/ggml-cuda.h"),
    failure_patterns=(
        (r"\bCUDA error\b", "CUDA error"),
        (r"ggml_cuda\w*: .*\berror\b", "CUDA error"),
    ),
    ci=(
        CiJob(
            "ubuntu, CUDA toolkit from wheels, build only: hosted runners have no GPU",
            env=MappingProxyType({TOOLKIT_ENV: "wheels"}),
            posargs=("--no-spot-check", "-DCMAKE_CUDA_ARCHITECTURES=89-real"),
            notes=(
                "no system CUDA: the toolkit is assembled from the pinned wheels in pyproject.toml",
                "([tool.skippy.build.cuda_wheels]) under .deps/cache, with a link-time driver stub; one",
                "architecture keeps the build inside the job's time; no GPU, so no spot check (the",
                "artifact gate still requires the CUDA backend in the binary)",
            ),
        ),
    ),
)
