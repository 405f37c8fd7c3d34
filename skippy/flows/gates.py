"""What a build proves before any spot check: its binary holds its backend, and one built inside a root runs there.

The artifact gate (:func:`artifact_gate`) reads the backend's registration symbols in
llama-server, with or without a spot check; a build inside a root file system links the
root's libraries, so its llama-server must run ``--version`` there (:func:`rootfs_gate`)
and is not spot-checked on the host (:func:`rootfs_spot_check` says why).  A build
session (:mod:`skippy.flows.build_session`) runs them after each build (:func:`gates`).
"""

from __future__ import annotations

from collections.abc import Mapping

from skippy.compile.backends.base import SERVER_TARGET
from skippy.compile.builder import KEEP_LOCAL_BUILDS, BuildReport, prune_local_builds
from skippy.compile.plan import BuildPlan
from skippy.compile.rootfs import mounted
from skippy.core import proc
from skippy.core.errors import BuildError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot.binaries import version_line
from skippy.spot.evidence import artifact_markers_missing
from skippy.spot.report import Proof


def artifact_gate(plan: BuildPlan, report: BuildReport, console: Console) -> Proof:
    """The binary must contain its backend: a build that fell back to CPU (an ignored CMake
    switch) lacks the backend's registration symbol.  Runs with and without the spot check."""
    server = report.binaries[SERVER_TARGET]
    markers = plan.spec.artifact_markers
    missing = artifact_markers_missing(server, markers)
    if missing:
        switches = ", ".join(f"{d.name}={d.value}" for d in plan.defines if d.name.startswith("GGML_"))
        raise BuildError(
            f"{server.name} does not contain the {plan.backend} backend: {', '.join(missing)} not in the binary",
            untouched=f"the source tree; the build is kept in {plan.build_dir}",
            next_step=f"check CMakeCache.txt in {plan.build_dir} (the switches set were: {switches}) "
            "and the configure log for an ignored or failed backend",
        )
    found = f"{server.name} contains its backend ({', '.join(markers)})"
    console.info(f"{plan.backend}: {found}")
    return Proof("artifact gate", "pass", found)


def rootfs_spot_check(plan: BuildPlan) -> str:
    """Why a build made inside a root file system is not spot-checked on the host."""
    inside = plan.rootfs
    label = f" ({inside.label})" if inside is not None else ""
    return (
        f"the binaries were built inside a root file system{label} and link its libraries "
        f"({plan.spec.root_links}), so they run there, not on this host; the artifact gate (the backend's "
        "symbols, and --version run inside the root) is the proof that was made"
    )


def rootfs_gate(plan: BuildPlan, report: BuildReport, env: Mapping[str, str], console: Console) -> str:
    """A binary built inside a root file system links the root's libraries: ``llama-server
    --version`` must run there (the build dir bound in, as for the build).  Returns its
    backend's start-up line (``BackendSpec.rootfs_gate_line``: for ROCm ``ggml_cuda_init: failed to
    initialize ROCm: ...`` without a GPU)."""
    inside = plan.rootfs
    assert inside is not None
    server = report.binaries[SERVER_TARGET]
    with mounted(inside, (plan.build_dir,), env=env, log=console.warn):
        result = proc.run([*plan.runner, str(server), "--version"], env=env, check=False, timeout=120)
    text = result.stdout + "\n" + result.stderr
    version = version_line(text)
    if not result.ok or version is None:
        raise BuildError(
            f"{server.name} does not run inside {inside.label} (`{server.name} --version` exit code "
            f"{result.returncode})",
            untouched=f"the source tree; the build is kept in {plan.build_dir}",
            next_step=f"run it by hand: {' '.join(plan.runner)} {server} --version"
            + ("" if inside.namespace else " (with /proc, /dev and the build dir mounted in the root)")
            + " and read what it says",
            details=result.tail(),
        )
    mark = plan.spec.rootfs_gate_line
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if mark is None:
        init = lines[0] if lines else "no output"
    else:
        init = next((line for line in lines if mark in line), f"no {mark} line")
    console.info(f"{plan.backend}: {server.name} --version runs inside the root ({version}): {init}")
    return init


def gates(plan: BuildPlan, report: BuildReport, settings: Settings, console: Console, *, local: bool) -> list[Proof]:
    """After a build: the artifact gate (and the root's), older local build dirs pruned."""
    proofs = [artifact_gate(plan, report, console)]
    if plan.rootfs is not None:
        init = rootfs_gate(plan, report, settings.env, console)
        proofs.append(Proof("runs in the root", "pass", f"llama-server --version runs inside the root: {init}"))
    if local:
        removed = prune_local_builds(report.build_dir)
        if removed:
            console.info(
                f"removed {len(removed)} older build dir(s) of the workdir as it stood "
                f"({', '.join(p.name for p in removed)}); the newest {KEEP_LOCAL_BUILDS} are kept"
            )
    return proofs
