"""Build figures: skippy's cold build beside the same cmake + ninja run raw, the up-to-date
``nox -s build-cpu``, and a warm compiler cache in a fresh build dir."""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console

if TYPE_CHECKING:
    from skippy.compile.builder import BuildReport

from benchmarks.common import Null, Timing, timed


def bench_builds(settings: Settings, console: Console, *, python: str = sys.executable) -> dict[str, Any]:
    """Build figures on the bench checkout (real llama.cpp + the bench queue):

    * orchestrator overhead on a cold CPU build (no compiler cache) vs the same cmake + ninja
      argv run raw into another fresh dir, in the same run;
    * ``nox -s build-cpu`` of the project when everything is up to date (before the spot check);
    * a rebuild into a fresh dir with a warm compiler cache vs a cold one.

    Over 80 lines on purpose for now: three measurements read in sequence, each on the build API
    (plan, execute, cache server) that is being reworked; it splits with that rework.
    """
    from skippy.compile.plan import plan_build
    from skippy.compile.request import build_request
    from skippy.compile.toolchain import inspect_tree, probe_toolchain
    from skippy.core.settings import Settings as _Settings

    project = settings.cache_dir.parent / "bench" / "project"
    workdir = project / "work" / "llama.cpp"
    stamp = read_bench_stamp(workdir)
    root = settings.cache_dir.parent / "bench" / "builds"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    base_env = dict(settings.env)
    base_env.pop("CI", None)

    def bench_settings(build_root: Path, cache: str, cache_dir: Path | None = None) -> _Settings:
        env = {**base_env, "SKIPPY_COMPILER_CACHE": cache}
        table = {"build_root": str(build_root), "cache_dir": str(cache_dir or root / "cache")}
        return _Settings.from_table(project, table, env)

    quiet = Console(env={}, stream=Null())
    # (1) cold, no compiler cache: skippy's build vs the same argv run raw
    ours_settings = bench_settings(root / "ours", "none")
    started = time.perf_counter()
    ours = build_backend("cpu", ours_settings, quiet, source_dir=workdir, patched_sha=stamp)
    ours_wall = time.perf_counter() - started
    raw_settings = bench_settings(root / "raw", "none")
    toolchain = probe_toolchain("cpu", raw_settings)
    plan = plan_build(
        build_request("cpu", raw_settings),
        raw_settings,
        tree=inspect_tree(workdir),
        toolchain=toolchain,
        patched_sha=stamp,
    )
    raw_env = {**base_env, **plan.env_overrides}
    started = time.perf_counter()
    proc.run(plan.configure_argv, env=raw_env, timeout=3600)
    raw_configure = time.perf_counter() - started
    proc.run(plan.build_argv, env=raw_env, timeout=3 * 3600)
    raw_wall = time.perf_counter() - started
    overhead = ours_wall - raw_wall
    # (2) the project's own `nox -s build-cpu` when up to date (no spot check)
    nox = str(Path(python).parent / "nox")
    up_to_date = [
        timed(lambda: proc.run([nox, "-s", "build-cpu", "--", "--no-spot-check"], env=base_env, cwd=settings.root))
        for _ in range(3)
    ]
    # (3) compiler cache: cold (empty cache) then a fresh dir with the warm cache
    cache_dir = root / "sccache-cache"
    cold_settings = bench_settings(root / "cold", "sccache", cache_dir)
    started = time.perf_counter()
    cold = build_backend("cpu", cold_settings, quiet, source_dir=workdir, patched_sha=stamp)
    cold_wall = time.perf_counter() - started
    warm_settings = bench_settings(root / "warm", "sccache", cache_dir)
    started = time.perf_counter()
    warm = build_backend("cpu", warm_settings, quiet, source_dir=workdir, patched_sha=stamp)
    warm_wall = time.perf_counter() - started
    from skippy.compile.cachestats import stop_cache_server

    stop_cache_server(
        plan_build(
            build_request("cpu", warm_settings),
            warm_settings,
            tree=inspect_tree(workdir),
            toolchain=probe_toolchain("cpu", warm_settings),
            patched_sha=stamp,
        )
    )
    shutil.rmtree(root, ignore_errors=True)
    return {
        "cold_build": {
            "skippy_s": round(ours_wall, 2),
            "skippy_cmake_ninja_s": round(ours.total_seconds, 2),
            "raw_s": round(raw_wall, 2),
            "raw_configure_s": round(raw_configure, 2),
            "compile_steps": ours.compiled,
            "overhead_s": round(overhead, 2),
            "overhead_pct": round(100 * overhead / raw_wall, 2),
            "overhead_outside_cmake_ninja_s": round(ours_wall - ours.total_seconds, 2),
            "target_pct": 2.0,
            "met": overhead / raw_wall <= 0.02,
        },
        "up_to_date_nox_build_cpu": {
            **Timing(tuple(up_to_date)).as_dict(),
            "target_s": 5.0,
            "met": statistics.median(up_to_date) < 5.0,
        },
        "compiler_cache": {
            "cold_s": round(cold_wall, 2),
            "warm_fresh_dir_s": round(warm_wall, 2),
            "ratio": round(warm_wall / cold_wall, 3),
            "warm_hits": warm.cache.hits if warm.cache else None,
            "warm_misses": warm.cache.misses if warm.cache else None,
            "target_ratio": 0.25,
            "met": warm_wall / cold_wall <= 0.25,
            "cold_compile_steps": cold.compiled,
        },
    }


def read_bench_stamp(workdir: Path) -> str:
    from skippy.queue import workdir as wd

    stamp = wd.read_stamp(workdir / ".git")
    assert stamp is not None, "bench_prepare leaves a prepared bench checkout"
    return stamp.patched_sha


def build_backend(
    backend: str,
    settings: Settings,
    console: Console,
    *,
    source_dir: Path,
    patched_sha: str,
    jobs: int | None = None,
    build: bool = True,
    targets: tuple[str, ...] = (),
    stop: bool = False,
) -> BuildReport:
    """Probe, plan and execute a build of ``source_dir`` (no prepare, no spot check) with ``jobs``
    (None: the settings'); with ``build=False`` configure only; ``targets``: those Ninja targets
    instead of the backend's; with ``stop`` the compiler cache server is stopped after."""
    from skippy.compile.builder import execute_plan
    from skippy.compile.cachestats import stop_cache_server
    from skippy.compile.plan import plan_build
    from skippy.compile.request import build_request
    from skippy.compile.toolchain import check_tree_needs, inspect_tree, probe_toolchain

    request = build_request(backend, settings, jobs=jobs)
    toolchain = probe_toolchain(backend, settings, given=request.defines)
    tree = inspect_tree(source_dir)
    check_tree_needs(tree, toolchain)
    plan = plan_build(request, settings, tree=tree, toolchain=toolchain, patched_sha=patched_sha)
    try:
        return execute_plan(plan, console, build=build, targets=targets)
    finally:
        if stop:
            stop_cache_server(plan)
