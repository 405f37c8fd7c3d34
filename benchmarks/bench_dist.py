"""Bench section ``dist``: the CPU build and a sample of CUDA's objects sent to a local sccache-dist
cluster, beside local builds.

In one run, on the prepared tree: a cold CPU build (llama-server and the RPC server) with an
empty local sccache, then the same build with an empty cache sent to a scheduler and two build
servers started on this machine (:mod:`skippy.compile.distcluster`, bubblewrap sandboxes). The
servers share this machine's cores, so this measures what distribution costs, not what it
gains: the compiles distributed, the wall times, and the overhead per compile. From those and
the local build's own step times (Ninja's log) it estimates the wall time with N real servers
(stated as an estimate in docs/building.md).

The same run does it for a sample of CUDA's objects (a whole CUDA build is about 25 minutes
here): the CUDA backend configured in a machine of its own on each side, every k-th of
ggml-cuda's ``.cu.o`` targets (sorted by name, :data:`CUDA_SAMPLE` of them) built with Ninja
through the builder (its environment, its check of the cluster and its fallback), locally then
through the cluster, each with an empty cache; the estimate scales the sample's compile seconds
to every CUDA object (links not counted).

It also counts, for each backend whose toolchain this host has, the compile steps of the
build's targets (``ninja -t commands``): each becomes at least one entry of a remote cache, one
Actions-cache entry per object with ``SKIPPY_CACHE_STORAGE=gha`` (configure only).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks.bench_builds import build_backend
from benchmarks.bench_proofs import _quiet, machine_settings, share_downloads
from skippy.compile.builder import BuildReport
from skippy.compile.configure import parse_cmake_cache
from skippy.compile.distcluster import find_sccache_dist, plan_cluster, running_cluster, write_cluster
from skippy.compile.toolchain import parse_ninja_targets
from skippy.core import proc
from skippy.core.errors import SkippyError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare

SERVERS: Final = 2
#: the estimate's real servers (each with this machine's cores)
ESTIMATE_SERVERS: Final = (1, 2, 4, 8)
#: the backends whose compile steps are counted (those this host can configure)
COUNTED: Final = ("cpu", "vulkan", "cuda")
#: the ggml-cuda objects built on each side (a whole CUDA build is about 25 minutes here)
CUDA_SAMPLE: Final = 20
#: how a CUDA object's Ninja target ends
CUDA_OBJECT: Final = ".cu.o"


def ninja_steps(build_dir: Path) -> dict[str, float]:
    """{output: seconds} of the last run of each step in ``.ninja_log``."""
    steps: dict[str, float] = {}
    for line in (build_dir / ".ninja_log").read_text("utf-8").splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) >= 4:
            steps[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return steps


def estimate(*, compile_s: float, other_s: float, compiles: int, overhead_s: float, cores: int, servers: int) -> float:
    """Wall seconds of the build with ``servers`` real build servers of ``cores`` cores each: the
    compiles spread over every server's cores, each paying the measured overhead; the other
    steps (links, generators) stay local on this machine's cores."""
    per_compile = compile_s / max(compiles, 1) + overhead_s
    return other_s / cores + compiles * per_compile / (servers * cores)


def estimates(*, compile_s: float, other_s: float, compiles: int, overhead_s: float, cores: int) -> dict[str, float]:
    """{servers: estimated wall seconds} for each of :data:`ESTIMATE_SERVERS` (a negative measured
    overhead counts as none)."""
    return {
        str(n): round(
            estimate(
                compile_s=compile_s,
                other_s=other_s,
                compiles=compiles,
                overhead_s=max(overhead_s, 0.0),
                cores=cores,
                servers=n,
            ),
            1,
        )
        for n in ESTIMATE_SERVERS
    }


def overhead_per_compile(*, local_s: float, dist_s: float, cores: int, compiles: int) -> float:
    """The extra core-seconds each compile cost when sent (packaging, upload, sandbox, download):
    the two builds' difference on this machine's cores, spread over the compiles sent."""
    return (dist_s - local_s) * cores / max(compiles, 1)


def sample_objects(targets: Iterable[str], size: int) -> tuple[str, ...]:
    """A deterministic sample of the CUDA objects (``*.cu.o``) among ``targets``: sorted by name,
    every k-th from the first (k = how many there are // ``size``), ``size`` of them at most."""
    objects = sorted({t for t in targets if t.endswith(CUDA_OBJECT)})
    step = max(len(objects) // max(size, 1), 1)
    return tuple(objects[::step][:size])


def _ninja_tool(build_dir: Path, env: Mapping[str, str], *args: str) -> str:
    """``ninja -C build_dir -t <args>`` with the Ninja the build dir was configured with."""
    ninja = parse_cmake_cache((build_dir / "CMakeCache.txt").read_text("utf-8", errors="replace"))["CMAKE_MAKE_PROGRAM"]
    return proc.run([ninja, "-C", str(build_dir), "-t", *args], env=env).stdout


def count_compiles(settings: Settings, backend: str, source: Path, sha: str) -> int | None:
    """The compile steps of ``backend``'s targets (configure only), or None when this host cannot
    configure it."""
    try:
        report = build_backend(backend, settings, _quiet(), source_dir=source, patched_sha=sha, build=False, stop=True)
    except SkippyError:
        return None  # a toolchain this host lacks
    known = parse_ninja_targets(_ninja_tool(report.build_dir, settings.env, "targets", "all"))
    wanted = [t for t in ("llama-server", "ggml-rpc-server", "rpc-server") if t in known]
    out = _ninja_tool(report.build_dir, settings.env, "commands", *wanted)
    return sum(1 for line in out.splitlines() if " -c " in f" {line} ")


def _machine(settings: Settings, root: Path, name: str, **env: str) -> Settings:
    """A machine of its own under ``root`` building through sccache (``env``: its settings),
    sharing the project's downloads."""
    machine = machine_settings(settings, root, name, SKIPPY_COMPILER_CACHE="sccache", **env)
    share_downloads(settings, machine)
    return machine


def _timed_build(
    machine: Settings, backend: str, sha: str, jobs: int, targets: tuple[str, ...] = ()
) -> tuple[BuildReport, float]:
    """A build of the workdir (``targets``: those instead of the backend's) and its wall seconds."""
    started = time.monotonic()
    report = build_backend(
        backend,
        machine,
        _quiet(),
        source_dir=machine.workdir,
        patched_sha=sha,
        jobs=jobs,
        targets=targets,
        stop=True,
    )
    return report, time.monotonic() - started


@dataclass(frozen=True)
class SampleBuild:
    """The sampled CUDA objects built on one side."""

    report: BuildReport
    wall_s: float
    sample: tuple[str, ...]
    #: every CUDA object of the build dir
    total: int


def _cuda_sample_build(machine: Settings, sha: str, jobs: int) -> SampleBuild:
    """Configure the CUDA backend on ``machine``, then build :data:`CUDA_SAMPLE` of its objects."""
    configured = build_backend("cuda", machine, _quiet(), source_dir=machine.workdir, patched_sha=sha, build=False)
    targets = parse_ninja_targets(_ninja_tool(configured.build_dir, machine.env, "targets", "all"))
    sample = sample_objects(targets, CUDA_SAMPLE)
    report, wall = _timed_build(machine, "cuda", sha, jobs, sample)
    return SampleBuild(report, wall, sample, sum(1 for t in targets if t.endswith(CUDA_OBJECT)))


def _side(report: BuildReport, wall_s: float, jobs: int) -> dict[str, Any]:
    """The figures of one side of a comparison."""
    cache = report.cache
    return {
        "wall_s": round(wall_s, 1),
        "build_s": round(report.build_seconds, 1),
        "compiles": report.compiled,
        "jobs": jobs,
        "counts": cache.dist.as_dict() if cache is not None and cache.dist is not None else None,
        "fallback": cache.dist_fallback if cache is not None else "no stats",
    }


def cuda_figures(here: SampleBuild, there: SampleBuild, *, cores: int, dist_jobs: int) -> dict[str, Any]:
    """The CUDA sample's figures: both sides, the overhead per object and the estimate of the
    whole object set (the sample's compile seconds scaled to every object; links not counted)."""
    sample_s = sum(s for out, s in ninja_steps(here.report.build_dir).items() if out in here.sample)
    overhead = overhead_per_compile(
        local_s=here.report.build_seconds, dist_s=there.report.build_seconds, cores=cores, compiles=len(there.sample)
    )
    every_s = sample_s * here.total / max(len(here.sample), 1)
    return {
        "sample": len(here.sample),
        "objects": here.total,
        "same_sample": here.sample == there.sample,
        "local": {**_side(here.report, here.wall_s, cores), "compile_step_s": round(sample_s, 1)},
        "dist": _side(there.report, there.wall_s, dist_jobs),
        "overhead_per_compile_s": round(overhead, 3),
        "estimate_objects_s": estimates(
            compile_s=every_s, other_s=0.0, compiles=here.total, overhead_s=overhead, cores=cores
        ),
    }


def _cpu_figures(here: BuildReport, there: BuildReport, *, cores: int, dist_jobs: int) -> dict[str, Any]:
    """The CPU build's figures: both sides, the overhead per compile, the estimate for N servers."""
    steps = ninja_steps(here.build_dir)
    compile_s = sum(s for out, s in steps.items() if out.endswith(".o"))
    other_s = sum(s for out, s in steps.items() if not out.endswith(".o"))
    overhead = overhead_per_compile(
        local_s=here.build_seconds, dist_s=there.build_seconds, cores=cores, compiles=there.compiled
    )
    return {
        "compile_step_s": round(compile_s, 1),
        "other_step_s": round(other_s, 1),
        "overhead_per_compile_s": round(overhead, 3),
        "estimate_build_s": estimates(
            compile_s=compile_s, other_s=other_s, compiles=here.compiled, overhead_s=overhead, cores=cores
        ),
    }


def bench_dist(settings: Settings, console: Console) -> dict[str, Any]:
    exe = find_sccache_dist(settings.env)
    if exe is None or proc.which("bwrap", settings.env) is None or os.geteuid() != 0:
        raise RuntimeError("the dist section needs sccache-dist, bwrap (apt-get install bubblewrap) and root")
    prepare(settings, Target.pinned(), console=_quiet())
    stamp = wd.read_stamp(settings.workdir / ".git")
    assert stamp is not None, "prepare leaves a stamp"
    sha = stamp.patched_sha
    root = settings.cache_dir.parent / "bench" / "dist"
    shutil.rmtree(root, ignore_errors=True)
    jobs = os.cpu_count() or 2
    dist_jobs = jobs * SERVERS
    # the load average (1, 5, 15 minutes) before the run and after each build
    load = {"before": _load()}
    here, local_wall = _timed_build(_machine(settings, root, "local"), "cpu", sha, jobs)
    load["after_cpu_local"] = _load()
    console.info(f"local CPU build: {here.compiled} compiles, {here.build_seconds:.1f} s (-j {jobs})")
    cuda_here = _cuda_sample_build(_machine(settings, root, "cuda-local"), sha, jobs)
    console.info(f"local CUDA sample: {len(cuda_here.sample)} of {cuda_here.total} objects, {cuda_here.wall_s:.1f} s")
    load["after_cuda_local"] = _load()
    plan = plan_cluster(root / "cluster", servers=SERVERS, scheduler_port=10690, first_port=10691)
    write_cluster(plan, exe, settings.env)
    with running_cluster(plan, exe, settings.env):
        cluster = {"SKIPPY_DIST": plan.scheduler_url, "SKIPPY_DIST_TOKEN": plan.client_token}
        there, dist_wall = _timed_build(_machine(settings, root, "dist", **cluster), "cpu", sha, dist_jobs)
        load["after_cpu_dist"] = _load()
        cuda_there = _cuda_sample_build(_machine(settings, root, "cuda-dist", **cluster), sha, dist_jobs)
        load["after_cuda_dist"] = _load()
    cpu = _cpu_figures(here, there, cores=jobs, dist_jobs=dist_jobs)
    figures: dict[str, Any] = {
        "servers": SERVERS,
        "cores": jobs,
        "local": {
            **_side(here, local_wall, jobs),
            "compile_step_s": cpu["compile_step_s"],
            "other_step_s": cpu["other_step_s"],
        },
        "dist": {**_side(there, dist_wall, dist_jobs), "overhead_per_compile_s": cpu["overhead_per_compile_s"]},
        "estimate_build_s": cpu["estimate_build_s"],
        "cuda": cuda_figures(cuda_here, cuda_there, cores=jobs, dist_jobs=dist_jobs),
        "loadavg": load,
    }
    _say(console, figures)
    figures["compile_steps"] = {b: _counted(settings, root, b, sha) for b in COUNTED}
    console.info(f"compile steps per backend (one cache entry each at least): {figures['compile_steps']}")
    shutil.rmtree(root, ignore_errors=True)
    return figures


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _counted(settings: Settings, root: Path, backend: str, sha: str) -> int | None:
    """``backend``'s compile steps, configured in a machine of its own (no compiler cache)."""
    counted = machine_settings(settings, root, f"count-{backend}")
    share_downloads(settings, counted)
    return count_compiles(counted, backend, settings.workdir, sha)


def _say(console: Console, figures: Mapping[str, Any]) -> None:
    """One line for the CPU build sent, one for the CUDA sample."""
    dist, cuda = figures["dist"], figures["cuda"]
    console.info(
        f"CPU build sent to {SERVERS} local build servers: {dist['counts']}, {dist['build_s']} s "
        f"(-j {dist['jobs']}); overhead {dist['overhead_per_compile_s']} core-s per compile; "
        f"estimate with N real servers: {figures['estimate_build_s']}"
    )
    console.info(
        f"CUDA sample ({cuda['sample']} of {cuda['objects']} objects): local {cuda['local']['build_s']} s, "
        f"sent {cuda['dist']['build_s']} s, {cuda['dist']['counts']}; overhead {cuda['overhead_per_compile_s']} "
        f"core-s per object; estimate of every object with N real servers: {cuda['estimate_objects_s']}"
    )
