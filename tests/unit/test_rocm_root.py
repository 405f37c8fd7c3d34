"""ROCm from a Debian root, its pure parts: the choice, the pin, the mmdebstrap command, the
installed versions and what they name, the chroot wrapping of the plan, the mount table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from skippy.compile.backends.rocm_rootfs import (
    INSIDE_ENV,
    DebianRootfs,
    RootfsPin,
    mmdebstrap_argv,
    parse_package_versions,
    parse_rootfs_pin,
    resolve_toolkit_choice,
    rootfs_home,
    versions_digest,
)
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.rootfs import Rootfs, mounts_under, parse_mount_points, plan_mounts, remove_tree
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, TreeInfo
from skippy.core.errors import BuildError, SettingsError
from skippy.core.settings import Settings

PACKAGES = ["hipcc", "libamdhip64-dev", "libhipblas-dev", "librocblas-dev", "rocm-cmake", "cmake", "ninja-build"]
VERSIONS = {"hipcc": "7.0.2-1", "libamdhip64-dev": "6.4.3-1", "cmake": "4.1.2-1", "ninja-build": "1.13.1-1"}


def pin(**kw: object) -> RootfsPin:
    return parse_rootfs_pin({"suite": "sid", "packages": list(PACKAGES), **kw})


def test_the_choice_env_over_table_over_auto() -> None:
    assert resolve_toolkit_choice({}, {}) == "auto"
    assert resolve_toolkit_choice({"rocm_toolkit": "system"}, {}) == "system"
    assert resolve_toolkit_choice({"rocm_toolkit": "system"}, {"SKIPPY_ROCM_TOOLKIT": "Debian-Root"}) == "debian-root"
    with pytest.raises(SettingsError, match="unknown ROCm toolkit 'debian'") as info:
        resolve_toolkit_choice({}, {"SKIPPY_ROCM_TOOLKIT": "debian"})
    assert "auto, system, debian-root" in (info.value.next_step or "")


def test_the_pin_is_checked_and_named() -> None:
    p = pin()
    assert p == RootfsPin("sid", tuple(PACKAGES), None)
    assert p.dirname == f"sid-{p.digest}"
    assert rootfs_home(Path("/c"), p) == Path("/c/rocm-root") / p.dirname
    # the same packages in another order are the same root; another package or snapshot is another
    assert pin(packages=list(reversed(PACKAGES))).digest == p.digest
    assert pin(packages=[*PACKAGES, "git"]).digest != p.digest
    snap = pin(snapshot="http://archive.example/debian/20260101T000000Z")
    assert snap.snapshot == "http://archive.example/debian/20260101T000000Z"
    assert snap.digest != p.digest


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (None, r"rocm_debian_root\]: missing"),
        ({"suite": "sid", "packages": PACKAGES, "mirror": "x"}, "unknown key"),
        ({"suite": "sid; rm", "packages": PACKAGES}, "suite 'sid; rm' is not a Debian suite name"),
        ({"suite": "sid", "packages": "hipcc"}, "packages must be a non-empty list"),
        ({"suite": "sid", "packages": [*PACKAGES, "--root"]}, "package '--root' is not a Debian package name"),
        ({"suite": "sid", "packages": ["hipcc"]}, "packages lacks libamdhip64-dev, libhipblas-dev"),
        ({"suite": "sid", "packages": PACKAGES, "snapshot": "20260101T000000Z"}, "snapshot .* is not a URL"),
    ],
)
def test_a_bad_pin_names_the_table_and_the_problem(table: object, problem: str) -> None:
    with pytest.raises(SettingsError, match=problem) as info:
        parse_rootfs_pin(table)
    assert "[tool.skippy.build.rocm_debian_root]" in info.value.what
    assert 'suite = "sid"' in (info.value.next_step or "")


def test_the_mmdebstrap_command(tmp_path: Path) -> None:
    argv = mmdebstrap_argv(pin(), "http://mirror.example/debian", tmp_path / "root", Path("/k.gpg"))
    assert argv[:3] == ["mmdebstrap", "--mode=root", "--variant=apt"]
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in argv  # sid's InRelease may be past Valid-Until
    assert "--dpkgopt=path-exclude=/usr/lib/*/rocblas/*/library/*" in argv  # 2.9 GB of GPU kernels
    assert f"--include={','.join(PACKAGES)}" in argv
    assert argv[-3:] == ["sid", str(tmp_path / "root"), "deb [signed-by=/k.gpg] http://mirror.example/debian sid main"]
    snapshot = "http://archive.example/debian/20260101T000000Z"
    assert mmdebstrap_argv(pin(snapshot=snapshot), snapshot, tmp_path, None)[-1] == f"deb {snapshot} sid main"


def test_installed_versions_name_the_toolkit() -> None:
    text = "hipcc\t7.0.2-1\ncmake\t4.1.2-1\n\nbroken line\nlibamdhip64-dev\t6.4.3-1\nninja-build\t1.13.1-1\n"
    versions = parse_package_versions(text)
    assert versions == VERSIONS
    assert list(versions) == sorted(versions)
    root = DebianRootfs(Path("/c/root"), pin(), MappingProxyType(versions))
    assert root.toolkit == f"rocm debian-root sid hip 6.4.3-1 {versions_digest(versions)}"
    moved = {**versions, "hipcc": "7.0.3-1"}  # sid moved
    assert versions_digest(moved) != versions_digest(versions)
    assert versions_digest(dict(reversed(list(versions.items())))) == versions_digest(versions)
    tools = {t.name: t.version for t in root.pinned_tools()}
    assert tools["deb:hipcc"] == "7.0.2-1"
    assert tools["deb:rocm-cmake"] == "?"  # pinned but not in these versions
    inside = root.rootfs("/usr/sbin/chroot")
    assert (inside.cmake.path, inside.ninja.path) == ("/usr/bin/cmake", "/usr/bin/ninja")
    assert inside.cmake.version.startswith("cmake 4.1.2-1 (debian-root sid")


# --- the plan inside the root -------------------------------------------------------------


def _root(path: Path, versions: dict[str, str] = VERSIONS) -> DebianRootfs:
    return DebianRootfs(path, pin(), MappingProxyType(dict(versions)))


def _plan(
    tmp_path: Path,
    root: DebianRootfs | None,
    defines: Mapping[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> BuildPlan:
    base = Toolchain(
        backend="rocm",
        system="Linux",
        cmake=Tool("cmake", "/venv/bin/cmake", "cmake version 4.1"),
        ninja=Tool("ninja", "/venv/bin/ninja", "1.13"),
        tools=(Tool("cc", "/usr/bin/cc", "gcc 12"),),
        launcher=Tool("sccache", "/venv/bin/sccache", "sccache 0.16.0"),
    )
    if root is not None:
        inside = root.rootfs("/usr/sbin/chroot")
        base = replace(
            base,
            cmake=inside.cmake,
            ninja=inside.ninja,
            launcher=Tool("sccache", "/usr/bin/sccache", "sccache 0.16.0") if env else None,
            facts={"rocm_toolkit": "debian-root", "toolkit": root.toolkit},
            tools=(*base.tools, *root.pinned_tools()),
            rootfs=inside,
        )
    tree = TreeInfo(tmp_path / "src", frozenset({"GGML_RPC"}), frozenset({"C", "CXX", "HIP"}), "ggml-rpc-server")
    settings = Settings.from_table(tmp_path / "proj", {}, env or {})
    request = build_request("rocm", settings, defines=defines or {})
    return plan_build(request, settings, tree=tree, toolchain=base, patched_sha="a" * 40)


def test_the_plan_runs_cmake_and_ninja_inside_the_root_with_nothing_of_the_host(tmp_path: Path) -> None:
    root = _root(tmp_path / "rootfs")
    p = _plan(tmp_path, root, {"AMDGPU_TARGETS": "gfx1100"})
    prefix = ("/usr/sbin/chroot", str(root.path), "/usr/bin/env", "-i")
    inside_env = tuple(f"{k}={v}" for k, v in sorted(INSIDE_ENV.items()))
    assert p.configure_argv[:4] == prefix
    assert p.configure_argv[4 : 4 + len(inside_env)] == inside_env
    assert "HIP_PLATFORM=amd" in inside_env and "PATH=/usr/bin:/bin" in inside_env
    assert p.configure_argv[4 + len(inside_env) :][:5] == (
        "/usr/bin/cmake",
        "-S",
        str(tmp_path / "src"),
        "-B",
        str(p.build_dir),
    )
    assert p.build_argv == (*p.runner, "/usr/bin/ninja", "-C", str(p.build_dir), "llama-server", "ggml-rpc-server")
    defines = {d.name: d.value for d in p.defines}
    assert defines["CMAKE_MAKE_PROGRAM"] == "/usr/bin/ninja"
    assert defines["GGML_HIP"] == "ON" and defines["AMDGPU_TARGETS"] == "gfx1100"
    # CMake finds the root's HIP compiler itself; no launcher runs inside the root
    assert "CMAKE_HIP_COMPILER" not in defines
    assert not any(name.endswith("_COMPILER_LAUNCHER") for name in defines)
    assert p.launcher is None and p.cache_storage is None
    assert p.toolkit == root.toolkit
    assert p.stamp["tools"]["deb:hipcc"]["version"] == "7.0.2-1"
    assert p.stamp["tools"]["cmake"]["path"] == "/usr/bin/cmake"
    # CMake's recorded tool paths are checked inside the root
    assert p.host_path("/usr/bin/cmake") == root.path / "usr" / "bin" / "cmake"
    host = _plan(tmp_path, None, {"AMDGPU_TARGETS": "gfx1100"})
    assert host.runner == () and host.configure_argv[0] == "/venv/bin/cmake"
    assert host.host_path("/usr/bin/cmake") == Path("/usr/bin/cmake")


def test_other_package_versions_are_another_build_dir(tmp_path: Path) -> None:
    first = _plan(tmp_path, _root(tmp_path / "rootfs"))
    same = _plan(tmp_path, _root(tmp_path / "rootfs"))
    moved = _plan(tmp_path, _root(tmp_path / "rootfs", {**VERSIONS, "hipcc": "7.0.3-1"}))
    assert first.build_dir == same.build_dir
    assert moved.build_dir != first.build_dir
    assert moved.stamp != first.stamp


# --- mounts -----------------------------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/vda rw
30 22 0:5 / /work/cache/root/proc rw - proc proc rw
31 22 0:6 / /work/cache/root/dev rw - devtmpfs udev rw
32 22 8:1 /work/my\\040tree /work/cache/root/work/my\\040tree rw - ext4 /dev/vda rw
"""


def test_the_mount_table_is_read_and_a_mounted_folder_is_never_deleted(tmp_path: Path) -> None:
    points = parse_mount_points(MOUNTINFO)
    assert Path("/work/cache/root/work/my tree") in points
    under = mounts_under(Path("/work/cache/root"), MOUNTINFO)
    assert under[0] == Path("/work/cache/root/work/my tree")  # deepest first
    assert set(under) == {Path("/work/cache/root/proc"), Path("/work/cache/root/dev"), under[0]}
    assert mounts_under(Path("/work/cache/rootless"), MOUNTINFO) == []
    victim = tmp_path / "root"
    (victim / "dev").mkdir(parents=True)
    table = f"22 1 8:1 / / rw - ext4 /dev/vda rw\n31 22 0:6 / {victim / 'dev'} rw - devtmpfs udev rw\n"
    with pytest.raises(BuildError, match="mount") as info:
        remove_tree(victim, mountinfo=table)
    assert f"umount {victim / 'dev'}" in (info.value.next_step or "")
    assert (victim / "dev").is_dir(), "nothing deleted"
    remove_tree(victim, mountinfo="22 1 8:1 / / rw - ext4 /dev/vda rw\n")
    assert not victim.exists()


def test_the_mounts_bind_the_work_folders_at_their_own_paths(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "usr").mkdir(parents=True)
    real = tmp_path / "real-tree"
    real.mkdir()
    link = tmp_path / "proj" / "llama.cpp"
    link.parent.mkdir()
    link.symlink_to(real)
    build = tmp_path / "proj" / "build" / "rocm-x"
    mounts = plan_mounts(root, (link, build, link))
    assert [m.argv for m in mounts[:2]] == [
        ("mount", "-t", "proc", "proc", str(root / "proc")),
        ("mount", "--bind", "/dev", str(root / "dev")),
    ]
    # the link's target is bound at the link's own path (the path the plan uses); listed once
    assert mounts[2].argv == ("mount", "--bind", str(real), str(root / str(link).lstrip("/")))
    assert mounts[3].target == root / str(build).lstrip("/") and mounts[3].source == build
    assert len(mounts) == 4
    # a path that leads out of the root through a link inside it is refused
    (root / "escape").symlink_to(tmp_path)
    with pytest.raises(BuildError, match="resolves outside the root"):
        plan_mounts(root, (Path("/escape/x"),))


def test_the_rootfs_wraps_and_maps_paths() -> None:
    inside = Rootfs(
        path=Path("/c/root"),
        program="chroot",
        env={"PATH": "/usr/bin", "A": "1"},
        cmake=Tool("cmake", "/usr/bin/cmake", "4"),
        ninja=Tool("ninja", "/usr/bin/ninja", "1"),
        label="r",
    )
    assert inside.wrap(["cmake", "--version"]) == (
        "chroot",
        "/c/root",
        "/usr/bin/env",
        "-i",
        "A=1",
        "PATH=/usr/bin",
        "cmake",
        "--version",
    )
    assert inside.host_path("/usr/lib/llvm-21/bin/clang++") == Path("/c/root/usr/lib/llvm-21/bin/clang++")


def test_a_configured_cluster_is_not_used_inside_the_root_and_the_plan_says_why(tmp_path: Path) -> None:
    env = {"SKIPPY_DIST": "http://10.0.0.1:10600", "SKIPPY_DIST_TOKEN": "secret-client-token"}
    p = _plan(tmp_path, _root(tmp_path / "rootfs"), env=env)
    assert p.dist is None and p.launcher is not None
    assert p.dist_unused == (
        "sccache-dist scheduler http://10.0.0.1:10600 (SKIPPY_DIST) is not used: the build runs inside a root "
        "file system, whose compiler it cannot send"
    )
    assert _plan(tmp_path, _root(tmp_path / "rootfs"), env={"PATH": "/usr/bin"}).dist_unused is None
