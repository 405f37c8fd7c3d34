"""The sccache server a build uses, started with this tree's ``SCCACHE_BASEDIRS``.

sccache strips its base directories from the paths in an object's key, so a tree
kept at another path (a second checkout, a copy of the workdir, another machine)
is served the same objects. The base directories are read once, when the server
starts (a client's ``SCCACHE_BASEDIRS`` is ignored by a running server), and one
server serves every build that shares a cache socket. So each build *claims* the
server before configuring:

* ``<socket>.basedirs`` records what the running server was started with;
* when it differs from this build's, and no other build holds the server, the
  server is stopped and the record rewritten;
* while no other build holds it, the build starts the server (with its own
  environment) before any compile: compiles racing to start a server on one Unix
  socket start one each, the last takes the socket's path and the others keep
  running where nobody reaches them (sccache 0.16, measured);
* a build holds the server shared (``flock``) until it ends, so a build of another
  tree never stops a server in the middle of someone's compile: it builds with the
  running server instead (its objects then keyed by their full paths, said once).

Only sccache is claimed; ccache reads its base directory per call.

A build inside a root file system has a server of its own, running inside the root
(``launcher`` is then the root's runner followed by sccache's path there): it is
stopped when the build ends (``stop_after``), by the last build holding it, while the
root's mounts are still up (a server left running inside would keep them busy).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

from skippy.core import proc
from skippy.core.files import write_text_atomic
from skippy.core.ui import Console

BASEDIRS: Final = "SCCACHE_BASEDIRS"


def server_id(env: Mapping[str, str]) -> Path | None:
    """The file naming the sccache server ``env`` talks to (its Unix socket, or a
    name for its loopback port under the cache dir); None when ``env`` names none."""
    if env.get("SCCACHE_SERVER_UDS"):
        return Path(env["SCCACHE_SERVER_UDS"])
    if env.get("SCCACHE_SERVER_PORT") and env.get("SCCACHE_DIR"):
        return Path(env["SCCACHE_DIR"]).parent / f"sccache-port-{env['SCCACHE_SERVER_PORT']}"
    return None


def _sidecar(server: Path, suffix: str) -> Path:
    return server.with_name(server.name + suffix)


def recorded_basedirs(server: Path) -> str | None:
    """What the running server was started with, as recorded by the build that started it."""
    try:
        return _sidecar(server, ".basedirs").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def claimed_server(
    launcher: tuple[str, ...], envs: tuple[Mapping[str, str], ...], console: Console, *, stop_after: bool = False
) -> Iterator[None]:
    """Hold the sccache server(s) of ``envs`` for one build (see the module's docstring).
    ``launcher`` is the argv that runs sccache (a runner's prefix and its path)."""
    with contextlib.ExitStack() as stack:
        seen: set[Path] = set()
        for env in envs:
            server = server_id(env)
            if server is None or server in seen:
                continue
            seen.add(server)
            # the first one is started here; the others (fallbacks) only when a compile needs them
            start = len(seen) == 1
            stack.enter_context(_claim(launcher, server, env, console, stop_after=stop_after, start=start))
        yield


@contextlib.contextmanager
def _claim(
    launcher: tuple[str, ...],
    server: Path,
    env: Mapping[str, str],
    console: Console,
    *,
    stop_after: bool,
    start: bool,
) -> Iterator[None]:
    server.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_sidecar(server, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wanted = env.get(BASEDIRS, "")
        if _try_exclusive(fd):
            # nobody builds with it: (re)start it with this tree's base directories
            if recorded_basedirs(server) != wanted:
                proc.run([*launcher, "--stop-server"], env=dict(env), check=False, timeout=60)
                write_text_atomic(_sidecar(server, ".basedirs"), wanted)
            if start:
                _start(launcher, env)  # before any compile can race to start one
        fcntl.flock(fd, fcntl.LOCK_SH)  # a downgrade, or a wait while another build (re)starts it
        running = recorded_basedirs(server)
        if running is not None and running != wanted:
            console.info(
                "compiler cache: another build is using the cache server (started for "
                f"{running or 'no base directories'}); this build's objects are keyed by their full paths"
            )
        yield
    finally:
        if stop_after and _try_exclusive(fd):
            # the last build holding it: stop it (whatever happened in the build)
            proc.run([*launcher, "--stop-server"], env=dict(env), check=False, timeout=60)
        os.close(fd)  # releases the lock


def _start(launcher: tuple[str, ...], env: Mapping[str, str]) -> None:
    """Make sure the server answers: ``--zero-stats`` talks to a running server and starts one
    only when none answers (``--start-server`` would start a second one beside it, and
    ``--show-stats`` starts none). Only called while no other build holds the server, so
    the figures it zeroes are nobody's."""
    proc.run([*launcher, "--zero-stats"], env=dict(env), check=False, timeout=120)


def _try_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


__all__ = ["BASEDIRS", "claimed_server", "recorded_basedirs", "server_id"]
