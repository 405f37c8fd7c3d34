"""AMD ROCm/HIP: hipconfig, the HIP clang, hipBLAS and rocBLAS.

The toolkit is a system one (``hipconfig`` and its clang) or Debian's ROCm packages in a
root file system under the project cache, where the configure and the build run with
``chroot`` (root) or ``bwrap`` in a user namespace (everyone else; ``root_runner`` /
``SKIPPY_ROOT_RUNNER``) (:mod:`skippy.compile.backends.rocm_rootfs`): ``[tool.skippy.build] rocm_toolkit``
/ ``SKIPPY_ROCM_TOOLKIT`` = ``auto`` (a complete system ROCm, else the Debian root),
``system`` or ``debian-root``.  The root's package versions are toolchain facts: they
name the build directory and go into the stamp.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.compile.backends.base import BackendSpec, Choice, CiJob, Found, InstallHint, PlanFacts, ProbeContext
from skippy.compile.backends.rocm_rootfs import (
    PIN_TABLE,
    TOOLKIT_KEY,
    WHAT,
    RootfsContext,
    launchers_home,
    make_rootfs,
    parse_rootfs_pin,
    resolve_toolkit_choice,
)
from skippy.compile.rootfs import RUNNER_KEY, resolve_runner, runner_program
from skippy.compile.tool import Tool
from skippy.core.errors import ToolchainMissing

#: AMD GPU targets used when none is given and no GPU is visible
#: (MI100/MI200/MI300, RDNA2/RDNA3).  Override with -DAMDGPU_TARGETS=... or
#: [tool.skippy.build] amdgpu_targets.
DEFAULT_AMDGPU_TARGETS: Final = "gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101;gfx1102"

#: the Debian root's default: one target (RDNA3), as the root exists to compile-check the
#: tree on machines without ROCm (seven targets make every HIP compile several times
#: heavier); a given value still wins
ROOT_DEFAULT_AMDGPU_TARGETS: Final = "gfx1100"


def parse_amdgpu_targets(text: str) -> str | None:
    """gfx names from ``rocminfo`` (``Name: gfx1100``) or ``amdgpu-arch`` (one a line)."""
    names = set(re.findall(r"\b(gfx[0-9a-f]{3,5})\b", text))
    names.discard("gfx000")  # rocminfo lists the CPU agent as gfx000 on some versions
    return ";".join(sorted(names)) or None


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def _debian_rootfs(ctx: ProbeContext, why: str) -> Found:
    """Debian's ROCm packages in a root file system under the project cache (made once)."""
    if ctx.system != "Linux":
        raise ctx.missing(f"cannot use the ROCm Debian root on {ctx.system} (it runs with chroot or bwrap on Linux)")
    pin = parse_rootfs_pin(ctx.build_table.get(PIN_TABLE))
    notes: list[str] = []
    uid = os.geteuid()
    runner = resolve_runner(ctx.build_table, ctx.env, uid)
    rctx = RootfsContext(cache_dir=ctx.cache_dir, env=ctx.env, uid=uid, runner=runner, log=notes.append)
    program = runner_program(runner, uid=uid, env=ctx.env, what=WHAT)
    root = make_rootfs(pin, rctx)
    facts = {"rocm_toolkit": "debian-root", "rocm_root": str(root.path), "toolkit": root.toolkit}
    how = "chroot" if runner == "chroot" else "bwrap, an unprivileged user namespace"
    notes.append(
        f"ROCm toolkit: {root.label}, hipcc {root.versions.get('hipcc', '?')}, HIP "
        f"{root.versions.get('libamdhip64-dev', '?')} in {root.path} ({why}); configure and build run inside it "
        f"({how})"
    )
    if "AMDGPU_TARGETS" not in ctx.given and "GPU_TARGETS" not in ctx.given:
        notes.append(f"no AMD GPU looked for in the Debian root; AMDGPU_TARGETS={ROOT_DEFAULT_AMDGPU_TARGETS}")
    tools = (Tool("rocm-root", str(root.path), root.label), *root.pinned_tools())
    inside = root.rootfs(program, runner, launchers_home(ctx.cache_dir))
    return Found(tools=tools, facts=MappingProxyType(facts), notes=tuple(notes), rootfs=inside)


@dataclass(frozen=True)
class _Rocm(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        choice = resolve_toolkit_choice(ctx.build_table, ctx.env)
        if choice == "debian-root":
            return _debian_rootfs(ctx, "asked for")
        try:
            return self._system(ctx)
        except ToolchainMissing as exc:
            if choice == "system" or not ctx.build_table.get(PIN_TABLE) or ctx.system != "Linux":
                raise
            try:
                return _debian_rootfs(ctx, f"auto: no complete system ROCm, {exc.what}")
            except ToolchainMissing as root_exc:
                # both ways are closed: say why for each, and the way to open the root's
                raise ToolchainMissing(
                    f"{exc.what}; and the Debian root instead: {root_exc.what}",
                    untouched=root_exc.untouched,
                    next_step=root_exc.next_step,
                    details=exc.details,
                ) from None

    def _system(self, ctx: ProbeContext) -> Found:
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
        elif plan.facts.get("rocm_toolkit") == "debian-root":
            source = "default for the Debian root (no GPU looked for)"
            out.append(Choice("AMDGPU_TARGETS", ROOT_DEFAULT_AMDGPU_TARGETS, source=source))
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
        debian=(
            "ROCm >= 6.1 from AMD's repository (Debian 12's and trixie's hipcc are too old), or none: "
            "apt-get install mmdebstrap, and the build makes a Debian sid root with its ROCm packages "
            f"([tool.skippy.build.{PIN_TABLE}]) under the project cache"
        ),
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
    extra_table_keys=frozenset({TOOLKIT_KEY, PIN_TABLE, RUNNER_KEY}),
    label="ROCm",
    upstream_areas=("ggml/src/ggml-hip/", "ggml/src/ggml-cuda/vendors/hip.h"),
    failure_patterns=((r"\bHIP error\b|\bROCm error\b", "HIP/ROCm error"),),
    root_links="a newer glibc, the ROCm runtime",
    # without a GPU: "ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected"
    rootfs_gate_line="ggml_cuda_init",
    ci=(
        CiJob(
            "rocm/dev container, build only: hosted runners have no GPU",
            container="rocm/dev-ubuntu-24.04:6.4.4-complete",
            container_ignores=("unpinned-images",),
            apt=("git", "ca-certificates"),
            posargs=("--no-spot-check", "-DAMDGPU_TARGETS=gfx1100"),
            notes=(
                "-complete: hipBLAS and rocBLAS included.  Pinned by tag, not digest: digests cannot be",
                "resolved where these workflows are written and checked (see .github/zizmor.yml)",
            ),
        ),
    ),
)
