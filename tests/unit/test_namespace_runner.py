"""The namespace runner for a build root, its pure parts: the ``bwrap`` command line (the
root's system folders read-only, the work folders at their own paths, the launchers'
folder), what it refuses to bind, the server tag, the choice of runner, the root's top
level as read, and ``mmdebstrap --mode=unshare``'s requirements."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from skippy.compile.backends.rocm_rootfs import (
    INSIDE_ENV,
    DebianRootfs,
    RootfsContext,
    _can_make,
    mmdebstrap_argv,
    parse_rootfs_pin,
)
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.rootfs import (
    NAMESPACE_LAUNCHERS,
    Rootfs,
    install_launcher,
    read_layout,
    resolve_runner,
    runner_rootfs,
)
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, TreeInfo
from skippy.core.errors import BuildError, SettingsError, ToolchainMissing
from skippy.core.settings import Settings

PACKAGES = ["hipcc", "libamdhip64-dev", "libhipblas-dev", "librocblas-dev", "cmake", "ninja-build"]
LAYOUT = (("bin", "usr/bin"), ("etc", None), ("lib", "usr/lib"), ("opt", None), ("usr", None), ("var", None))


def _root(**kw: object) -> Rootfs:
    tool = Tool("cmake", "/usr/bin/cmake", "4")
    base = Rootfs(
        path=Path("/c/root"),
        program="/usr/bin/bwrap",
        env={"PATH": "/usr/bin", "A": "1"},
        cmake=tool,
        ninja=Tool("ninja", "/usr/bin/ninja", "1"),
        label="r",
        runner="namespace",
        layout=LAYOUT,
        launchers=Path("/c/launchers"),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _pairs(argv: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, word in enumerate(argv) if word == flag]


def test_the_bwrap_command_binds_the_root_read_only_and_the_work_folders_at_their_paths(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "build").mkdir(parents=True)
    link = tmp_path / "src-link"
    link.symlink_to(work)
    inside = _root().with_binds((work / "build", link, work / "build"))
    argv = inside.wrap(["cmake", "--version"])
    assert argv[:6] == ("/usr/bin/bwrap", "--unshare-user", "--uid", "0", "--gid", "0")
    end = argv.index("--")
    assert argv[end:] == ("--", "/usr/bin/env", "-i", "A=1", "PATH=/usr/bin", "cmake", "--version")
    options = argv[:end]
    assert _pairs(options, "--ro-bind") == [
        ("/c/root/etc", "/etc"),
        ("/c/root/opt", "/opt"),
        ("/c/root/usr", "/usr"),
        ("/c/root/var", "/var"),
        ("/c/launchers", "/skippy"),
    ]
    assert _pairs(options, "--symlink") == [("usr/bin", "/bin"), ("usr/lib", "/lib")]
    # each work folder once, shallow first, from its real path to the path the plan names
    assert _pairs(options, "--bind") == [(str(work), str(link)), (str(work / "build"), str(work / "build"))]
    assert [options[i + 1] for i, w in enumerate(options) if w == "--tmpfs"] == ["/tmp", "/run", "/root"]
    assert options[options.index("--proc") : options.index("--proc") + 2] == ("--proc", "/proc")
    assert options[-2:] == ("--chdir", "/")
    # the chroot runner is what it was: the binds are mounts around the build, not in the argv
    chroot = _root(runner="chroot", program="/usr/sbin/chroot", layout=(), launchers=None)
    assert chroot.with_binds((work,)) == chroot
    assert chroot.wrap(["x"]) == ("/usr/sbin/chroot", "/c/root", "/usr/bin/env", "-i", "A=1", "PATH=/usr/bin", "x")


@pytest.mark.parametrize("folder", ["/usr/src/llama.cpp", "/opt/work", "/lib/x", "/skippy/x", "/"])
def test_a_folder_under_the_roots_own_is_refused_with_the_way_out(folder: str) -> None:
    with pytest.raises(BuildError) as info:
        _root().with_binds((Path(folder),))
    err = info.value
    assert err.what.startswith(f"{folder} cannot be bound into the root /c/root by the namespace runner")
    assert "SKIPPY_ROOT_RUNNER=chroot" in (err.next_step or "")
    assert "build_root" in (err.next_step or "")
    # a folder elsewhere (even one named like a system folder deeper down) is bound
    assert _root().with_binds((Path("/work/usr/src"),)).binds == (Path("/work/usr/src"),)


def test_a_namespace_servers_tag_follows_its_binds_a_chroots_only_its_path() -> None:
    one = _root().with_binds((Path("/w/a"),))
    assert one.server_tag == _root().with_binds((Path("/w/a"),)).server_tag
    assert one.server_tag != _root().with_binds((Path("/w/b"),)).server_tag
    assert one.server_tag != _root(path=Path("/c/other")).with_binds((Path("/w/a"),)).server_tag
    chroot = _root(runner="chroot", layout=(), launchers=None)
    assert chroot.with_binds((Path("/w/a"),)).server_tag == chroot.with_binds((Path("/w/b"),)).server_tag


def test_paths_inside_map_to_the_host_launchers_to_their_folder() -> None:
    inside = _root()
    assert inside.host_path("/usr/bin/cmake") == Path("/c/root/usr/bin/cmake")
    assert inside.host_path("/skippy/sccache-1/sccache") == Path("/c/launchers/sccache-1/sccache")
    assert _root(launchers=None).host_path("/skippy/x") == Path("/c/root/skippy/x")


def test_the_launcher_is_copied_beside_the_root_for_a_namespace_runner(tmp_path: Path) -> None:
    host = tmp_path / "sccache"
    host.write_bytes(b"\x7fELF sccache")
    host.chmod(0o755)
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    inside = _root(path=rootfs, launchers=tmp_path / "launchers")
    tool = install_launcher(inside, Tool("sccache", str(host), "sccache 0.16"))
    assert tool.path.startswith(f"{NAMESPACE_LAUNCHERS}/sccache-") and tool.path.endswith("/sccache")
    copied = inside.host_path(tool.path)
    assert copied.is_relative_to(tmp_path / "launchers") and copied.read_bytes() == host.read_bytes()
    assert not (rootfs / "skippy").exists() and not (rootfs / "opt").exists(), "the root is not written"
    chroot = install_launcher(_root(path=rootfs, runner="chroot", launchers=None), Tool("sccache", str(host), "x"))
    assert chroot.path.startswith("/opt/skippy/sccache-") and (rootfs / chroot.path.lstrip("/")).is_file()


def test_the_top_level_of_a_merged_usr_root_is_read_as_links_and_system_folders(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for name in ("usr/bin", "etc", "var", "opt", "home", "proc", "tmp", "srv"):
        (root / name).mkdir(parents=True)
    for name, target in (("bin", "usr/bin"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        (root / name).symlink_to(target)
    assert read_layout(root) == (
        ("bin", "usr/bin"),
        ("etc", None),
        ("lib64", "usr/lib64"),
        ("opt", None),
        ("sbin", "usr/sbin"),
        ("usr", None),
        ("var", None),
    )
    made = runner_rootfs(root, "/usr/bin/bwrap", "namespace", env=INSIDE_ENV, launchers=tmp_path / "l")
    assert made.layout == read_layout(root) and (tmp_path / "l").is_dir() and made.launchers == tmp_path / "l"
    chroot = runner_rootfs(root, "/usr/sbin/chroot", "chroot", env=INSIDE_ENV, launchers=tmp_path / "l2")
    assert chroot.layout == () and chroot.launchers is None and not (tmp_path / "l2").exists()


def test_the_runner_is_chroot_for_root_and_the_namespace_for_everyone_else() -> None:
    assert resolve_runner({}, {}, 0) == "chroot"
    assert resolve_runner({}, {}, 1000) == "namespace"
    assert resolve_runner({"root_runner": "namespace"}, {}, 0) == "namespace"
    assert resolve_runner({"root_runner": "namespace"}, {"SKIPPY_ROOT_RUNNER": "chroot"}, 1000) == "chroot"
    with pytest.raises(SettingsError) as info:
        resolve_runner({}, {"SKIPPY_ROOT_RUNNER": "docker"}, 0)
    assert "SKIPPY_ROOT_RUNNER" in (info.value.next_step or "") and "namespace" in (info.value.next_step or "")


def test_the_plan_binds_the_work_folders_and_the_cache_in_the_bwrap_command(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    for name in ("usr", "etc", "var"):
        (rootfs / name).mkdir(parents=True)
    pin = parse_rootfs_pin({"suite": "sid", "packages": PACKAGES})
    root = DebianRootfs(rootfs, pin, MappingProxyType({"hipcc": "7.0.2-1", "libamdhip64-dev": "6.4.3-1"}))
    inside = root.rootfs("/usr/bin/bwrap", "namespace", tmp_path / "launchers")
    toolchain = Toolchain(
        backend="rocm",
        system="Linux",
        cmake=inside.cmake,
        ninja=inside.ninja,
        launcher=Tool("sccache", "/skippy/sccache-1/sccache", "0.16"),
        facts={"rocm_toolkit": "debian-root", "toolkit": root.toolkit},
        rootfs=inside,
    )
    tree = TreeInfo(tmp_path / "src", frozenset({"GGML_RPC"}), frozenset({"C", "CXX", "HIP"}), "ggml-rpc-server")

    def plan(build_root: str) -> BuildPlan:
        settings = Settings.from_table(tmp_path / "proj", {"build_root": build_root}, {})
        return plan_build(
            build_request("rocm", settings), settings, tree=tree, toolchain=toolchain, patched_sha="a" * 40
        )

    p = plan(str(tmp_path / "builds"))
    assert p.rootfs is not None and p.rootfs.namespace
    argv = p.configure_argv
    assert argv[0] == "/usr/bin/bwrap"
    binds = {dest for _src, dest in _pairs(argv[: argv.index("--")], "--bind")}
    cache = tmp_path / "proj" / ".deps" / "cache"
    assert binds >= {str(tmp_path / "src"), str(tmp_path / "builds"), str(cache / "sccache")}
    env = p.env_overrides
    assert f"SCCACHE_DIR={env['SCCACHE_DIR']}" in argv
    if "SCCACHE_SERVER_UDS" in env:
        assert str(Path(env["SCCACHE_SERVER_UDS"]).parent) in binds
    assert p.build_argv[: argv.index("--")] == argv[: argv.index("--")]
    # another build root: another server (a namespace's server sees only what was bound when it started)
    other = plan(str(tmp_path / "elsewhere"))
    server = "SCCACHE_SERVER_UDS" if "SCCACHE_SERVER_UDS" in env else "SCCACHE_SERVER_PORT"
    assert other.env_overrides[server] != env[server]
    assert other.build_dir.name == p.build_dir.name, "the same flags: the same build dir name"
    with pytest.raises(BuildError, match="cannot be bound into the root"):
        plan("/usr/local/builds")


def _ctx(tmp_path: Path, uid: int, subuid: str, tools: tuple[str, ...]) -> RootfsContext:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in tools:
        (bin_dir / name).write_text("#!/bin/sh\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "subuid").write_text(subuid, encoding="utf-8")
    (tmp_path / "subgid").write_text(subuid, encoding="utf-8")
    return RootfsContext(
        cache_dir=tmp_path / "cache",
        env={"PATH": str(bin_dir)},
        uid=uid,
        runner="namespace",
        subid_files=(tmp_path / "subuid", tmp_path / "subgid"),
    )


def test_making_the_root_without_root_needs_uidmap_and_a_subordinate_range(tmp_path: Path) -> None:
    uid = 4242424  # no such user: the range is looked up by the uid's number
    everything = ("mmdebstrap", "newuidmap", "newgidmap")
    assert _can_make(_ctx(tmp_path, uid, f"{uid}:100000:65536\n", everything)) == "unshare"
    assert _can_make(_ctx(tmp_path, 0, "", ("mmdebstrap",))) == "root"
    with pytest.raises(ToolchainMissing) as info:
        _can_make(_ctx(tmp_path, uid, "someone:100000:65536\n", everything))
    assert str(tmp_path / "subuid") in info.value.what and str(tmp_path / "subgid") in info.value.what
    assert "usermod --add-subuids" in (info.value.next_step or "")
    for name in ("newgidmap", "newuidmap"):
        (tmp_path / "bin" / name).unlink()
    with pytest.raises(ToolchainMissing) as no_map:
        _can_make(_ctx(tmp_path, uid, f"{uid}:100000:65536\n", ("mmdebstrap",)))
    assert no_map.value.next_step == "apt-get install uidmap, then run the build again"
    if os.geteuid() != 0:
        mine = f"{os.geteuid()}:100000:65536\n"
        assert _can_make(_ctx(tmp_path, os.geteuid(), mine, everything)) == "unshare"


def test_the_mmdebstrap_command_without_root_is_unshare_mode(tmp_path: Path) -> None:
    pin = parse_rootfs_pin({"suite": "sid", "packages": PACKAGES})
    argv = mmdebstrap_argv(pin, "http://m/debian", tmp_path / "root", None, mode="unshare")
    assert argv[:2] == ["mmdebstrap", "--mode=unshare"]
    assert argv[2:] == mmdebstrap_argv(pin, "http://m/debian", tmp_path / "root", None)[2:]
