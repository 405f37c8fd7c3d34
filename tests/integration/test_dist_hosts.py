"""Build servers on other hosts: two network namespaces stand in for two machines, each joined
to this one by a veth pair on a private /30 of its own (a default route through this machine).
The cluster is planned as ``nox -s dist-cluster -- --hosts A,B --scheduler HERE`` plans it:
the scheduler runs here (``running_cluster`` with this machine's address as its own starts no
build server), each namespace runs its build server from the config written for its address,
and skippy's plan for tests/integration/cmake_probe builds through them.

* every compile runs on a build server, both namespace hosts take some, and each object equals
  a local compile's;
* the namespaces and veth pairs are removed afterwards, also when the test fails, and those a
  killed earlier run left behind are removed before.

Traffic flows only between this machine and the two namespaces: no other host is involved.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from skippy.compile.distcluster import BuildServer, ClusterPlan, _Daemon, plan_cluster, running_cluster, write_cluster
from skippy.core import proc
from tests.integration.test_dist_cluster import EXTRA_UNITS, Machine, _dist_env, _env, _needs, make_tree
from tests.redisserver import free_port

pytestmark = pytest.mark.integration

#: the namespaces' and the host-side links' names start so; the rest is the pid of the run
NS_PREFIX: Final = "skippy-dh-"
LINK_PREFIX: Final = "skdh"
#: a private /16 unlikely to be in use; each run takes one /24 of it (two /30s)
NET: Final = "10.231"
#: seconds for both build servers to register with the scheduler
REGISTER_TIMEOUT: Final = 60.0


@dataclass(frozen=True)
class Host:
    """One namespace standing in for a machine: its veth pair, this side's address and its own."""

    ns: str
    link: str
    peer: str
    here: str
    there: str


def _ip_env(env: Mapping[str, str]) -> dict[str, str]:
    return {**env, "PATH": f"{env.get('PATH', os.defpath)}:/usr/sbin:/sbin"}


def _ip(env: Mapping[str, str], *args: str, check: bool = True) -> proc.Result:
    return proc.run(["ip", *args], env=env, check=check, timeout=30)


#: a namespace's and a link's name (either side) as this test makes them: the run's pid inside
_NS_NAME: Final = re.compile(rf"{NS_PREFIX}(\d+)-[ab]")
_LINK_NAME: Final = re.compile(rf"{LINK_PREFIX}(\d+)[ab]p?")


def _left_behind(name: str, pattern: re.Pattern[str]) -> bool:
    """``name`` is one this test makes, of a run that is gone (or of this pid, reused)."""
    made = pattern.fullmatch(name)
    if made is None:
        return False
    pid = int(made.group(1))
    return pid == os.getpid() or not Path(f"/proc/{pid}").exists()


def _remove(env: Mapping[str, str], ns: str | None, link: str | None) -> None:
    """Stop what still runs in namespace ``ns`` (started by a run of this test), delete it and
    the host side of ``link`` (which takes its peer along)."""
    if ns is not None:
        pids = _ip(env, "netns", "pids", ns, check=False).stdout.split()
        for pid in (int(p) for p in pids if p.isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip(env, "netns", "delete", ns, check=False)
    if link is not None:
        _ip(env, "link", "delete", link, check=False)


def _sweep(env: Mapping[str, str]) -> None:
    """Remove what a run of this test that is gone left behind (this pid's names included)."""
    for line in _ip(env, "netns", "list", check=False).stdout.splitlines():
        name = line.split(" ", 1)[0]
        if _left_behind(name, _NS_NAME):
            _remove(env, name, None)
    for line in _ip(env, "-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().partition("@")[0] if len(fields) > 1 else ""
        if _left_behind(name, _LINK_NAME):
            _remove(env, None, name)


def _free_octet(env: Mapping[str, str]) -> int:
    """A third octet whose NET.x.0/24 has no address or route on this machine."""
    taken = _ip(env, "-4", "-o", "addr", "show", check=False).stdout + _ip(env, "-4", "route", "show").stdout
    for step in range(256):
        octet = (os.getpid() + step) % 256
        if f"{NET}.{octet}." not in taken:
            return octet
    pytest.skip(f"every {NET}.x.0/24 is in use on this machine")


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    """Two namespaces as two hosts; removed afterwards whatever happened."""
    env = _ip_env(_env(tmp_path))
    _needs(env)
    if proc.which("ip", env) is None:
        pytest.skip("the namespaces need `ip` (apt-get install iproute2)")
    _sweep(env)
    octet = _free_octet(env)
    made: list[Host] = []
    try:
        for i, side in enumerate("ab"):
            host = Host(  # NET.octet.0/30 and NET.octet.4/30: .1 and .5 on this side
                ns=f"{NS_PREFIX}{os.getpid()}-{side}",
                link=f"{LINK_PREFIX}{os.getpid()}{side}",
                peer=f"{LINK_PREFIX}{os.getpid()}{side}p",
                here=f"{NET}.{octet}.{4 * i + 1}",
                there=f"{NET}.{octet}.{4 * i + 2}",
            )
            added = _ip(env, "netns", "add", host.ns, check=False)
            if not added.ok:
                pytest.skip(f"`ip netns add` was refused here: {added.stderr.strip()}")
            made.append(host)
            for argv in (
                ("link", "add", host.link, "type", "veth", "peer", "name", host.peer),
                ("link", "set", host.peer, "netns", host.ns),
                ("addr", "add", f"{host.here}/30", "dev", host.link),
                ("link", "set", host.link, "up"),
                ("-n", host.ns, "addr", "add", f"{host.there}/30", "dev", host.peer),
                ("-n", host.ns, "link", "set", host.peer, "up"),
                ("-n", host.ns, "link", "set", "lo", "up"),
                ("-n", host.ns, "route", "add", "default", "via", host.here),
            ):
                _ip(env, *argv)
        a, b = made
        yield a, b
    finally:
        for host in made:
            _remove(env, host.ns, host.link)
        left = _ip(env, "netns", "list", check=False).stdout + _ip(env, "-o", "link", "show", check=False).stdout
        assert not [h for h in made if h.ns in left or h.link in left], f"not removed: {made}\n{left}"


def _server_daemon(plan: ClusterPlan, server: BuildServer, host: Host, exe: str, env: Mapping[str, str]) -> _Daemon:
    """``server``'s sccache-dist inside ``host``'s namespace, from the config written for it;
    started and stopped (by its process group) as ``running_cluster`` does its own servers
    (``ip netns exec`` execs it: the pid is sccache-dist's)."""
    (plan.folder / server.name).mkdir(parents=True, exist_ok=True)  # its toolchains and sandboxes
    daemon_env = {**env, "SCCACHE_NO_DAEMON": "1", "SCCACHE_LOG": "info"}
    config = str(plan.server_config(server))
    argv = ["ip", "netns", "exec", host.ns, exe, "server", "--config", config]
    return _Daemon(server.name, argv, daemon_env, plan.folder / f"{server.name}.log")


def _wait_registered(log: Path, servers: Mapping[str, _Daemon]) -> None:
    """Until the scheduler's log says each server registered (by its address)."""
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while True:
        lines = [
            line for line in log.read_text("utf-8", errors="replace").splitlines() if "Registered new server" in line
        ]
        missing = [addr for addr in servers if not any(addr in line for line in lines)]
        gone = [d.name for d in servers.values() if not d.alive()]
        if not missing:
            return
        if gone or time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {d.name}\n{d.log_path.read_text('utf-8', errors='replace')[-1500:]}" for d in servers.values()
            )
            pytest.fail(f"not registered: {missing} (exited: {gone}); scheduler said {lines}\n{logs}")
        time.sleep(0.1)


def test_build_servers_on_two_other_hosts_compile_every_object(tmp_path: Path, hosts: tuple[Host, Host]) -> None:
    env = _env(tmp_path)
    exe = _needs(env)
    ip_env = _ip_env(env)
    scheduler_host = hosts[0].here
    plan = plan_cluster(
        tmp_path / "cluster",
        hosts=[h.there for h in hosts],
        scheduler_host=scheduler_host,
        scheduler_port=free_port(),
    )
    assert [s.host for s in plan.servers] == [h.there for h in hosts]
    write_cluster(plan, exe, env)
    started = time.monotonic()
    with running_cluster(plan, exe, env, own=frozenset({scheduler_host})) as cluster:
        assert cluster.servers == {}, "servers meant for the other hosts were started here"
        daemons: dict[str, _Daemon] = {}
        try:
            for server, host in zip(plan.servers, hosts, strict=True):
                daemons[server.addr] = _server_daemon(plan, server, host, exe, ip_env)
            _wait_registered(cluster.scheduler.log_path, daemons)
            src = make_tree(tmp_path / "src")
            machine = Machine(
                tmp_path / "one",
                src,
                _dist_env(tmp_path, plan.scheduler_url, plan.client_token),
                cache=tmp_path / "cache",
            )
            report = machine.build()
        finally:
            for daemon in daemons.values():
                daemon.stop()
    assert report.compiled == EXTRA_UNITS + 3
    stats = report.cache
    assert stats is not None
    assert stats.dist_fallback is None, stats.dist_fallback
    assert stats.dist is not None
    assert stats.dist.remote == report.compiled, stats.as_dict()
    assert (stats.dist.local, stats.dist.failed_over) == (0, 0), stats.as_dict()
    compiled_on = {addr.rpartition(":")[0] for addr in stats.dist.servers}
    expected = {h.there for h in hosts}
    assert compiled_on == expected, (
        f"compiles per build server: {dict(stats.dist.servers)}; expected compiles on each of "
        f"{sorted(expected)} (the namespace hosts) and on no other"
    )
    # the same objects as a local compile (no cache, no cluster) of the same tree
    local = Machine(tmp_path / "two", src, env, {"compiler_cache": "none"}, cache=tmp_path / "cache")
    local.build()
    remote_objects, local_objects = machine.objects(), local.objects()
    assert len(remote_objects) == report.compiled
    assert remote_objects == local_objects
    print(
        f"two hosts: {stats.render()}, per server {dict(stats.dist.servers)}, "
        f"{time.monotonic() - started:.1f} s from the scheduler's start"
    )
