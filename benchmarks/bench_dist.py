"""Bench section ``dist``: the CPU build sent to a local sccache-dist cluster, beside a local build.

In one run, on the prepared tree: a cold CPU build (llama-server and the RPC server) with an
empty local sccache, then the same build with an empty cache sent to a scheduler and two build
servers started on this machine (:mod:`skippy.build.distcluster`, bubblewrap sandboxes). The
servers share this machine's cores, so this measures what distribution costs, not what it
gains: the compiles distributed, the wall times, and the overhead per compile. From those and
the local build's own step times (Ninja's log) it estimates the wall time with N real servers
(stated as an estimate in docs/building.md).

It also counts, for each backend whose toolchain this host has, the compile steps of the
build's targets (``ninja -t commands``): each becomes at least one entry of a remote cache, one
Actions-cache entry per object with ``SKIPPY_CACHE_STORAGE=gha`` (configure only).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Final

from benchmarks.bench_builds import build_backend
from benchmarks.bench_proofs import _quiet, machine_settings, share_downloads
from skippy.build.builder import BuildReport
from skippy.build.distcluster import find_sccache_dist, plan_cluster, running_cluster, write_cluster
from skippy.build.plan import BuildOptions
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


def count_compiles(settings: Settings, backend: str, source: Path, sha: str) -> int | None:
    """The compile steps of ``backend``'s targets (configure only), or None when this host cannot
    configure it."""
    try:
        report = build_backend(backend, settings, _quiet(), source_dir=source, patched_sha=sha, build=False, stop=True)
    except SkippyError:
        return None  # a toolchain this host lacks
    cache = (report.build_dir / "CMakeCache.txt").read_text("utf-8", errors="replace")
    ninja = next(line.partition("=")[2] for line in cache.splitlines() if line.startswith("CMAKE_MAKE_PROGRAM:"))
    names = proc.run([ninja, "-C", str(report.build_dir), "-t", "targets", "all"], env=settings.env).stdout
    known = {line.partition(":")[0] for line in names.splitlines()}
    wanted = [t for t in ("llama-server", "ggml-rpc-server", "rpc-server") if t in known]
    out = proc.run([ninja, "-C", str(report.build_dir), "-t", "commands", *wanted], env=settings.env).stdout
    return sum(1 for line in out.splitlines() if " -c " in f" {line} ")


def _timed_cpu_build(
    settings: Settings, root: Path, name: str, sha: str, jobs: int, **env: str
) -> tuple[BuildReport, float]:
    """A CPU build of the workdir through sccache in a machine of its own under ``root`` (``env``:
    its settings), and its wall seconds."""
    machine = machine_settings(settings, root, name, SKIPPY_COMPILER_CACHE="sccache", **env)
    share_downloads(settings, machine)
    started = time.monotonic()
    report = build_backend(
        "cpu",
        machine,
        _quiet(),
        source_dir=settings.workdir,
        patched_sha=sha,
        options=BuildOptions(jobs=jobs),
        stop=True,
    )
    return report, time.monotonic() - started


def bench_dist(settings: Settings, console: Console) -> dict[str, Any]:
    exe = find_sccache_dist(settings.env)
    if exe is None or proc.which("bwrap", settings.env) is None or os.geteuid() != 0:
        raise RuntimeError("the dist section needs sccache-dist, bwrap (apt-get install bubblewrap) and root")
    prepare(settings, Target.pinned(), console=_quiet())
    stamp = wd.read_stamp(settings.workdir / ".git")
    assert stamp is not None, "prepare leaves a stamp"
    root = settings.cache_dir.parent / "bench" / "dist"
    shutil.rmtree(root, ignore_errors=True)
    jobs = os.cpu_count() or 2
    figures: dict[str, Any] = {"servers": SERVERS, "cores": jobs}

    here, local_wall = _timed_cpu_build(settings, root, "local", stamp.patched_sha, jobs)
    steps = ninja_steps(here.build_dir)
    compile_s = sum(s for out, s in steps.items() if out.endswith(".o"))
    other_s = sum(s for out, s in steps.items() if not out.endswith(".o"))
    figures["local"] = {
        "wall_s": round(local_wall, 1),
        "build_s": round(here.build_seconds, 1),
        "compiles": here.compiled,
        "compile_step_s": round(compile_s, 1),
        "other_step_s": round(other_s, 1),
    }
    console.info(f"local CPU build: {here.compiled} compiles, {here.build_seconds:.1f} s (-j {jobs})")

    plan = plan_cluster(root / "cluster", servers=SERVERS, scheduler_port=10690, first_port=10691)
    write_cluster(plan, exe, settings.env)
    dist_jobs = jobs * SERVERS
    with running_cluster(plan, exe, settings.env):
        cluster = {"SKIPPY_DIST": plan.scheduler_url, "SKIPPY_DIST_TOKEN": plan.client_token}
        there, dist_wall = _timed_cpu_build(settings, root, "dist", stamp.patched_sha, dist_jobs, **cluster)
    counts = there.cache.dist if there.cache is not None else None
    overhead = (there.build_seconds - here.build_seconds) * jobs / max(there.compiled, 1)
    figures["dist"] = {
        "wall_s": round(dist_wall, 1),
        "build_s": round(there.build_seconds, 1),
        "compiles": there.compiled,
        "jobs": dist_jobs,
        "counts": counts.as_dict() if counts is not None else None,
        "fallback": there.cache.dist_fallback if there.cache is not None else "no stats",
        # extra core-seconds each compile costs when sent (packaging, upload, sandbox, download)
        "overhead_per_compile_s": round(overhead, 3),
    }
    figures["estimate_build_s"] = {
        str(n): round(
            estimate(
                compile_s=compile_s,
                other_s=other_s,
                compiles=here.compiled,
                overhead_s=max(overhead, 0.0),
                cores=jobs,
                servers=n,
            ),
            1,
        )
        for n in ESTIMATE_SERVERS
    }
    console.info(
        f"sent to {SERVERS} local build servers: {counts.render() if counts else 'no figures'}, "
        f"{there.build_seconds:.1f} s (-j {dist_jobs}); overhead {overhead:.2f} core-s per compile; "
        f"estimate with N real {jobs}-core servers: {figures['estimate_build_s']}"
    )
    entries: dict[str, int | None] = {}
    for backend in COUNTED:
        counted = machine_settings(settings, root, f"count-{backend}")
        share_downloads(settings, counted)
        entries[backend] = count_compiles(counted, backend, settings.workdir, stamp.patched_sha)
    figures["compile_steps"] = entries
    console.info(f"compile steps per backend (one cache entry each at least): {entries}")
    shutil.rmtree(root, ignore_errors=True)
    return figures
