"""AMD ROCm/HIP: hipconfig, the HIP clang, hipBLAS and rocBLAS."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.build.backends.base import BackendSpec, Choice, Found, InstallHint, PlanFacts, ProbeContext, Tool

#: AMD GPU targets used when none is given and no GPU is visible
#: (MI100/MI200/MI300, RDNA2/RDNA3).  Override with -DAMDGPU_TARGETS=... or
#: [tool.skippy.build] amdgpu_targets.
DEFAULT_AMDGPU_TARGETS: Final = "gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101;gfx1102"


def parse_amdgpu_targets(text: str) -> str | None:
    """gfx names from ``rocminfo`` (``Name: gfx1100``) or ``amdgpu-arch`` (one a line)."""
    names = set(re.findall(r"\b(gfx[0-9a-f]{3,5})\b", text))
    names.discard("gfx000")  # rocminfo lists the CPU agent as gfx000 on some versions
    return ";".join(sorted(names)) or None


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


@dataclass(frozen=True)
class _Rocm(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        env = ctx.env
        rocm_dirs = [Path(env[v]) / "bin" for v in ("ROCM_PATH", "HIP_PATH") if env.get(v)]
        if ctx.well_known_dirs:
            rocm_dirs.append(Path("/opt/rocm/bin"))
        hipconfig = ctx.require("hipconfig", extra_dirs=tuple(rocm_dirs))
        clang_dir = _first_line(ctx.output((hipconfig.path, "-l")))
        hip_path = _first_line(ctx.output((hipconfig.path, "--path")))
        compiler = Path(clang_dir) / "clang++" if clang_dir else None
        if compiler is None or not compiler.is_file():
            raise ctx.missing(f"needs the HIP clang (`hipconfig -l` gave {clang_dir!r})")
        facts = {"hip_compiler": str(compiler)}
        if hip_path:
            facts["hip_path"] = hip_path
        notes: list[str] = []
        if "AMDGPU_TARGETS" not in ctx.given and "GPU_TARGETS" not in ctx.given:
            for program in ("rocminfo", "amdgpu-arch"):
                found = ctx.find(program, tuple(rocm_dirs))
                out = ctx.output((found,)) if found else None
                targets = parse_amdgpu_targets(out) if out is not None else None
                if targets:
                    facts["amdgpu_targets"] = targets
                    break
            else:
                notes.append("no AMD GPU visible; using the default AMDGPU targets")
        tools = (hipconfig, Tool("hip-clang", str(compiler), ctx.version(str(compiler))))
        return Found(tools=tools, facts=MappingProxyType(facts), notes=tuple(notes))

    def choices(self, plan: PlanFacts) -> tuple[Choice, ...]:
        out: list[Choice] = []
        if "AMDGPU_TARGETS" in plan.given or "GPU_TARGETS" in plan.given:
            pass  # the user's value is applied (and credited as "given") by plan_build
        elif plan.facts.get("amdgpu_targets"):
            out.append(Choice("AMDGPU_TARGETS", plan.facts["amdgpu_targets"], source="detected (rocminfo/amdgpu-arch)"))
        else:
            out.append(Choice("AMDGPU_TARGETS", DEFAULT_AMDGPU_TARGETS, source="default (no GPU visible)"))
        if plan.facts.get("hip_compiler"):
            out.append(Choice("CMAKE_HIP_COMPILER", plan.facts["hip_compiler"], path=True, source="hipconfig -l"))
        return tuple(out)

    def env_overrides(self, plan: PlanFacts) -> Mapping[str, str]:
        return {"HIP_PATH": plan.facts["hip_path"]} if plan.facts.get("hip_path") else {}


BACKEND: Final = _Rocm(
    name="rocm",
    title="AMD ROCm/HIP (hipconfig, hipBLAS, rocBLAS)",
    switch="GGML_HIP",
    extra_defines=MappingProxyType({"CMAKE_POSITION_INDEPENDENT_CODE": "ON"}),
    languages=("C", "CXX", "HIP"),
    install=InstallHint(
        debian="apt-get install hipcc libhipblas-dev librocblas-dev rocminfo (or AMD's ROCm repository)",
        arch="pacman -S rocm-hip-sdk rocminfo",
        macos=None,
    ),
    host_systems=frozenset({"Linux", "Windows"}),
    host_requirement="needs Linux or Windows with ROCm",
    gpu=True,
    spot_check_args=("-ngl", "99"),
    device_prefix="ROCm",
    # the HIP backend registers under the CUDA names (no _hip_ symbol)
    artifact_markers=("ggml_backend_cuda_reg", "ggml_backend_rpc_reg"),
    table_defines=MappingProxyType({"amdgpu_targets": "AMDGPU_TARGETS"}),
)
