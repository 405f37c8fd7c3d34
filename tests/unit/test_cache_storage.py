"""The compiler cache storage: settings + environment -> sccache's own variables, a
redacted description, the local fallback; credentials never in descriptions, plans,
stamps or errors."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport
from skippy.compile.cache import (
    CacheStorage,
    local_fallback_env,
    reachable,
    select_storage,
)
from skippy.compile.cachestats import CacheStats
from skippy.compile.tool import Tool
from skippy.core.errors import SettingsError
from skippy.core.redact import redact_url
from tests.redisserver import Listener, free_port
from tests.unit.test_build_plan import plan

SECRET = "pa55-w0rd-xyz"  # noqa: S105 - a fake credential the tests check is never shown


def test_local_is_the_default() -> None:
    s = select_storage(None, {})
    assert (s.kind, s.remote, s.env, s.source) == ("local", False, {}, "default")
    assert select_storage("local", {}).kind == "local"
    assert select_storage("redis://h:1", {"SKIPPY_CACHE_STORAGE": "LOCAL"}).kind == "local"


def test_the_environment_wins_over_the_table() -> None:
    s = select_storage("redis://table-host:6379", {"SKIPPY_CACHE_STORAGE": "redis://env-host:7000"})
    assert s.env == {"SCCACHE_REDIS_ENDPOINT": "redis://env-host:7000"}
    assert s.source == "SKIPPY_CACHE_STORAGE"
    t = select_storage("redis://table-host", {})
    assert t.endpoint == ("table-host", 6379)
    assert t.source == "[tool.skippy.build] cache_storage"


def test_redis_credentials_go_in_sccaches_variables_never_in_the_description() -> None:
    s = select_storage(f"rediss://cacher:{SECRET}@cache.internal:6380/2", {})
    assert s.kind == "redis"
    assert s.env == {
        "SCCACHE_REDIS_ENDPOINT": "rediss://cache.internal:6380",
        "SCCACHE_REDIS_USERNAME": "cacher",
        "SCCACHE_REDIS_PASSWORD": SECRET,
        "SCCACHE_REDIS_DB": "2",
    }
    assert s.endpoint == ("cache.internal", 6380)
    assert s.description == "redis rediss://***@cache.internal:6380/2"
    assert SECRET not in repr(s)
    # sccache names its endpoint in messages and stats: scrubbed before we show them
    said = f'redis, name: rediss://cacher:{SECRET}@cache.internal:6380, prefix: / (auth "{SECRET}")'
    assert SECRET not in s.scrub(said)
    assert "rediss://***@cache.internal:6380," in s.scrub(said)


def test_s3_bucket_prefix_and_sccaches_keys() -> None:
    s = select_storage("s3://team-cache/llama/cpu?region=auto&endpoint=https://minio.internal:9000&use_ssl=true", {})
    assert s.env == {
        "SCCACHE_BUCKET": "team-cache",
        "SCCACHE_S3_KEY_PREFIX": "llama/cpu",
        "SCCACHE_REGION": "auto",
        "SCCACHE_ENDPOINT": "https://minio.internal:9000",
        "SCCACHE_S3_USE_SSL": "true",
    }
    assert s.endpoint == ("minio.internal", 9000)
    assert s.description == "s3 bucket team-cache prefix llama/cpu at https://minio.internal:9000"
    aws = select_storage("s3://b?region=eu-west-1", {"AWS_SECRET_ACCESS_KEY": SECRET})
    assert aws.env == {"SCCACHE_BUCKET": "b", "SCCACHE_REGION": "eu-west-1"}
    assert aws.endpoint is None  # the provider's default endpoint: sccache's own start decides
    assert SECRET not in aws.scrub(f"denied for {SECRET}")
    with pytest.raises(SettingsError) as missing:
        select_storage("s3://b/p", {})
    assert "?region=" in (missing.value.next_step or "")
    with pytest.raises(SettingsError) as info:
        select_storage(f"s3://key:{SECRET}@b?region=x", {})
    assert SECRET not in info.value.render()
    assert "AWS_SECRET_ACCESS_KEY" in (info.value.next_step or "")
    with pytest.raises(SettingsError) as unknown:
        select_storage("s3://b?region=x&bogus=1", {})
    assert "unknown parameter 'bogus'" in (unknown.value.next_step or "")


def test_gha_needs_the_runner_token() -> None:
    outside = select_storage("gha", {})
    assert outside.env == {"SCCACHE_GHA_ENABLED": "true"}
    assert outside.unusable is not None
    assert "ACTIONS_RUNTIME_TOKEN" in outside.unusable
    env = {"ACTIONS_RUNTIME_TOKEN": SECRET, "ACTIONS_RESULTS_URL": "https://results.example.invalid/"}
    inside = select_storage("gha?version=v2", env)
    assert inside.unusable is None
    assert inside.env == {"SCCACHE_GHA_ENABLED": "true", "SCCACHE_GHA_VERSION": "v2"}
    assert inside.endpoint == ("results.example.invalid", 443)
    assert SECRET not in inside.scrub(f"token {SECRET} refused")


def test_webdav_with_basic_auth() -> None:
    s = select_storage(f"webdavs://ci:{SECRET}@dav.internal/cache?key_prefix=llama", {})
    assert s.env == {
        "SCCACHE_WEBDAV_ENDPOINT": "https://dav.internal/cache",
        "SCCACHE_WEBDAV_KEY_PREFIX": "llama",
        "SCCACHE_WEBDAV_USERNAME": "ci",
        "SCCACHE_WEBDAV_PASSWORD": SECRET,
    }
    assert s.endpoint == ("dav.internal", 443)
    assert SECRET not in s.description
    assert select_storage("webdav://dav.internal:8080/", {}).endpoint == ("dav.internal", 8080)


def test_a_users_own_sccache_configuration_is_used_as_given() -> None:
    env = {"SCCACHE_REDIS_ENDPOINT": f"redis://:{SECRET}@own-redis:6390", "SKIPPY_CACHE_STORAGE": "local"}
    s = select_storage("s3://ignored?region=x", env)
    assert s.kind == "redis"
    assert s.env == {}  # nothing added: sccache reads the user's variables
    assert s.source == "environment (SCCACHE_REDIS_ENDPOINT)"
    assert s.endpoint == ("own-redis", 6390)
    assert s.description == "redis redis://***@own-redis:6390"
    bucket = select_storage(None, {"SCCACHE_BUCKET": "b", "SCCACHE_ENDPOINT": "minio:9000"})
    assert (bucket.kind, bucket.endpoint) == ("s3", ("minio", 9000))
    assert select_storage(None, {"SCCACHE_GHA_ENABLED": "off"}).kind == "local"


@pytest.mark.parametrize(
    "value",
    ["ftp://host/x", "redis://", f"redis://:{SECRET}@h:notaport", f"redis://:{SECRET}@h/x", "memcached://h"],
)
def test_malformed_storage_is_a_settings_error_without_secrets(value: str) -> None:
    with pytest.raises(SettingsError) as info:
        select_storage(value, {})
    assert SECRET not in info.value.render()
    assert "cache_storage" in info.value.what


def test_a_non_string_table_value_is_refused() -> None:
    with pytest.raises(SettingsError, match="must be a string"):
        select_storage(["redis://h"], {})


def test_redact_url() -> None:
    assert redact_url(f"redis://:{SECRET}@h:1/0") == "redis://***@h:1/0"
    assert redact_url(f"redis://user:{SECRET}@h") == "redis://***@h"
    assert redact_url("redis://h:1") == "redis://h:1"
    assert redact_url(f"https://h/p?token={SECRET}&region=x") == "https://h/p?token=***&region=x"
    assert redact_url(f"https://h/p?X-Amz-Signature={SECRET}") == "https://h/p?X-Amz-Signature=***"


def test_local_fallback_env_drops_every_storage_variable() -> None:
    env = {
        "PATH": "/bin",
        "SCCACHE_DIR": "/c",
        "SCCACHE_CACHE_SIZE": "2G",
        "SCCACHE_REDIS_ENDPOINT": "redis://h",
        "SCCACHE_REDIS_PASSWORD": SECRET,
        "SCCACHE_BUCKET": "b",
        "SCCACHE_REGION": "x",
        "SCCACHE_ENDPOINT": "e",
        "SCCACHE_S3_KEY_PREFIX": "p",
        "SCCACHE_GHA_ENABLED": "true",
        "SCCACHE_WEBDAV_ENDPOINT": "w",
    }
    assert local_fallback_env(env) == {"PATH": "/bin", "SCCACHE_DIR": "/c", "SCCACHE_CACHE_SIZE": "2G"}


def test_reachable_is_bounded_and_names_the_endpoint() -> None:
    port = free_port()
    s = select_storage(f"redis://127.0.0.1:{port}", {})
    started = time.monotonic()
    why = reachable(s, timeout=2)
    assert time.monotonic() - started < 3
    assert why is not None
    assert f"127.0.0.1:{port}" in why
    assert reachable(select_storage(None, {})) is None
    unusable = select_storage("gha", {})
    assert reachable(unusable) == unusable.unusable


def _server(env: Mapping[str, str]) -> str:
    """Where sccache's server listens: a Unix socket, or a loopback port when the path is too long."""
    return env.get("SCCACHE_SERVER_UDS") or env["SCCACHE_SERVER_PORT"]


def test_the_plan_carries_the_remote_and_a_local_fallback(tmp_path: Path) -> None:
    local = plan(tmp_path, "cpu")
    remote = plan(tmp_path, "cpu", table={"build": {"cache_storage": f"redis://:{SECRET}@cache.internal:6379"}})
    assert remote.build_dir == local.build_dir  # the storage does not change what is built
    assert remote.stamp == local.stamp
    assert remote.cache_storage is not None
    assert remote.cache_storage.kind == "redis"
    assert remote.env_overrides["SCCACHE_REDIS_ENDPOINT"] == "redis://cache.internal:6379"
    assert remote.env_overrides["SCCACHE_REDIS_PASSWORD"] == SECRET
    # a server of its own per storage: never a running local one
    assert _server(remote.env_overrides) != _server(local.env_overrides)
    fallback = remote.cache_fallback_env
    assert _server(fallback) == _server(local.env_overrides)
    assert fallback["SCCACHE_DIR"] == local.env_overrides["SCCACHE_DIR"]
    assert not [k for k in fallback if k.startswith("SCCACHE_REDIS")]
    for text in (repr(remote), json.dumps(dict(remote.stamp)), " ".join(remote.configure_argv)):
        assert SECRET not in text
    assert local.cache_storage is not None
    assert not local.cache_storage.remote
    assert local.cache_fallback_env == {}
    # objects are shared between trees kept at other paths (machines, copies, checkouts)
    roots = f"{remote.source_dir}:{remote.build_dir.parent}"
    assert remote.env_overrides["SCCACHE_BASEDIRS"] == roots
    assert local.env_overrides["SCCACHE_BASEDIRS"] == roots
    assert fallback["SCCACHE_BASEDIRS"] == roots


def test_the_users_variables_reach_sccache_untouched(tmp_path: Path) -> None:
    env = {"SCCACHE_BUCKET": "own", "SCCACHE_REGION": "auto", "SCCACHE_ENDPOINT": "minio:9000"}
    p = plan(tmp_path, "cpu", env=env)
    assert p.cache_storage is not None
    assert p.cache_storage.kind == "s3"
    assert {k: p.env[k] for k in env} == env
    own = plan(tmp_path, "cpu", env={**env, "SCCACHE_BASEDIRS": "/srv/src"})
    assert own.env["SCCACHE_BASEDIRS"] == "/srv/src"
    assert "SCCACHE_BUCKET" not in p.cache_fallback_env


def test_ccache_keeps_its_local_directory(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        "cpu",
        table={"build": {"cache_storage": "redis://h"}},
        tc={"launcher": Tool("ccache", "/usr/bin/ccache", "ccache 4.8")},
    )
    assert p.env_overrides == {
        "CCACHE_DIR": str(tmp_path / "proj" / ".deps" / "cache" / "ccache"),
        "CCACHE_DEPEND": "true",
    }


def test_the_report_names_the_storage_and_the_languages(tmp_path: Path) -> None:
    stats = CacheStats(
        "sccache", 10, 2, storage="redis redis://***@h:6379", languages={"C/C++": (7, 2), "CUDA": (3, 0)}
    )
    assert stats.render() == (
        "sccache (redis redis://***@h:6379): 10 hits, 2 misses (83% hit rate); C/C++ 7/9, CUDA 3/3"
    )
    report = BuildReport(
        backend="cpu",
        build_dir=tmp_path,
        configured=False,
        configure_reason="up to date",
        configure_seconds=0.0,
        build_seconds=1.0,
        compiled=12,
        steps=14,
        binaries={},
        cache=stats,
    )
    assert report.as_dict()["cache"] == {
        "tool": "sccache",
        "hits": 10,
        "misses": 2,
        "storage": "redis redis://***@h:6379",
        "languages": {"C/C++": {"hits": 7, "misses": 2}, "CUDA": {"hits": 3, "misses": 0}},
        "fallback": None,
        "dist": None,
        "dist_fallback": None,
    }


def test_storage_is_frozen_and_hides_its_variables() -> None:
    s = CacheStorage(kind="redis", description="redis redis://h", source="x", env={"SCCACHE_REDIS_PASSWORD": SECRET})
    assert SECRET not in repr(s)
    assert s.socket_tag() != ""
    assert SECRET not in s.socket_tag()


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [(b"+PONG\r\n", None), (b"-NOAUTH Authentication required.\r\n", None), (b"HTTP/1.1 400\r\n", "answer like")],
)
def test_a_redis_port_must_answer_like_redis(reply: bytes, verdict: str | None) -> None:
    listener = Listener(reply)
    try:
        why = reachable(select_storage(f"redis://127.0.0.1:{listener.port}", {}), timeout=2)
    finally:
        listener.close()
    if verdict is None:
        assert why is None
    else:
        assert why is not None
        assert verdict in why


def test_a_port_that_never_answers_is_unreachable_within_the_bound() -> None:
    listener = Listener(None)
    started = time.monotonic()
    try:
        why = reachable(select_storage(f"redis://127.0.0.1:{listener.port}", {}), timeout=1)
    finally:
        listener.close()
    assert time.monotonic() - started < 3
    assert why is not None
    assert "no answer within 1 s" in why
