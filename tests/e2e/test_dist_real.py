"""A real llama.cpp target's objects through a loopback sccache-dist cluster: the project's
pinned tree with the queue, configured for the CPU in a build root of the test's own, two of
ggml-base's objects (a C and a C++ source) built by Ninja through skippy's check of the
cluster and sccache, sent to two build servers; each object equals the same compile line run
here without the cache. Kept to two objects: the suite's time is short."""

from __future__ import annotations

import io
import json
import os
import shlex
from pathlib import Path

import pytest

from skippy.compile.builder import execute_plan
from skippy.compile.cachestats import CacheProbe, stop_cache_server
from skippy.compile.distcluster import find_sccache_dist, plan_cluster, running_cluster, write_cluster
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.prepare import Target, prepare
from tests.redisserver import free_ports

OBJECTS = ("ggml/src/CMakeFiles/ggml-base.dir/ggml-alloc.c.o", "ggml/src/CMakeFiles/ggml-base.dir/ggml-threading.cpp.o")


def _local_compile(build_dir: Path, obj: str, out: Path, env: dict[str, str]) -> bytes:
    """The object's compile line from compile_commands.json, run here (no launcher) into ``out``."""
    entries = json.loads((build_dir / "compile_commands.json").read_text("utf-8"))
    entry = next(e for e in entries if f" -o {obj} " in f" {e['command']} ")
    argv = shlex.split(entry["command"])
    argv[argv.index("-o") + 1] = str(out)
    kept: list[str] = []
    skip = False
    for arg in argv:  # no depfile: -MD, and -MT/-MF with their values
        if skip or arg == "-MD":
            skip = False
            continue
        skip = arg in ("-MT", "-MF")
        if not skip:
            kept.append(arg)
    argv = kept
    proc.run(argv, env=env, cwd=Path(entry["directory"]))
    return out.read_bytes()


def test_ggml_base_objects_are_compiled_by_the_cluster(tmp_path: Path, project_settings: Settings) -> None:
    env = {**project_settings.env}
    exe = find_sccache_dist(env)
    if exe is None or proc.which("bwrap", env) is None:
        pytest.skip("the build servers need bwrap and sccache-dist: apt-get install bubblewrap")
    if os.geteuid() != 0:
        pytest.skip("sccache-dist build servers run as root")
    prepare(project_settings, Target.pinned(), console=Console(env={}, stream=io.StringIO()))
    port = free_ports(3)  # the scheduler's, then the two servers' (first_port, first_port + 1)
    cluster = plan_cluster(tmp_path / "cluster", servers=2, scheduler_port=port, first_port=port + 1)
    write_cluster(cluster, exe, env)
    table = {**project_settings.raw, "build_root": str(tmp_path / "build"), "cache_dir": str(tmp_path / "cache")}
    dist_env = {**env, "SKIPPY_DIST": cluster.scheduler_url, "SKIPPY_DIST_TOKEN": cluster.client_token}
    settings = Settings.from_table(project_settings.root, table, dist_env)
    toolchain = probe_toolchain("cpu", settings)
    plan = plan_build(
        build_request("cpu", settings),
        settings,
        tree=inspect_tree(settings.workdir),
        toolchain=toolchain,
        patched_sha="0" * 40,
    )
    out = io.StringIO()
    console = Console(env={}, stream=out)
    with running_cluster(cluster, exe, env):
        try:
            execute_plan(plan, console, build=False)  # configure (writes the client config)
            probe = CacheProbe(plan, console)
            build_env = probe.before()  # the cluster's check: status, a probe compile
            ninja = plan.build_argv[0]
            proc.run([ninja, "-C", str(plan.build_dir), *OBJECTS], env=build_env)
            stats = probe.after()
        finally:
            stop_cache_server(plan)
    assert stats is not None
    assert stats.dist_fallback is None, out.getvalue()
    assert stats.dist is not None
    assert stats.dist.remote == len(OBJECTS), stats.as_dict()
    assert stats.dist.failed_over == 0
    for obj in OBJECTS:
        here = _local_compile(plan.build_dir, obj, tmp_path / Path(obj).name, env)
        assert (plan.build_dir / obj).read_bytes() == here, obj
    assert cluster.client_token not in out.getvalue()
