"""Distributed compiles and a shared cache that cannot serve a wrong object: the pure decisions
(settings -> cluster and client config, sccache's answers parsed, the key namespace of a
-march=native build, the read-only jobs, the languages kept out of the cache)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from skippy.compile.cache import select_storage
from skippy.compile.cachestats import CacheProbe, CacheStats
from skippy.compile.dist import (
    DistCounts,
    client_config,
    dist_counts,
    parse_dist_status,
    probe_failure,
    select_dist,
    write_client_config,
)
from skippy.compile.distcluster import plan_cluster, scheduler_toml, server_toml
from skippy.compile.sharedcache import native_cpu_tag, native_namespace, read_only, read_only_reason
from skippy.compile.tool import Tool
from skippy.core.errors import SettingsError
from skippy.core.ui import Console
from tests.unit.test_build_plan import plan

TOKEN = "tok-3f9a-not-a-real-one"  # noqa: S105 - a fake token the tests check is never shown


def test_off_by_default_and_the_environment_wins() -> None:
    assert select_dist(None, {}) is None
    assert select_dist("http://table:10600", {"SKIPPY_DIST": "off"}) is None
    c = select_dist("http://table:10600", {"SKIPPY_DIST": "http://env:10600/", "SKIPPY_DIST_TOKEN": TOKEN})
    assert c is not None
    assert (c.scheduler_url, c.source, c.token) == ("http://env:10600", "SKIPPY_DIST", TOKEN)
    t = select_dist("https://sched.example", {})
    assert t is not None
    assert (t.source, t.token) == ("[tool.skippy.build] dist", None)
    assert TOKEN not in repr(c)
    assert TOKEN not in c.tag()
    assert c.tag() != select_dist("http://env:10600", {"SKIPPY_DIST_TOKEN": "other"}).tag()  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["scheduler:10600", "ftp://h", f"http://user:{TOKEN}@h:10600", "http://"])
def test_a_bad_scheduler_url_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(SettingsError) as err:
        select_dist(value, {})
    assert "[tool.skippy.build] dist" in str(err.value)
    assert TOKEN not in str(err.value)
    assert err.value.next_step


def test_the_client_config_holds_the_token_and_is_written_0600(tmp_path: Path) -> None:
    c = select_dist(None, {"SKIPPY_DIST": "http://127.0.0.1:10600", "SKIPPY_DIST_TOKEN": TOKEN})
    assert c is not None
    text = client_config(c, tmp_path / "tc")
    assert 'scheduler_url = "http://127.0.0.1:10600"' in text
    assert f'token = "{TOKEN}"' in text
    path = tmp_path / "conf" / "client.toml"
    write_client_config(path, text)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text("utf-8") == text
    insecure = client_config(select_dist("http://h:1", {}), tmp_path)  # type: ignore[arg-type]
    assert 'type = "DANGEROUSLY_INSECURE"' in insecure


def test_dist_status_is_parsed() -> None:
    ok = parse_dist_status(
        '{"SchedulerStatus":["http://127.0.0.1:10600/",{"num_servers":2,"num_cpus":4,"in_progress":0}]}'
    )
    assert (ok.connected, ok.servers, ok.cpus, ok.unusable()) == (True, 2, 4, None)
    empty = parse_dist_status('{"SchedulerStatus":["http://h/",{"num_servers":0,"num_cpus":0,"in_progress":0}]}')
    assert empty.unusable() == "the scheduler has no build server (compiles would wait for one)"
    down = parse_dist_status('{"NotConnected":["http://h:1/","enabled, not connected, will retry in 30.0s"]}')
    assert down.unusable() == "the scheduler does not answer (enabled, not connected, will retry in 30.0s)"
    assert parse_dist_status("garbage").connected is False
    assert parse_dist_status('"Disabled"').connected is False


def test_the_stats_say_where_compiles_ran() -> None:
    stats = {
        "stats": {"compilations": 10, "dist_compiles": {"127.0.0.1:10501": 5, "127.0.0.1:10502": 2}, "dist_errors": 1}
    }
    counts = dist_counts(json.dumps(stats))
    assert (counts.remote, counts.local, counts.failed_over) == (7, 2, 1)
    assert counts.render() == "7 compiled remotely, 2 locally, 1 failed over"
    line = CacheStats("sccache", 0, 10, storage="local directory", dist=counts).render()
    assert line.endswith("; cluster: 7 compiled remotely, 2 locally, 1 failed over")
    assert CacheStats("sccache", 0, 1, dist_fallback="down").as_dict()["dist_fallback"] == "down"
    assert DistCounts().as_dict() == {"remote": 0, "local": 0, "failed_over": 0, "servers": {}}


def test_a_refused_token_is_named_and_scrubbed() -> None:
    c = select_dist(None, {"SKIPPY_DIST": "http://h:1", "SKIPPY_DIST_TOKEN": TOKEN})
    assert c is not None
    why = probe_failure(c, f"sccache: http error status: Error 401: Fixed token mismatch ({TOKEN})")
    assert why.startswith("the scheduler refused the client token (SKIPPY_DIST_TOKEN)")
    assert TOKEN not in why


def test_a_plan_with_a_cluster_has_its_own_server_and_a_local_fallback(tmp_path: Path) -> None:
    env = {"SKIPPY_DIST": "http://127.0.0.1:10600", "SKIPPY_DIST_TOKEN": TOKEN}
    p = plan(tmp_path, "cpu", env=env)
    assert p.dist is not None
    assert p.env["SCCACHE_CONF"] == str(p.dist.config)
    assert "SCCACHE_CONF" not in p.dist.fallback_env
    server = ("SCCACHE_SERVER_UDS", "SCCACHE_SERVER_PORT")
    assert [p.env.get(k) for k in server] != [p.dist.fallback_env.get(k) for k in server]
    assert len(p.cache_server_envs) == 2
    assert TOKEN not in repr(p)
    assert TOKEN not in json.dumps(dict(p.stamp))
    assert plan(tmp_path, "cpu").dist is None
    # no compiler cache, no cluster (sccache sends the compiles)
    assert plan(tmp_path, "cpu", env={**env, "SKIPPY_COMPILER_CACHE": "none"}, tc={"launcher": None}).dist is None


def test_a_cluster_ccache_cannot_use_is_named_once_as_the_build_starts(tmp_path: Path) -> None:
    env = {"SKIPPY_DIST": "http://127.0.0.1:10600", "SKIPPY_DIST_TOKEN": TOKEN}
    p = plan(tmp_path, "cpu", env=env, tc={"launcher": Tool("ccache", "/usr/bin/ccache", "ccache 4.8")})
    assert p.dist is None
    assert p.dist_unused is not None and "ccache does not send compiles to sccache-dist" in p.dist_unused
    assert TOKEN not in p.dist_unused
    out = io.StringIO()
    probe = CacheProbe(p, Console(env={}, stream=out))
    probe._use_cluster()
    assert probe.dist_fallback == p.dist_unused
    assert out.getvalue().count("compile cluster:") == 1 and "compiling on this machine" in out.getvalue()


# --- a shared cache that cannot serve a wrong object ----------------------------------

GCC_NATIVE = (
    ' /usr/lib/gcc/x86_64-linux-gnu/12/cc1 -E -quiet - "-march=rocketlake" -mmmx -mavx2 -mno-sse4a '
    "--param=l1-cache-size=48 -mtune=icelake-client -dumpbase -\n"
)
CLANG_NATIVE = ' "/usr/bin/clang-16" "-cc1" "-triple" "x86_64" "-target-cpu" "znver3" "-target-feature" "+avx2"\n'


def test_the_native_cpu_tag_follows_what_the_compiler_resolves() -> None:
    tag = native_cpu_tag(GCC_NATIVE)
    assert tag is not None
    assert tag.startswith("native-")
    assert native_cpu_tag(GCC_NATIVE.replace("-mavx2", "-mno-avx2")) != tag
    assert native_cpu_tag(CLANG_NATIVE) not in (None, tag)
    assert native_cpu_tag("cc: error: unrecognized option") is None


def test_a_native_build_keeps_its_objects_apart_or_refuses_the_remote() -> None:
    redis = select_storage("redis://h:6379", {})
    spaced = native_namespace(redis, "native-abc", {})
    assert spaced.env["SCCACHE_REDIS_KEY_PREFIX"] == "native-abc"
    assert "native-abc" in spaced.description
    s3 = native_namespace(select_storage("s3://b/team?region=x", {}), "native-abc", {})
    assert s3.env["SCCACHE_S3_KEY_PREFIX"] == "team/native-abc"
    actions = {"ACTIONS_RUNTIME_TOKEN": "t", "ACTIONS_RESULTS_URL": "https://results.example/"}
    gha = native_namespace(select_storage("gha?version=v2", actions), "native-abc", actions)
    assert gha.env["SCCACHE_GHA_VERSION"] == "v2-native-abc"
    unknown = native_namespace(redis, None, {})
    assert unknown.unusable is not None
    assert "native = true" in unknown.unusable
    other = select_storage(None, {"SCCACHE_MULTILEVEL_CHAIN": "disk,redis"})
    assert native_namespace(other, "native-abc", {}).unusable is not None
    local = select_storage(None, {})
    assert native_namespace(local, "native-abc", {}) is local


def test_a_native_plan_with_a_remote_names_this_hosts_cpu(tmp_path: Path) -> None:
    env = {"SKIPPY_NATIVE": "1", "SKIPPY_CACHE_STORAGE": "redis://h:6379", "PATH": "/usr/bin:/bin"}
    p = plan(tmp_path, "cpu", env=env)
    assert p.cache_storage is not None
    prefix = p.env.get("SCCACHE_REDIS_KEY_PREFIX")
    if prefix is None:  # no compiler here to ask: the remote is refused instead
        assert p.cache_storage.unusable is not None
    else:
        assert prefix.startswith("native-")
    # not native: no namespace; on CI native is off whatever is asked
    assert "SCCACHE_REDIS_KEY_PREFIX" not in plan(tmp_path, "cpu", env={**env, "SKIPPY_NATIVE": "0"}).env
    assert "SCCACHE_REDIS_KEY_PREFIX" not in plan(tmp_path, "cpu", env={**env, "CI": "true"}).env


def test_pull_request_jobs_read_without_writing() -> None:
    gh = {"GITHUB_ACTIONS": "true"}
    assert read_only_reason({}) is None
    assert read_only_reason({**gh, "GITHUB_EVENT_NAME": "push", "GITHUB_REF_NAME": "main"}) is None
    why = read_only_reason({**gh, "GITHUB_EVENT_NAME": "pull_request"})
    assert why is not None
    assert "only the default branch writes" in why
    event = {"repository": {"default_branch": "main"}}
    push = {**gh, "GITHUB_EVENT_NAME": "push", "GITHUB_REF_TYPE": "branch"}
    assert read_only_reason({**push, "GITHUB_REF_NAME": "main"}, event) is None
    assert read_only_reason({**push, "GITHUB_REF_NAME": "topic"}, event) == (
        "branch topic reads the shared cache, only main writes it"
    )
    for url, var in (
        ("redis://h:1", "SCCACHE_REDIS_RW_MODE"),
        ("s3://b?region=x", "SCCACHE_S3_RW_MODE"),
        ("gha", "SCCACHE_GHA_RW_MODE"),
        ("webdav://h/p", "SCCACHE_WEBDAV_RW_MODE"),
    ):
        ro = read_only(select_storage(url, {}), why)
        assert ro.env[var] == "READ_ONLY"
        assert ro.description.endswith("(read-only)")
    assert read_only(select_storage("redis://h:1", {}), None).env.get("SCCACHE_REDIS_RW_MODE") is None


def test_a_pull_request_plan_reads_the_remote_only(tmp_path: Path) -> None:
    env = {"SKIPPY_CACHE_STORAGE": "redis://h:6379", "GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "pull_request"}
    assert plan(tmp_path, "cpu", env=env).env["SCCACHE_REDIS_RW_MODE"] == "READ_ONLY"
    pushed = {**env, "GITHUB_EVENT_NAME": "push"}
    assert "SCCACHE_REDIS_RW_MODE" not in plan(tmp_path, "cpu", env=pushed).env


def test_metal_assembler_sources_are_compiled_outside_the_cache(tmp_path: Path) -> None:
    """The embedded Metal library is an assembler file that ``.incbin``s the shader source:
    no compiler cache sees that file among its inputs, so ASM never gets the launcher."""
    languages = frozenset({"C", "CXX", "OBJC", "OBJCXX", "ASM"})
    p = plan(tmp_path, "metal", tc={"system": "Darwin"}, tr={"languages": languages})
    launchers = {d.name for d in p.defines if d.name.endswith("_COMPILER_LAUNCHER")}
    assert "CMAKE_ASM_COMPILER_LAUNCHER" not in launchers
    assert {"CMAKE_C_COMPILER_LAUNCHER", "CMAKE_OBJC_COMPILER_LAUNCHER"} <= launchers


def test_a_cluster_plan_writes_secret_configs_for_each_server(tmp_path: Path) -> None:
    c = plan_cluster(tmp_path, servers=2, scheduler_port=10700, first_port=10701)
    assert [s.addr for s in c.servers] == ["127.0.0.1:10701", "127.0.0.1:10702"]
    assert c.client_token not in repr(c)
    assert c.server_key not in repr(c)
    assert f'token = "{c.client_token}"' in scheduler_toml(c)
    assert 'public_addr = "127.0.0.1:10700"' in scheduler_toml(c)
    text = server_toml(c, c.servers[0], "jwt")
    assert 'public_addr = "127.0.0.1:10701"' in text
    assert 'scheduler_url = "http://127.0.0.1:10700"' in text
    hosts = plan_cluster(tmp_path, hosts=["10.0.0.5", "10.0.0.6:10777"], scheduler_host="10.0.0.1")
    assert [s.addr for s in hosts.servers] == ["10.0.0.5:10501", "10.0.0.6:10777"]
    assert hosts.local_servers(frozenset({"10.0.0.5"})) == (hosts.servers[0],)
    # the scheduler listens on its own address, not on every interface of this machine
    assert 'public_addr = "10.0.0.1:10600"' in scheduler_toml(hosts)
    named = plan_cluster(tmp_path, hosts=["10.0.0.5"], scheduler_host="builder.example")
    assert 'public_addr = "0.0.0.0:10600"' in scheduler_toml(named)
    assert 'scheduler_url = "http://builder.example:10600"' in server_toml(named, named.servers[0], "jwt")
