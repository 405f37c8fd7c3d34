"""ROCm without ROCm installed: the Debian sid root with Debian's ROCm packages is made (or
reused) under the project cache, the patched llama.cpp tree configures with GGML_HIP=ON
inside it (chroot) through skippy's own plan and configure, and a few of its real HIP
objects compile there (never the whole build: that is ``nox -s bench -- --only rocm``'s),
through the compiler cache running inside the root: into a fresh build dir they are all hits.

Needs root (mmdebstrap --mode=root, chroot, mount) and mmdebstrap.  The first run
downloads about 1 GB of Debian packages and makes a 2.2 GB root (about 3 minutes here);
later runs reuse it.  Heavy steps run under ``nice``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from skippy.compile.builder import execute_plan
from skippy.compile.cacheserver import claimed_server
from skippy.compile.cachestats import CacheProbe, CacheStats
from skippy.compile.configure import parse_cmake_cache
from skippy.compile.fetched import MARKER
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.rootfs import mounted, mounts_under
from skippy.compile.toolchain import Toolchain, check_tree_needs, inspect_tree, parse_ninja_targets, probe_toolchain
from skippy.core import proc
from skippy.core.errors import NetworkError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.prepare import PrepareReport, Target, prepare
from tests.e2e.needs import NOBODY, cannot_run, processes, run_as_nobody

pytestmark = pytest.mark.e2e

#: small ggml-cuda sources, compiled as HIP (mean.cu goes through hipCUB/rocPRIM)
HIP_OBJECTS = ("arange.cu", "clamp.cu", "mean.cu")
TARGETS = "gfx1100"


@pytest.fixture(scope="module")
def root_settings(project_settings: Settings) -> Settings:
    return Settings.load(project_settings.root, {**project_settings.env, "SKIPPY_ROCM_TOOLKIT": "debian-root"})


@pytest.fixture(scope="module")
def root_toolchain(root_settings: Settings) -> Toolchain:
    if os.geteuid() != 0:
        cannot_run("the ROCm Debian root needs root (mmdebstrap --mode=root, chroot, mount)")
    if proc.which("mmdebstrap", root_settings.env) is None:
        cannot_run("mmdebstrap is not installed (apt-get install mmdebstrap)")
    started = time.monotonic()
    try:
        toolchain = probe_toolchain("rocm", root_settings, given={"AMDGPU_TARGETS": TARGETS})
    except NetworkError as exc:
        cannot_run(f"cannot make the ROCm Debian root: {exc.what}")
    print(f"probe (the root made when not cached): {time.monotonic() - started:.1f} s", *toolchain.notes)
    return toolchain


@pytest.fixture(scope="module")
def prepared(root_settings: Settings) -> PrepareReport:
    """The pinned tree, prepared (the queue applied) in the project's workdir."""
    try:
        return prepare(root_settings, Target.pinned(), console=Console(env={}, stream=io.StringIO()))
    except NetworkError as exc:
        cannot_run(f"cannot fetch the pinned sources: {exc.what}")


def _nice(argv: tuple[str, ...]) -> list[str]:
    nice = shutil.which("nice")
    return [nice, "-n", "10", *argv] if nice else list(argv)


def test_the_root_holds_debians_rocm_and_no_gpu_kernels(root_toolchain: Toolchain, root_settings: Settings) -> None:
    inside = root_toolchain.rootfs
    assert inside is not None
    root = inside.path
    assert root.is_relative_to(root_settings.cache_dir / "rocm-root")
    assert (root.parent / MARKER).is_file()
    assert root_toolchain.facts["rocm_toolkit"] == "debian-root"
    versions = root_toolchain.tool_versions()
    # llama.cpp needs ROCm >= 6.1
    hip = versions["deb:libamdhip64-dev"]["version"]
    assert tuple(int(x) for x in hip.split(".")[:2]) >= (6, 1), hip
    assert root_toolchain.facts["toolkit"].startswith(f"rocm debian-root sid hip {hip} ")
    assert (root / "usr" / "bin" / "hipcc").exists()
    assert (root / "usr" / "bin" / "cmake").exists() and (root / "usr" / "bin" / "ninja").exists()
    # the rocBLAS GPU kernels were left out (path-exclude): the libraries are there, the kernels not
    assert list(root.glob("usr/lib/*/librocblas.so*"))
    assert not list(root.glob("usr/lib/*/rocblas/*/library/*"))
    # the compiler cache: the host's sccache copied into the root (it links only an old glibc)
    launcher = root_toolchain.launcher
    assert launcher is not None and launcher.name == "sccache", root_toolchain.notes
    assert launcher.path.startswith("/opt/skippy/sccache-") and inside.host_path(launcher.path).is_file()
    # a second probe reuses the root
    started = time.monotonic()
    again = probe_toolchain("rocm", root_settings, given={"AMDGPU_TARGETS": TARGETS})
    assert again.facts == root_toolchain.facts
    assert time.monotonic() - started < 30


def test_the_patched_tree_configures_with_hip_inside_the_root_and_compiles_a_few_objects(
    root_toolchain: Toolchain, root_settings: Settings, prepared: PrepareReport
) -> None:
    console = Console(env={}, stream=io.StringIO())
    tree = inspect_tree(prepared.workdir)
    check_tree_needs(tree, root_toolchain)
    plan = plan_build(
        build_request("rocm", root_settings, defines={"AMDGPU_TARGETS": TARGETS}),
        root_settings,
        tree=tree,
        toolchain=root_toolchain,
        patched_sha=prepared.patched_sha,
    )
    inside = plan.rootfs
    assert inside is not None
    assert plan.configure_argv[:2] == (inside.program, str(inside.path))
    assert plan.stamp["tools"]["deb:hipcc"]["version"] == root_toolchain.tool_versions()["deb:hipcc"]["version"]
    started = time.monotonic()
    with mounted(inside, plan.rootfs_binds, env=root_settings.env):
        report = execute_plan(plan, console, build=False)
        configured = time.monotonic() - started
        ninja = (*plan.runner, inside.ninja.path)
        objects = _hip_objects(plan, ninja)
        for name in objects:
            (plan.build_dir / name).unlink(missing_ok=True)
        compiling = time.monotonic()
        # held as a build holds it: started before the compiles, stopped before the unmounts
        with claimed_server(plan.launcher_argv, (plan.env,), console, stop_after=True):
            proc.run(_nice((*ninja, "-C", str(plan.build_dir), "-j", "2", *objects)), env=plan.env, timeout=1800)
        compiled = time.monotonic() - compiling
        assert _servers_gone(plan), "no compiler cache server was left running inside the root"
    print(f"configure: {configured:.1f} s ({report.configure_reason}); {len(objects)} HIP objects: {compiled:.1f} s")
    assert mounts_under(inside.path) == [], "everything mounted for the build was unmounted"
    assert report.toolkit == root_toolchain.facts["toolkit"]
    cache = parse_cmake_cache((plan.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
    assert cache["GGML_HIP"] == "ON"
    assert cache["AMDGPU_TARGETS"] == TARGETS
    assert cache["CMAKE_COMMAND"] == "/usr/bin/cmake"
    # CMake found the root's HIP compiler by itself (Debian's LLVM); it is a file of the root
    hip_compiler = cache["CMAKE_HIP_COMPILER"]
    assert hip_compiler.startswith("/usr/lib/llvm-"), hip_compiler
    assert inside.host_path(hip_compiler).exists()
    assert plan.launcher is not None and cache["CMAKE_HIP_COMPILER_LAUNCHER"] == plan.launcher.path
    for name in objects:
        # real HIP objects: each carries device code for the one AMD target asked for
        assert f"amdgcn-amd-amdhsa--{TARGETS}".encode() in (plan.build_dir / name).read_bytes(), name


def _hip_objects(plan: BuildPlan, ninja: tuple[str, ...]) -> list[str]:
    """The Ninja targets of :data:`HIP_OBJECTS` in ``plan``'s configured build dir."""
    listed = proc.run([*ninja, "-C", str(plan.build_dir), "-t", "targets", "all"], env=plan.env).stdout
    objects = sorted(
        name
        for name in parse_ninja_targets(listed)
        if "ggml-hip.dir" in name and name.endswith(tuple(f"/{src}.o" for src in HIP_OBJECTS))
    )
    assert len(objects) == len(HIP_OBJECTS), objects
    return objects


def _servers_in(plan: BuildPlan) -> list[int]:
    """Processes running a program of ``plan``'s root (a compiler cache server left inside): by
    their real path under a chroot root, by the launcher's path inside for a namespace runner
    (the kernel names a program by its path in the process's own mount namespace)."""
    inside = plan.rootfs
    assert inside is not None
    real = os.path.realpath(inside.path) + "/"
    if plan.launcher is not None and inside.namespace:
        launcher = plan.launcher.path
        return processes(lambda _exe, argv0: argv0 == launcher)
    return processes(lambda exe, _argv0: exe.startswith(real))


def _servers_gone(plan: BuildPlan, within: float = 60.0) -> bool:
    """Whether the root's cache server is gone, given ``within`` seconds to exit: ``sccache
    --stop-server`` returns once the server has answered, and a busy machine may take a moment
    to end the process after that (the unmounts fall back to lazy ones meanwhile)."""
    deadline = time.monotonic() + within
    while _servers_in(plan):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _objects_through_the_cache(plan: BuildPlan, console: Console, env: Mapping[str, str]) -> tuple[CacheStats, float]:
    """Configure ``plan``'s build dir inside the root, then compile the few HIP objects there
    through the compiler cache; the cache's figures read as the build report reads them."""
    inside = plan.rootfs
    assert inside is not None
    with mounted(inside, plan.rootfs_binds, env=env):
        execute_plan(plan, console, build=False)
        ninja = (*plan.runner, inside.ninja.path)
        objects = _hip_objects(plan, ninja)
        assert plan.launcher is not None
        with claimed_server(plan.launcher_argv, (plan.env,), console, stop_after=True):
            probe = CacheProbe(plan, console)
            build_env = probe.before()
            started = time.monotonic()
            argv = _nice((*ninja, "-C", str(plan.build_dir), "-j", "2", *objects))
            proc.run(argv, env=build_env, timeout=1800)
            took = time.monotonic() - started
            stats = probe.after()
            assert _servers_in(plan), "the cache server runs inside the root (a program of the root)"
        assert _servers_gone(plan), "the root's cache server was stopped before the unmounts"
    assert mounts_under(inside.path) == [], "everything mounted for the build was unmounted"
    for name in objects:
        assert f"amdgcn-amd-amdhsa--{TARGETS}".encode() in (plan.build_dir / name).read_bytes(), name
    assert stats is not None, "the compiler cache's figures could be read inside the root"
    return stats, took


def test_hip_objects_from_the_cache_inside_the_root_are_all_hits_in_a_fresh_build_dir(
    root_toolchain: Toolchain, root_settings: Settings, prepared: PrepareReport, tmp_path: Path
) -> None:
    console = Console(env={}, stream=io.StringIO())
    assert root_toolchain.launcher is not None
    tree = inspect_tree(prepared.workdir)
    # an empty compiler cache of its own (the first build misses), shared by two build roots
    table = {**root_settings.raw, "cache_dir": str(tmp_path / "cache"), "workdir": str(root_settings.workdir)}
    plans = []
    for name in ("first", "fresh"):
        settings = Settings.from_table(
            root_settings.root, {**table, "build_root": str(tmp_path / name)}, root_settings.env
        )
        plan = plan_build(
            build_request("rocm", settings, defines={"AMDGPU_TARGETS": TARGETS}),
            settings,
            tree=tree,
            toolchain=root_toolchain,
            patched_sha=prepared.patched_sha,
        )
        plans.append((plan, settings))
    (first, first_settings), (fresh, fresh_settings) = plans
    assert first.build_dir != fresh.build_dir
    host_socket = root_settings.cache_dir / "sccache.sock"
    assert first.env["SCCACHE_SERVER_UDS"] != str(host_socket)
    assert "SCCACHE_SERVER_UDS=" + first.env["SCCACHE_SERVER_UDS"] in first.runner
    cold, cold_s = _objects_through_the_cache(first, console, dict(first_settings.env))
    warm, warm_s = _objects_through_the_cache(fresh, console, dict(fresh_settings.env))
    print(
        f"{len(HIP_OBJECTS)} HIP objects inside the root: {cold.render()} in {cold_s:.1f} s; "
        f"fresh build dir: {warm.render()} in {warm_s:.1f} s"
    )
    assert (cold.hits, cold.misses) == (0, len(HIP_OBJECTS)), cold.render()
    assert (warm.hits, warm.misses) == (len(HIP_OBJECTS), 0), warm.render()
    assert warm.storage == "local directory"


# --- the namespace runner, as an unprivileged user ------------------------------------------------


def namespace_flow(work: Path, project: Path, rootfs_home: Path) -> dict[str, object]:
    """As the user running it (``nobody``): the root made by root, reached through a link in a
    cache of this user's own, its namespace runner (``bwrap``); the tree configured with
    GGML_HIP=ON and the few HIP objects compiled, twice (two build roots, one cache)."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "SKIPPY_ROCM_TOOLKIT": "debian-root"}
    project_settings = Settings.load(project, env)
    cache_dir = work / "cache"
    (cache_dir / "rocm-root").mkdir(parents=True, exist_ok=True)
    (cache_dir / "rocm-root" / rootfs_home.name).symlink_to(rootfs_home)
    table = {**project_settings.raw, "cache_dir": str(cache_dir), "workdir": str(project_settings.workdir)}
    settings = Settings.from_table(project, {**table, "build_root": str(work / "first")}, env)
    toolchain = probe_toolchain("rocm", settings, given={"AMDGPU_TARGETS": TARGETS})
    assert toolchain.rootfs is not None and toolchain.rootfs.namespace, toolchain.notes
    tree = inspect_tree(project_settings.workdir)
    console = Console(env={}, stream=io.StringIO())
    out: dict[str, object] = {"uid": os.geteuid(), "notes": list(toolchain.notes), "builds": []}
    for name in ("first", "fresh"):
        settings = Settings.from_table(project, {**table, "build_root": str(work / name)}, env)
        plan = plan_build(
            build_request("rocm", settings, defines={"AMDGPU_TARGETS": TARGETS}),
            settings,
            tree=tree,
            toolchain=toolchain,
            patched_sha="0" * 40,
        )
        stats, took = _objects_through_the_cache(plan, console, settings.env)
        cache = parse_cmake_cache((plan.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
        objects = sorted(plan.build_dir.rglob("*.cu.o"))
        out["builds"].append(  # type: ignore[attr-defined]
            {
                "argv0": plan.configure_argv[0],
                "hits": stats.hits,
                "misses": stats.misses,
                "seconds": round(took, 1),
                "ggml_hip": cache["GGML_HIP"],
                "cmake_command": cache["CMAKE_COMMAND"],
                "objects": len(objects),
                "owners": sorted({o.stat().st_uid for o in objects}),
            }
        )
    return out


def test_nobody_compiles_hip_objects_in_the_root_through_the_namespace_runner(
    root_toolchain: Toolchain, root_settings: Settings, prepared: PrepareReport
) -> None:
    """The rootless route with the real toolkit: the root's hipcc, cmake and ninja in a user
    namespace made by ``nobody`` (no capability of any kind), the tree and the root read-only
    to it, its own build dirs and compiler cache."""
    if shutil.which("bwrap") is None:
        cannot_run("bwrap is not installed (apt-get install bubblewrap)")
    inside = root_toolchain.rootfs
    assert inside is not None
    work = Path(tempfile.mkdtemp(prefix="skippy-rocm-ns-"))
    try:
        os.chown(work, NOBODY, NOBODY)
        work.chmod(0o755)
        seen = run_as_nobody(
            __name__,
            "namespace_flow",
            str(work),
            str(root_settings.root),
            str(inside.path.parent),
            home=work,
            timeout=1800,
            nice=True,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("as nobody:", json.dumps(seen["builds"]))
    assert seen["uid"] == NOBODY
    assert any("bwrap, an unprivileged user namespace" in note for note in seen["notes"]), seen["notes"]
    first, fresh = seen["builds"]
    for build in (first, fresh):
        assert build["argv0"].endswith("bwrap")
        assert build["ggml_hip"] == "ON" and build["cmake_command"] == "/usr/bin/cmake"
        assert build["objects"] == len(HIP_OBJECTS) and build["owners"] == [NOBODY]
    assert (first["hits"], first["misses"]) == (0, len(HIP_OBJECTS)), first
    assert (fresh["hits"], fresh["misses"]) == (len(HIP_OBJECTS), 0), fresh
