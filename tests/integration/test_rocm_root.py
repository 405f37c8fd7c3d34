"""The ROCm Debian root against stand-ins: ``mmdebstrap``, ``chroot``, ``apt-get``, ``mount``
and ``umount`` are small scripts on PATH that record their arguments, so making the root
once (and never using one made halfway), the probe's choice, and the mounts around a build
(unmounted also on failure and Ctrl-C) run on any machine, as any user."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from skippy.compile.backends import rocm_rootfs
from skippy.compile.backends.rocm_rootfs import (
    RootfsContext,
    finished,
    make_rootfs,
    parse_rootfs_pin,
    rootfs_home,
)
from skippy.compile.builder import BuildReport
from skippy.compile.cache import launcher_env, rootfs_launcher_env
from skippy.compile.fetched import MARKER
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.rootfs import Rootfs, mounted, runner_program
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, TreeInfo, probe_toolchain
from skippy.core.errors import BuildError, NetworkError, ToolchainMissing
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import (
    Collaborators,
    SessionOutcome,
    SessionRequest,
    SpotCheckRequest,
    run_build_session,
    session_ending,
)
from skippy.flows.gates import rootfs_gate, rootfs_spot_check
from tests.integration.test_build_toolchain import Host, fake_tool

pytestmark = pytest.mark.integration

PACKAGES = ["hipcc", "libamdhip64-dev", "libhipblas-dev", "librocblas-dev", "cmake", "ninja-build"]

_FAKE_MMDEBSTRAP = """#!/bin/sh
# a stand-in mmdebstrap: records its arguments, makes a root at its second-to-last argument
printf "%s\\n" "$*" >> "$ROOT_LOG"
prev=""; target=""
for a in "$@"; do target="$prev"; prev="$a"; done
mkdir -p "$target/usr/bin" "$target/var/lib/dpkg"
: > "$target/usr/bin/cmake"
if [ -n "$MMDEBSTRAP_FAIL" ]; then echo "E: Unable to locate package hipcc" >&2; exit 1; fi
"""

# a stand-in chroot: answers dpkg-query -W inside the root
_FAKE_CHROOT = """#!/bin/sh
printf "%s\\n" "chroot $*" >> "$ROOT_LOG"
for p in libamdhip64-dev libhipblas-dev librocblas-dev cmake ninja-build; do printf '%s\\t%s\\n' "$p" 6.4.3-1; done
[ -n "$CHROOT_NO_HIPCC" ] || printf 'hipcc\\t7.0.2-1\\n'
"""

_FAKE_APT = """#!/bin/sh
printf 'Site: http://mirror.example/debian\\nOrigin: Debian\\nLabel: Debian\\nComponent: main\\nRelease: bookworm\\n'
"""

# stand-in mount/umount: record; fail where asked
_FAKE_MOUNT = """#!/bin/sh
echo "mount $*" >> "$MOUNT_LOG"
case "$*" in *"$MOUNT_FAIL_AT"*) [ -n "$MOUNT_FAIL_AT" ] && exit 32 ;; esac
exit 0
"""
_FAKE_UMOUNT = """#!/bin/sh
echo "umount $*" >> "$MOUNT_LOG"
[ -n "$UMOUNT_FAIL" ] && exit 32
exit 0
"""


def _script(bin_dir: Path, name: str, text: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / name).write_text(text, encoding="utf-8")
    (bin_dir / name).chmod(0o755)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path / "host")
    for name in ("cmake", "ninja", "cc", "c++", "sccache"):
        h.tool(name)
    for name, text in (("mmdebstrap", _FAKE_MMDEBSTRAP), ("chroot", _FAKE_CHROOT), ("apt-get", _FAKE_APT)):
        _script(h.bin, name, text)
    return h


def _ctx(host: Host, uid: int = 0, **env: str) -> RootfsContext:
    base = {"PATH": f"{host.bin}:/usr/bin:/bin", "ROOT_LOG": str(host.root / "root.log")}
    return RootfsContext(cache_dir=host.root / "cache", env={**base, **env}, uid=uid, keyring=None)


def _calls(host: Host) -> list[str]:
    log = host.root / "root.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def _program(ctx: RootfsContext) -> str:
    return runner_program(ctx.runner, uid=ctx.uid, env=ctx.env, what=rocm_rootfs.WHAT)


PIN = parse_rootfs_pin({"suite": "sid", "packages": PACKAGES})


def test_the_root_is_made_once_and_reused(host: Host) -> None:
    home = rootfs_home(host.root / "cache", PIN)
    # leftovers of an interrupted run: a partial folder beside, and a home without its marker
    stale = home.with_name(home.name + ".partial-killed")
    (stale / "root" / "usr").mkdir(parents=True)
    (home / "root" / "usr" / "bin").mkdir(parents=True)
    (home / "root" / "usr" / "bin" / "cmake").touch()
    assert finished(home, PIN) is None, "a root without its marker is never used"
    root = make_rootfs(PIN, _ctx(host))
    assert root.path == home / "root" and not root.reused
    assert not stale.exists()
    assert [p.name for p in home.parent.iterdir() if ".partial-" in p.name] == []
    calls = _calls(host)
    assert len(calls) == 2 and calls[1].startswith(f"chroot {home.parent}")  # dpkg-query ran in the partial root
    assert calls[0].endswith("deb http://mirror.example/debian sid main"), "the system's Debian mirror"
    assert "--include=" + ",".join(PACKAGES) in calls[0]
    marker = json.loads((home / MARKER).read_text(encoding="utf-8"))
    assert marker["versions"]["hipcc"] == "7.0.2-1" and marker["suite"] == "sid"
    assert root.toolkit.startswith("rocm debian-root sid hip 6.4.3-1 ")
    again = make_rootfs(PIN, _ctx(host))
    assert again.reused and again.versions == root.versions
    assert len(_calls(host)) == 2, "reused: no second mmdebstrap"
    # a root of ours an older skippy left 0700 is opened to the other users' namespace runner
    home.chmod(0o700)
    assert make_rootfs(PIN, replace(_ctx(host), uid=os.geteuid())).reused
    assert home.stat().st_mode & 0o777 == 0o755
    # another pin is another root; a marker of another pin is not this root
    other = parse_rootfs_pin({"suite": "sid", "packages": [*PACKAGES, "git"]})
    assert finished(home, other) is None
    (home / MARKER).write_text(json.dumps({**marker, "packages": ["hipcc"]}), encoding="utf-8")
    assert finished(home, PIN) is None


def test_a_failed_mmdebstrap_leaves_no_root_and_says_what_next(host: Host) -> None:
    home = rootfs_home(host.root / "cache", PIN)
    with pytest.raises(NetworkError) as info:
        make_rootfs(PIN, _ctx(host, MMDEBSTRAP_FAIL="1"))
    err = info.value
    assert err.what == "mmdebstrap could not make the ROCm Debian root (sid)"
    assert "[tool.skippy.build.rocm_debian_root]" in (err.next_step or "")
    assert "Unable to locate package hipcc" in (err.details or "")
    assert not home.exists()
    assert finished(home, PIN) is None
    # the next run removes the half-made one and makes it
    assert len(list(home.parent.glob("*.partial-*"))) == 1
    root = make_rootfs(PIN, _ctx(host))
    assert root.path.is_dir() and list(home.parent.glob("*.partial-*")) == []


def test_a_package_missing_after_mmdebstrap_is_refused(host: Host) -> None:
    with pytest.raises(ToolchainMissing, match="lacks hipcc after mmdebstrap"):
        make_rootfs(PIN, _ctx(host, CHROOT_NO_HIPCC="1"))
    assert not rootfs_home(host.root / "cache", PIN).exists()


def test_not_root_or_no_mmdebstrap_name_the_way_out(host: Host) -> None:
    with pytest.raises(ToolchainMissing) as info:
        _program(replace(_ctx(host, uid=1000), runner="chroot"))
    assert "chroot runner needs root" in info.value.what
    assert "SKIPPY_ROOT_RUNNER=namespace" in (info.value.next_step or "")
    (host.bin / "mmdebstrap").unlink()
    with pytest.raises(ToolchainMissing) as none:
        make_rootfs(PIN, RootfsContext(cache_dir=host.root / "cache", env={"PATH": str(host.bin)}, uid=0))
    assert none.value.next_step == "apt-get install mmdebstrap, then run the build again"
    assert _calls(host) == []


# a stand-in bwrap: records its arguments; answers dpkg-query -W inside the root; the namespace check
_FAKE_BWRAP = """#!/bin/sh
printf "%s\\n" "bwrap $*" >> "$ROOT_LOG"
[ -n "$BWRAP_FAIL" ] && { echo "bwrap: setting up uid map: Permission denied" >&2; exit 1; }
case "$*" in
  *dpkg-query*)
    for p in hipcc libamdhip64-dev libhipblas-dev librocblas-dev cmake ninja-build; do
      printf '%s\\t%s\\n' "$p" 6.4.3-1
    done ;;
esac
exit 0
"""

# mmdebstrap's own way into files of the subordinate ids: run the command given
_FAKE_UNSHARE_HELPER = """[ "$1" = "--unshare-helper" ] && {
  shift; printf "%s\\n" "helper $*" >> "$ROOT_LOG"; [ -n "$HELPER_FAIL" ] && exit 25; exec "$@"
}
"""


def _rootless(host: Host, tmp_path: Path, subuid: str = "1000:100000:65536\n") -> RootfsContext:
    """Not root: the namespace runner, uidmap's programs and a subordinate range (files of the test)."""
    text = (host.bin / "mmdebstrap").read_text(encoding="utf-8")
    _script(host.bin, "mmdebstrap", text.replace("\n", "\n" + _FAKE_UNSHARE_HELPER, 1))
    for name, body in (("bwrap", _FAKE_BWRAP), ("newuidmap", "#!/bin/sh\n"), ("newgidmap", "#!/bin/sh\n")):
        _script(host.bin, name, body)
    subid = (tmp_path / "subuid", tmp_path / "subgid")
    for path in subid:
        path.write_text(subuid, encoding="utf-8")
    return replace(_ctx(host, uid=1000), runner="namespace", subid_files=subid)


def test_without_root_the_root_is_made_in_unshare_mode_and_read_in_a_namespace(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _rootless(host, tmp_path)
    home = rootfs_home(ctx.cache_dir, PIN)
    # a half-made root of an earlier run, of files the user cannot delete (the subordinate ids')
    stale = home.with_name(home.name + ".partial-killed")
    (stale / "root" / "usr").mkdir(parents=True)
    monkeypatch.setattr(rocm_rootfs, "remove_tree", lambda _folder: None)
    root = make_rootfs(PIN, ctx)
    assert not stale.exists(), "removed through mmdebstrap --unshare-helper"
    calls = _calls(host)
    assert calls[0].startswith("bwrap --unshare-user --uid 0 --gid 0 --ro-bind / / -- true"), "the namespace check"
    assert calls[1] == f"helper rm -rf -- {stale}"
    assert "--mode=unshare" in calls[2].split() and "--mode=root" not in calls[2]
    query = calls[3]
    assert query.startswith("bwrap --unshare-user --uid 0 --gid 0 ") and query.endswith(
        "dpkg-query -W -f=${Package}\\t${Version}\\n"
    )
    partial_root = query.split("--ro-bind ", 1)[1].split()[0].rsplit("/", 1)[0]
    assert ".partial-" in partial_root and f"--ro-bind {partial_root}/usr /usr" in query
    assert root.versions["hipcc"] == "6.4.3-1" and not root.reused
    assert home.stat().st_mode & 0o777 == 0o755, "other users (their namespace runner) can reach the root"
    # no subordinate range: the way to get one, and nothing was made
    other = _rootless(host, tmp_path, subuid="someone:100000:65536\n")
    with pytest.raises(ToolchainMissing) as info:
        make_rootfs(PIN, replace(other, cache_dir=tmp_path / "cache2"))
    assert "usermod --add-subuids" in (info.value.next_step or "")
    assert not (tmp_path / "cache2" / "rocm-root" / PIN.dirname).exists()


def test_a_half_made_root_that_cannot_be_removed_is_named_with_the_commands(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _rootless(host, tmp_path)
    ctx = replace(ctx, env={**ctx.env, "HELPER_FAIL": "1"})
    home = rootfs_home(ctx.cache_dir, PIN)
    stale = home.with_name(home.name + ".partial-killed")
    (stale / "root" / "usr").mkdir(parents=True)
    monkeypatch.setattr(rocm_rootfs, "remove_tree", lambda _folder: None)
    with pytest.raises(ToolchainMissing) as info:
        make_rootfs(PIN, ctx)
    err = info.value
    assert err.what == f"could not remove the half-made ROCm Debian root {stale}"
    assert f"mmdebstrap --unshare-helper rm -rf -- {stale}" in (err.next_step or "")
    assert stale.is_dir() and not home.exists()
    assert not any("--mode=unshare" in call for call in _calls(host)), "nothing was made over it"


def test_a_root_of_another_user_that_cannot_be_read_is_left_as_it_is(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = make_rootfs(PIN, _ctx(host))
    home = made.path.parent
    marker = (home / MARKER).read_bytes()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == home else real_access(path, mode))
    with pytest.raises(ToolchainMissing) as info:
        make_rootfs(PIN, replace(_ctx(host), uid=1000))
    err = info.value
    assert err.what == f"the ROCm Debian root {home} belongs to another user and cannot be read"
    assert f"chmod 755 {home}" in (err.next_step or "") and "cache_dir" in (err.next_step or "")
    assert (home / MARKER).read_bytes() == marker and (home / "root" / "usr" / "bin" / "cmake").exists()


def test_a_namespace_the_kernel_refuses_and_a_missing_bwrap_say_what_to_do(host: Host, tmp_path: Path) -> None:
    ctx = _rootless(host, tmp_path)
    with pytest.raises(ToolchainMissing) as info:
        _program(replace(ctx, env={**ctx.env, "BWRAP_FAIL": "1"}))
    err = info.value
    assert "cannot make a user namespace here" in err.what
    assert "user.max_user_namespaces" in (err.next_step or "") and "SKIPPY_ROOT_RUNNER=chroot" in (err.next_step or "")
    assert "setting up uid map: Permission denied" in (err.details or "")
    (host.bin / "bwrap").unlink()
    with pytest.raises(ToolchainMissing) as none:
        _program(replace(ctx, env={"PATH": str(host.bin)}))
    assert none.value.next_step == "apt-get install bubblewrap, then run the build again"


def _probe(host: Host, **env: str) -> object:
    table = {"build": {"rocm_debian_root": {"suite": "sid", "packages": PACKAGES}}, "cache_dir": "cache"}
    base = {"PATH": f"{host.bin}:/usr/bin:/bin", "ROOT_LOG": str(host.root / "root.log")}
    settings = Settings.from_table(host.root, table, {**base, **env})
    return probe_toolchain("rocm", settings, system="Linux", os_release="ID=debian\n", well_known_dirs=False)


def test_auto_takes_the_debian_root_without_a_system_rocm(host: Host) -> None:
    tc = _probe(host)
    assert isinstance(tc, Toolchain)
    assert tc.facts["rocm_toolkit"] == "debian-root"
    assert tc.facts["toolkit"].startswith("rocm debian-root sid hip 6.4.3-1 ")
    assert tc.rootfs is not None and tc.rootfs.env["HIP_PLATFORM"] == "amd"
    assert (tc.cmake.path, tc.ninja.path) == ("/usr/bin/cmake", "/usr/bin/ninja")
    # the host's sccache, copied into the root by its content, runs there (a path inside the root)
    assert tc.launcher is not None and tc.launcher.name == "sccache"
    assert tc.launcher.path.startswith("/opt/skippy/sccache-") and tc.launcher.path.endswith("/sccache")
    copied = tc.rootfs.host_path(tc.launcher.path)
    assert copied.read_bytes() == (host.bin / "sccache").read_bytes()
    assert any("auto: no complete system ROCm" in note for note in tc.notes)
    assert any(note.startswith("compiler cache inside the root: sccache") for note in tc.notes)
    # ccache does not go into the root; none means none
    for choice, note in (("ccache", "ccache does not run there"), ("none", "none chosen")):
        other = _probe(host, SKIPPY_COMPILER_CACHE=choice)
        assert isinstance(other, Toolchain) and other.launcher is None
        assert any(note in line for line in other.notes), other.notes
    assert tc.tool_versions()["deb:hipcc"]["version"] == "7.0.2-1"
    # the root compiles with its own compilers (the pinned packages' versions): the host's are not its tools
    assert "cc" not in tc.tool_versions() and "c++" not in tc.tool_versions()
    with pytest.raises(ToolchainMissing, match="needs `hipconfig`"):
        _probe(host, SKIPPY_ROCM_TOOLKIT="system")
    # a complete system ROCm wins under auto
    clang = host.root / "rocm" / "llvm" / "bin"
    fake_tool(clang, "clang++")
    fake_tool(host.bin, "hipconfig", {"-l": str(clang), "--path": str(host.root / "rocm")})
    system = _probe(host)
    assert isinstance(system, Toolchain) and system.rootfs is None
    assert system.launcher is not None
    forced = _probe(host, SKIPPY_ROCM_TOOLKIT="debian-root")
    assert isinstance(forced, Toolchain) and forced.rootfs is not None


def test_auto_with_neither_rocm_nor_mmdebstrap_says_both(host: Host) -> None:
    (host.bin / "mmdebstrap").unlink()
    with pytest.raises(ToolchainMissing) as info:
        _probe(host, PATH=str(host.bin))
    err = info.value
    assert err.what.startswith("the rocm backend needs `hipconfig`, which is not on PATH; and the Debian root ")
    assert "needs mmdebstrap" in err.what
    assert err.next_step == "apt-get install mmdebstrap, then run the build again"
    assert "install:" in (err.details or ""), "the system ROCm's install hints are kept"


# --- the mounts around a build --------------------------------------------------------------


def _rootfs(tmp_path: Path) -> Rootfs:
    path = tmp_path / "rootfs"
    path.mkdir()
    tool = Tool("cmake", "/usr/bin/cmake", "4")
    return Rootfs(path=path, program="chroot", env={"PATH": "/usr/bin"}, cmake=tool, ninja=tool, label="test")


def _mount_env(tmp_path: Path, **env: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    _script(bin_dir, "mount", _FAKE_MOUNT)
    _script(bin_dir, "umount", _FAKE_UMOUNT)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "MOUNT_LOG": str(tmp_path / "mount.log"), **env}


def _mount_log(tmp_path: Path) -> list[str]:
    return (tmp_path / "mount.log").read_text(encoding="utf-8").splitlines()


def test_mounted_binds_then_unmounts_in_reverse(tmp_path: Path) -> None:
    root = _rootfs(tmp_path)
    src, build = tmp_path / "src", tmp_path / "builds" / "rocm-1"
    src.mkdir()
    with mounted(root, (src, build), env=_mount_env(tmp_path)):
        assert build.is_dir(), "a new build dir is made before it is bound"
        assert (root.path / str(build).lstrip("/")).is_dir()
    log = _mount_log(tmp_path)
    targets = [str(root.path / "proc"), str(root.path / "dev"), str(root.path) + str(src), str(root.path) + str(build)]
    assert [line.split()[-1] for line in log[:4]] == targets
    assert log[4:] == [f"umount {t}" for t in reversed(targets)]


@pytest.mark.parametrize("error", [RuntimeError("the build failed"), KeyboardInterrupt()])
def test_mounted_unmounts_on_failure_and_ctrl_c(tmp_path: Path, error: BaseException) -> None:
    root = _rootfs(tmp_path)
    with pytest.raises(type(error)), mounted(root, (tmp_path,), env=_mount_env(tmp_path)):
        raise error
    log = _mount_log(tmp_path)
    assert sum(line.startswith("mount ") for line in log) == 3
    assert sum(line.startswith("umount ") for line in log) == 3


def test_a_mount_that_fails_unmounts_what_was_mounted(tmp_path: Path) -> None:
    root = _rootfs(tmp_path)
    env = _mount_env(tmp_path, MOUNT_FAIL_AT="--bind /dev")
    with pytest.raises(BuildError, match="could not mount") as info, mounted(root, (tmp_path,), env=env):
        pytest.fail("the body must not run")
    assert "as root" in (info.value.next_step or "")
    assert _mount_log(tmp_path)[-1] == f"umount {root.path / 'proc'}"


def test_an_unmount_that_fails_names_the_command(tmp_path: Path) -> None:
    root = _rootfs(tmp_path)
    warned: list[str] = []
    env = _mount_env(tmp_path, UMOUNT_FAIL="1")
    with (
        pytest.raises(BuildError, match="could not unmount 3") as info,
        mounted(root, (tmp_path,), env=env, log=warned.append),
    ):
        pass
    assert f"umount --lazy {root.path / 'proc'}" in (info.value.next_step or "")
    assert len(warned) == 3
    assert sum("--lazy" in line for line in _mount_log(tmp_path)) == 3, "a busy mount is detached lazily first"


# --- the gate that runs the binary inside the root ---------------------------------------------

# a stand-in chroot that runs "llama-server --version" as the root's glibc would (or not)
_FAKE_RUN_CHROOT = """#!/bin/sh
printf '%s\\n' "chroot $*" >> "$MOUNT_LOG"
if [ -n "$NO_GLIBC" ]; then
  echo "llama-server: /lib/x86_64-linux-gnu/libc.so.6: version GLIBC_2.43 not found" >&2; exit 1
fi
echo "ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected" >&2
echo "version: 1 (4df29be4f)" >&2
"""


def _gate_plan(tmp_path: Path, env: dict[str, str]) -> tuple[BuildPlan, BuildReport]:
    _script(tmp_path / "bin", "chroot", _FAKE_RUN_CHROOT)
    tool = Tool("cmake", "/usr/bin/cmake", "4")
    (tmp_path / "rootfs").mkdir()
    inside = Rootfs(
        path=tmp_path / "rootfs",
        program=str(tmp_path / "bin" / "chroot"),
        env={"PATH": "/usr/bin"},
        cmake=tool,
        ninja=Tool("ninja", "/usr/bin/ninja", "1"),
        label="debian-root sid (packages x)",
    )
    toolchain = Toolchain(backend="rocm", system="Linux", cmake=tool, ninja=inside.ninja, rootfs=inside)
    tree = TreeInfo(tmp_path / "src", frozenset(), frozenset({"C", "CXX", "HIP"}), "ggml-rpc-server")
    settings = Settings.from_table(tmp_path / "proj", {}, env)
    plan = plan_build(build_request("rocm", settings), settings, tree=tree, toolchain=toolchain, patched_sha="a" * 40)
    server = plan.build_dir / "bin" / "llama-server"
    report = BuildReport(
        backend="rocm",
        build_dir=plan.build_dir,
        configured=True,
        configure_reason="new",
        configure_seconds=1.0,
        build_seconds=1.0,
        compiled=1,
        steps=1,
        binaries={"llama-server": server},
        cache=None,
    )
    return plan, report


def test_the_root_gate_runs_the_binary_inside_the_root(tmp_path: Path) -> None:
    env = _mount_env(tmp_path)
    plan, report = _gate_plan(tmp_path, env)
    console = Console(env={}, stream=io.StringIO())
    init = rootfs_gate(plan, report, env, console)
    assert init == "ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected"
    log = _mount_log(tmp_path)
    run = next(line for line in log if line.startswith("chroot "))
    assert run.endswith(f"/usr/bin/env -i PATH=/usr/bin {report.binaries['llama-server']} --version")
    # it ran with the build dir mounted in, and everything was unmounted after
    assert log.index(run) == 3 and log[2].endswith(str(plan.build_dir))
    assert [line.split()[0] for line in log[4:]] == ["umount"] * 3
    with pytest.raises(BuildError, match="does not run inside debian-root sid") as info:
        rootfs_gate(plan, report, {**env, "NO_GLIBC": "1"}, console)
    assert "GLIBC_2.43 not found" in (info.value.details or "")
    assert _mount_log(tmp_path)[-1].startswith("umount "), "unmounted after the failure too"
    # why the spot check is not run on the host: the root's name, and what the ROCm backend says it links
    why = rootfs_spot_check(plan)
    assert "inside a root file system (debian-root sid" in why and "(a newer glibc, the ROCm runtime)" in why


# --- a whole build session inside the root, with stand-ins for every program ---------------------

# a stand-in chroot: answers dpkg-query, and plays cmake, ninja, sccache and llama-server inside the root
_FAKE_SESSION_CHROOT = """#!{python}
import json, os, pathlib, sys
argv = sys.argv[1:]
with open(os.environ["MOUNT_LOG"], "a") as log:
    log.write("chroot " + " ".join(argv) + "\\n")
root, rest = argv[0], argv[1:]
if rest[:2] == ["/usr/bin/env", "-i"]:
    rest = rest[2:]
    while rest and "=" in rest[0] and not rest[0].startswith("/"):
        rest = rest[1:]
tool = rest[0]
if tool == "dpkg-query":
    for p in ("hipcc", "libamdhip64-dev", "libhipblas-dev", "librocblas-dev", "cmake", "ninja-build"):
        print(p + "\\t6.4.3-1")
elif tool == "/usr/bin/cmake":
    build = pathlib.Path(rest[rest.index("-B") + 1])
    lines = ["CMAKE_GENERATOR:INTERNAL=Ninja", "CMAKE_HOME_DIRECTORY:INTERNAL=" + rest[rest.index("-S") + 1],
             "CMAKE_COMMAND:INTERNAL=/usr/bin/cmake"]
    lines += [a[2:].replace("=", ":STRING=", 1) for a in rest if a.startswith("-D")]
    (build / "CMakeCache.txt").write_text("\\n".join(lines) + "\\n")
    (build / "build.ninja").write_text("# fake\\n")
elif tool == "/usr/bin/ninja":
    if os.environ.get("NINJA_FAIL"):
        sys.exit("FAILED: ggml-hip/mean.cu.o")
    build = pathlib.Path(rest[rest.index("-C") + 1])
    (build / "bin").mkdir(exist_ok=True)
    for target in rest[rest.index("-C") + 2:]:
        (build / "bin" / target).write_text("ggml_backend_cuda_reg ggml_backend_rpc_reg")
        print("[1/1] Building HIP object " + target + ".o")
elif tool.endswith("/sccache") and rest[1:] == ["--show-stats", "--stats-format=json"]:
    print(json.dumps({{"stats": {{"cache_hits": {{"counts": {{"HIP": 2}}}}, "cache_misses": {{"counts": {{}}}}}}}}))
elif tool.endswith("/sccache") and rest[1:] in (["--zero-stats"], ["--stop-server"]):
    pass
elif tool.endswith("/llama-server") and rest[1:] == ["--version"]:
    print("ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected", file=sys.stderr)
    print("version: 1 (4df29be4f)", file=sys.stderr)
else:
    sys.exit("unexpected: " + " ".join(rest))
"""


def _session(host: Host, tmp_path: Path, **env: str) -> tuple[Settings, Callable[..., object], list[SpotCheckRequest]]:
    """A build-rocm session whose every program is a stand-in (the root's, mount's, chroot's)."""
    env = _mount_env(tmp_path, **env)
    _script(host.bin, "chroot", _FAKE_SESSION_CHROOT.format(python=sys.executable))
    src = tmp_path / "src"
    (src / "tools" / "rpc").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text('project(llama C CXX)\noption(GGML_HIP "" OFF)\n', encoding="utf-8")
    (src / "tools" / "rpc" / "CMakeLists.txt").write_text("set(TARGET ggml-rpc-server)\n", encoding="utf-8")

    class Prepared:
        patched_sha, upstream_sha, queue_digest, workdir = "b" * 40, "c" * 40, "d" * 64, src

    checked: list[SpotCheckRequest] = []
    table = {"build": {"rocm_debian_root": {"suite": "sid", "packages": PACKAGES}}, "cache_dir": "cache"}
    path = f"{host.bin}:{env['PATH']}"
    settings = Settings.from_table(host.root, table, {**env, "PATH": path, "ROOT_LOG": str(host.root / "root.log")})

    def run(out: io.StringIO | None = None) -> object:
        return run_build_session(
            SessionRequest(build_request("rocm", settings, defines={"AMDGPU_TARGETS": "gfx1100"})),
            settings,
            Console(env={}, stream=out or io.StringIO()),
            Collaborators(
                prepare=lambda _s, _c, _b: Prepared(), spot_check=lambda _s, request, _c: checked.append(request)
            ),
        )

    return settings, run, checked


def _steps(tmp_path: Path) -> list[str]:
    """The mount log as steps: ``mount``/``umount`` and ``chroot <program inside> <args>``."""
    out = []
    for line in _mount_log(tmp_path):
        words = line.split()
        if words[0] != "chroot":
            out.append(words[0])
        elif "dpkg-query" not in line:
            inside = words[words.index("-i") + 1 :] if "-i" in words else words[2:]
            program = [w for w in inside if "=" not in w or w.startswith("/")]
            out.append(" ".join(["chroot", program[0].rsplit("/", 1)[-1], *program[1:2]]))
    return out


def test_a_build_session_runs_inside_the_root_with_its_own_cache_server(host: Host, tmp_path: Path) -> None:
    settings, run, checked = _session(host, tmp_path)
    out = io.StringIO()
    outcome = run(out)
    assert isinstance(outcome, SessionOutcome)
    build = outcome.build
    assert build is not None and build.toolkit is not None
    # the binaries run only inside the root: the line that says how to run them says so
    ending = session_ending(outcome, settings)
    run_lines = [line for line in ending.tail if line.startswith("run:")]
    assert ("artifact gate", "pass") in [(p.name, p.verdict) for p in ending.proofs]
    assert ("runs in the root", "pass") in [(p.name, p.verdict) for p in ending.proofs]
    assert {p.verdict for p in ending.proofs if p.name in ("chat answer", "fingerprint", "RPC")} == {"not run"}
    assert len(run_lines) == 1 and "inside the root only" in run_lines[0], run_lines
    assert f"chroot {outcome_root_path(settings)} {build.binaries['llama-server']} --model" in run_lines[0]
    assert build.toolkit.startswith("rocm debian-root sid hip 6.4.3-1 ")
    assert build.compiled == 2
    # the cache's figures were read inside the root, from its local directory
    assert build.cache is not None and (build.cache.hits, build.cache.misses) == (2, 0)
    assert build.cache.storage == "local directory"
    assert checked == [], "not spot-checked on the host"
    # the root's own server: the cache's local directory, a socket (or a loopback port) not the host's
    inside_env = rootfs_launcher_env(settings.cache_dir, outcome_root_tag(settings))
    server_var = "SCCACHE_SERVER_UDS" if "SCCACHE_SERVER_UDS" in inside_env else "SCCACHE_SERVER_PORT"
    host_env = launcher_env("sccache", settings.cache_dir)
    assert inside_env[server_var] != host_env.get(server_var)
    bound = 6 if server_var == "SCCACHE_SERVER_UDS" else 5  # the socket's folder is bound in too
    # mount -> claim (a stale server stopped, this build's started) -> configure -> zero -> build
    # -> stats -> stop -> unmount; then the gate with the build dir
    assert _steps(tmp_path) == [
        *["mount"] * bound,
        "chroot sccache --stop-server",
        "chroot sccache --zero-stats",
        "chroot cmake -S",
        "chroot sccache --zero-stats",
        "chroot ninja -C",
        "chroot sccache --show-stats",
        "chroot sccache --stop-server",
        *["umount"] * bound,
        *["mount"] * 3,
        "chroot llama-server --version",
        *["umount"] * 3,
    ]
    log = _mount_log(tmp_path)
    root = settings.cache_dir / "rocm-root"
    assert all(str(root) in line for line in log if line.startswith(("mount", "umount")) and "proc" in line)
    # the cache directory is bound in at its own path
    mounts = [line for line in log if line.startswith("mount ")]
    assert mounts[4].split()[-1].endswith(str(settings.cache_dir / "sccache"))
    # every sccache call runs inside, told the root's server (never the host's) and the base directories
    calls = [line for line in log if line.startswith("chroot") and "/sccache --" in line]
    assert len(calls) == 5
    for call in calls:
        assert f" {server_var}={inside_env[server_var]} " in call
        assert f"SCCACHE_DIR={settings.cache_dir / 'sccache'} " in call
        assert "SCCACHE_BASEDIRS=" in call


def outcome_root_path(settings: Settings) -> Path:
    """The one root the stand-in mmdebstrap made under ``settings``' cache."""
    (root,) = (settings.cache_dir / "rocm-root").glob("sid-*/root")
    return root


def outcome_root_tag(settings: Settings) -> str:
    """The server tag of the one root the stand-in mmdebstrap made under ``settings``' cache."""
    (root,) = (settings.cache_dir / "rocm-root").glob("sid-*/root")
    return _root_at(root).server_tag


def _root_at(path: Path) -> Rootfs:
    return Rootfs(path=path, program="chroot", env={}, cmake=_tool(), ninja=_tool(), label="x")


def test_a_failed_build_inside_the_root_stops_its_cache_server_before_unmounting(host: Host, tmp_path: Path) -> None:
    _, run, _ = _session(host, tmp_path, NINJA_FAIL="1")
    with pytest.raises(BuildError, match="the build failed"):
        run()
    steps = _steps(tmp_path)
    first_umount = steps.index("umount")
    assert steps[first_umount - 2 : first_umount] == ["chroot ninja -C", "chroot sccache --stop-server"]
    assert steps[first_umount:] == ["umount"] * (len(steps) - first_umount), "nothing ran inside after"


def test_the_roots_server_is_not_the_hosts(tmp_path: Path) -> None:
    host_env = launcher_env("sccache", tmp_path / "cache")
    one = rootfs_launcher_env(tmp_path / "cache", _rootfs(tmp_path).server_tag)
    assert one["SCCACHE_DIR"] == host_env["SCCACHE_DIR"], "the same objects"
    assert one.get("SCCACHE_SERVER_UDS") != host_env.get("SCCACHE_SERVER_UDS")
    long = Path("/" + "x" * 120)  # too long for a Unix socket: loopback ports, the root's another one
    assert rootfs_launcher_env(long, "t")["SCCACHE_SERVER_PORT"] != launcher_env("sccache", long)["SCCACHE_SERVER_PORT"]
    assert rootfs_launcher_env(tmp_path / "cache", _root_at(tmp_path / "other").server_tag) != one, "a server per root"
    short = rootfs_launcher_env(Path("/c"), "t")
    assert (
        short["SCCACHE_SERVER_UDS"]
        == "/c/sccache-root/t.sock"
        != launcher_env("sccache", Path("/c"))["SCCACHE_SERVER_UDS"]
    )


def _tool() -> Tool:
    return Tool("cmake", "/usr/bin/cmake", "4")


# --- SIGTERM while the mounts are up ------------------------------------------------------------

_SIGTERM_CHILD = """
import sys, time
from pathlib import Path
from skippy.compile.rootfs import Rootfs
from skippy.compile.tool import Tool
from skippy.compile.rootfs import mounted
tool = Tool("cmake", "/usr/bin/cmake", "4")
root = Rootfs(path=Path(sys.argv[1]), program="chroot", env={}, cmake=tool, ninja=tool, label="test")
env = {"PATH": sys.argv[2], "MOUNT_LOG": sys.argv[3]}
try:
    with mounted(root, (Path(sys.argv[4]),), env=env):
        print("mounted", flush=True)
        time.sleep(60)
finally:
    print("cleaned up", flush=True)
"""


def test_sigterm_while_mounted_unmounts_then_exits_143(tmp_path: Path) -> None:
    root = _rootfs(tmp_path)
    env = _mount_env(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_CHILD, str(root.path), env["PATH"], env["MOUNT_LOG"], str(tmp_path / "w")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "mounted"
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 128 + signal.SIGTERM
    assert "cleaned up" in out
    log = _mount_log(tmp_path)
    assert sum(line.startswith("mount ") for line in log) == 3
    assert sum(line.startswith("umount ") for line in log) == 3, "every mount was unmounted"


def test_mounted_restores_the_previous_sigterm_handler(tmp_path: Path) -> None:
    root = _rootfs(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    with mounted(root, (tmp_path,), env=_mount_env(tmp_path)):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
