"""The sccache server a build uses, started with this tree's ``SCCACHE_BASEDIRS``.

sccache strips its base directories from the paths in an object's key, so a tree
kept at another path (a second checkout, a copy of the workdir, another machine)
is served the same objects. The base directories are read once, when the server
starts (a client's ``SCCACHE_BASEDIRS`` is ignored by a running server), and one
server serves every build that shares a cache socket. So each build *claims* the
server before configuring:

* ``<socket>.basedirs`` records what the running server was started with;
* when it differs from this build's, and no other build holds the server, the
  server is stopped; the build's next sccache call starts it with this build's
  environment (and the record is rewritten);
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
            stack.enter_context(_claim(launcher, server, env, console, stop_after=stop_after))
        yield


@contextlib.contextmanager
def _claim(
    launcher: tuple[str, ...], server: Path, env: Mapping[str, str], console: Console, *, stop_after: bool
) -> Iterator[None]:
    server.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_sidecar(server, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wanted = env.get(BASEDIRS, "")
        running = recorded_basedirs(server)
        if running != wanted and _try_exclusive(fd):
            # nobody builds with it: restart it with this tree's base directories
            proc.run([*launcher, "--stop-server"], env=dict(env), check=False, timeout=60)
            write_text_atomic(_sidecar(server, ".basedirs"), wanted)
            running = wanted
        fcntl.flock(fd, fcntl.LOCK_SH)  # a downgrade, or a wait while another build restarts it
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


def _try_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


__all__ = ["BASEDIRS", "claimed_server", "recorded_basedirs", "server_id"]
