"""NVIDIA CUDA: nvcc and cuBLAS; a GPU is needed only to run, not to build."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.build.backends.base import BackendSpec, Choice, Found, InstallHint, PlanFacts, ProbeContext

#: CUDA architectures used when none is given and no GPU is visible
#: (PTX for Turing/Ampere/Hopper, real code for the common RTX 30/40 cards;
#: needs CUDA >= 11.8).  Override with -DCMAKE_CUDA_ARCHITECTURES=...,
#: CUDAARCHS, or [tool.skippy.build] cuda_architectures.
DEFAULT_CUDA_ARCHITECTURES: Final = "75-virtual;80-virtual;86-real;89-real;90-virtual"

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


@dataclass(frozen=True)
class _Cuda(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        env = ctx.env
        cuda_dirs = [Path(env[v]) / "bin" for v in ("CUDA_PATH", "CUDA_HOME") if env.get(v)]
        if ctx.well_known_dirs:
            cuda_dirs.append(Path("/usr/local/cuda/bin"))
        nvcc = ctx.require(env.get("CUDACXX") or "nvcc", extra_dirs=tuple(cuda_dirs), label="nvcc")
        roots = [Path(os.path.realpath(nvcc.path)).parent.parent, *(d.parent for d in cuda_dirs)]
        if not find_cuda_library("cublas", roots, ctx.library_dirs):
            raise ctx.missing("needs cuBLAS (libcublas) from the CUDA toolkit, which was not found")
        facts = {"cuda_compiler": nvcc.path}
        notes: list[str] = []
        if "CMAKE_CUDA_ARCHITECTURES" not in ctx.given:
            smi = ctx.find("nvidia-smi")
            if smi is None:
                notes.append("no nvidia-smi: using the default CUDA architectures")
            else:
                out = ctx.output((smi, "--query-gpu=compute_cap", "--format=csv,noheader"))
                detected = parse_cuda_compute_caps(out) if out is not None else None
                if detected:
                    facts["cuda_architectures"] = detected
                else:
                    notes.append("nvidia-smi found no GPU; using the default CUDA architectures")
        return Found(tools=(nvcc,), facts=MappingProxyType(facts), notes=tuple(notes))

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
        else:
            arch = Choice(arch_name, DEFAULT_CUDA_ARCHITECTURES, source="default (no GPU visible)")
        out = [
            arch,
            Choice("GGML_CUDA_FA_ALL_QUANTS", "ON", source="default (opt out with -DGGML_CUDA_FA_ALL_QUANTS=OFF)"),
        ]
        if plan.facts.get("cuda_compiler"):
            out.append(Choice("CMAKE_CUDA_COMPILER", plan.facts["cuda_compiler"], path=True))
        return tuple(out)


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
    extra_table_keys=frozenset({"cuda_fa_all_quants"}),
)
