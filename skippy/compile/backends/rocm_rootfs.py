"""ROCm without ROCm installed: a Debian root file system with Debian's own ROCm packages.

llama.cpp needs ROCm >= 6.1; Debian 12 ships HIP 5.2 and trixie 5.7, while Debian sid
carries ROCm 6.4 (hipcc, libamdhip64-dev, librocblas-dev, libhipblas-dev, rocm-cmake).
:func:`make_rootfs` builds a root file system of the suite and packages pinned in
``[tool.skippy.build.rocm_debian_root]`` with ``mmdebstrap``, once, under the project
cache (``<cache>/rocm-root/<suite>-<pin digest>/root``), from the Debian mirror the
system's apt already uses (or the pin's ``snapshot`` URL, passed through as the
mirror).  The configure and the build then run inside it
(:class:`~skippy.compile.rootfs.Rootfs`, :mod:`skippy.compile.rootfs`), by one of
two runners (``[tool.skippy.build] root_runner`` / ``SKIPPY_ROOT_RUNNER``):

* ``chroot`` (the default for root): the work folders mounted into the root around the build;
* ``namespace`` (the default for everyone else): ``bwrap`` in an unprivileged user
  namespace, the root's system folders bound read-only and the work folders at their own
  paths, nothing mounted on the host.  Without root the root itself is made with
  ``mmdebstrap --mode=unshare``, which needs ``newuidmap`` (Debian's ``uidmap``) and a
  subordinate id range for the user in ``/etc/subuid`` and ``/etc/subgid``; its files
  belong to that range, so leftovers are removed through ``mmdebstrap --unshare-helper``.

Details that matter:

* the mirror's sid ``InRelease`` may be past its Valid-Until date:
  ``Acquire::Check-Valid-Until "false"``;
* rocBLAS's GPU kernels (2.9 GB) are not needed to build: a dpkg ``path-exclude``;
* sid moves: the versions of every package in the root (``dpkg-query -W`` inside) are
  recorded in its marker, and their digest names the toolkit (hence the build dir);
* a root made halfway is never used: it is made in a temporary folder beside, the
  ``complete.json`` marker is written last, and the folder is renamed into place;
  leftovers of an interrupted run are removed by the next one (never through a mount).

``mmdebstrap --mode=root`` and ``chroot`` need root; ``--mode=unshare`` and ``bwrap``
need user namespaces the kernel lets unprivileged users make.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.compile.backends.base import resolve_choice
from skippy.compile.backends.debian import DEBIAN_KEYRING, present_keyring, sources_line, system_mirror
from skippy.compile.fetched import fetch_once, read_marker
from skippy.compile.rootfs import Rootfs, remove_tree, runner_program, runner_rootfs, unmount_under
from skippy.compile.tool import Tool
from skippy.core import proc
from skippy.core.errors import (
    CommandError,
    Interrupted,
    NetworkError,
    SettingsError,
    SkippyError,
    TerminatedError,
    ToolchainMissing,
)
from skippy.core.proc import Terminated, sigterm_unwinds

#: ``[tool.skippy.build] rocm_toolkit`` / ``SKIPPY_ROCM_TOOLKIT`` values
TOOLKIT_CHOICES: Final = ("auto", "system", "debian-root")
TOOLKIT_ENV: Final = "SKIPPY_ROCM_TOOLKIT"
TOOLKIT_KEY: Final = "rocm_toolkit"
PIN_TABLE: Final = "rocm_debian_root"
#: the host's files naming each user's subordinate ids (``mmdebstrap --mode=unshare`` maps them)
SUBID_FILES: Final = (Path("/etc/subuid"), Path("/etc/subgid"))

#: what a root must hold to build the tree (the pin may add more)
REQUIRED_PACKAGES: Final = ("hipcc", "libamdhip64-dev", "libhipblas-dev", "librocblas-dev", "cmake", "ninja-build")

#: rocBLAS's GPU kernels: 2.9 GB of the root, only needed to run
ROCBLAS_KERNELS: Final = "/usr/lib/*/rocblas/*/library/*"

#: what the runners' messages call it
WHAT: Final = "the ROCm Debian root"

#: the environment inside the root: nothing of the host's
INSIDE_ENV: Final[Mapping[str, str]] = MappingProxyType(
    {"PATH": "/usr/bin:/bin", "HIP_PLATFORM": "amd", "HOME": "/root", "LC_ALL": "C.UTF-8"}
)

#: seconds mmdebstrap may take (2.5 minutes measured, about 1 GB of packages)
MMDEBSTRAP_TIMEOUT: Final = 3600.0

_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9.+-]*")
_SNAPSHOT_RE: Final = re.compile(r"(https?|file)://\S+")


def _bad_pin(problem: str) -> SettingsError:
    return SettingsError(
        f"pyproject.toml [tool.skippy.build.{PIN_TABLE}]: {problem}",
        untouched="everything: nothing was downloaded or built",
        next_step=f'give it as suite = "sid", packages = ["{REQUIRED_PACKAGES[0]}", ...] (at least '
        f'{", ".join(REQUIRED_PACKAGES)}) and optionally snapshot = "<URL of a dated Debian snapshot>"',
    )


@dataclass(frozen=True)
class RootfsPin:
    suite: str
    packages: tuple[str, ...]
    #: a dated snapshot of the archive, used as the mirror (None: the system's Debian mirror)
    snapshot: str | None = None

    @property
    def digest(self) -> str:
        """A short name for the pin (the root's folder follows it)."""
        blob = json.dumps([self.suite, sorted(self.packages), self.snapshot])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def dirname(self) -> str:
        return f"{self.suite}-{self.digest}"


def parse_rootfs_pin(table: object) -> RootfsPin:
    """``[tool.skippy.build.rocm_debian_root]`` -> the pin."""
    if not isinstance(table, Mapping) or not table:
        raise _bad_pin("missing (the Debian root needs a suite and its packages)")
    unknown = sorted(set(table) - {"suite", "packages", "snapshot"})
    if unknown:
        raise _bad_pin(f"unknown key(s) {', '.join(unknown)}")
    suite, packages, snapshot = table.get("suite"), table.get("packages"), table.get("snapshot")
    if not isinstance(suite, str) or not _NAME_RE.fullmatch(suite):
        raise _bad_pin(f"suite {suite!r} is not a Debian suite name")
    if not isinstance(packages, list) or not packages:
        raise _bad_pin("packages must be a non-empty list of Debian package names")
    for name in packages:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise _bad_pin(f"package {name!r} is not a Debian package name")
    missing = [name for name in REQUIRED_PACKAGES if name not in packages]
    if missing:
        raise _bad_pin(f"packages lacks {', '.join(missing)} (needed to build the tree)")
    if snapshot is not None and (not isinstance(snapshot, str) or not _SNAPSHOT_RE.fullmatch(snapshot)):
        raise _bad_pin(f"snapshot {snapshot!r} is not a URL (http://, https:// or file://) of an archive snapshot")
    return RootfsPin(suite=suite, packages=tuple(dict.fromkeys(packages)), snapshot=snapshot)


def resolve_toolkit_choice(table: Mapping[str, object], env: Mapping[str, str]) -> str:
    """``SKIPPY_ROCM_TOOLKIT``, else ``[tool.skippy.build] rocm_toolkit``, else ``auto``."""
    return resolve_choice(
        table, env, key=TOOLKIT_KEY, env_var=TOOLKIT_ENV, choices=TOOLKIT_CHOICES, what="ROCm toolkit"
    )


def mmdebstrap_argv(
    pin: RootfsPin, mirror: str, target: Path, keyring: Path | None, *, mode: str = "root"
) -> list[str]:
    """The one ``mmdebstrap`` command that makes the root at ``target`` (``mode``: ``root``
    as root, ``unshare`` without)."""
    return [
        "mmdebstrap",
        f"--mode={mode}",
        "--variant=apt",
        '--aptopt=Acquire::Check-Valid-Until "false"',
        '--aptopt=Acquire::Retries "3"',
        f"--dpkgopt=path-exclude={ROCBLAS_KERNELS}",
        f"--include={','.join(pin.packages)}",
        pin.suite,
        str(target),
        sources_line(mirror, pin.suite, keyring).rstrip("\n"),
    ]


def parse_package_versions(text: str) -> dict[str, str]:
    """``dpkg-query -W -f '${Package}\\t${Version}\\n'`` -> {package: version}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, version = line.strip().partition("\t")
        if sep and name and version:
            out[name] = version
    return dict(sorted(out.items()))


def versions_digest(versions: Mapping[str, str]) -> str:
    """A short name for one set of installed versions (another set: another build dir)."""
    blob = "\n".join(f"{name}={version}" for name, version in sorted(versions.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


DPKG_QUERY: Final = ("dpkg-query", "-W", "-f=${Package}\\t${Version}\\n")


# --- the root -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DebianRootfs:
    """A finished root: ``path`` is the file system, ``versions`` every package in it."""

    path: Path
    pin: RootfsPin
    versions: Mapping[str, str]
    seconds: float = 0.0
    reused: bool = False

    @property
    def digest(self) -> str:
        return versions_digest(self.versions)

    @property
    def label(self) -> str:
        return f"debian-root {self.pin.suite} (packages {self.digest})"

    @property
    def toolkit(self) -> str:
        """The toolchain fact that names the build dir and goes into the build report."""
        return f"rocm debian-root {self.pin.suite} hip {self.versions.get('libamdhip64-dev', '?')} {self.digest}"

    def rootfs(self, program: str, runner: str = "chroot", launchers: Path | None = None) -> Rootfs:
        """The root as the plan runs commands in it: by ``runner`` with ``program`` (chroot
        or bwrap); a namespace runner binds ``launchers`` (made here) read-only."""
        cmake = Tool("cmake", "/usr/bin/cmake", f"cmake {self.versions.get('cmake', '?')} ({self.label})")
        ninja = Tool("ninja", "/usr/bin/ninja", f"ninja {self.versions.get('ninja-build', '?')} ({self.label})")
        return runner_rootfs(
            self.path, program, runner, env=INSIDE_ENV, launchers=launchers, cmake=cmake, ninja=ninja, label=self.label
        )

    def pinned_tools(self) -> tuple[Tool, ...]:
        """The pinned packages' versions as tools: they go into the build stamp."""
        return tuple(Tool(f"deb:{name}", str(self.path), self.versions.get(name, "?")) for name in self.pin.packages)


@dataclass(frozen=True)
class RootfsContext:
    cache_dir: Path
    env: Mapping[str, str] = field(repr=False)
    #: the effective user (chroot and mmdebstrap --mode=root need 0)
    uid: int = field(default_factory=os.geteuid)
    #: how commands run in the root (:func:`skippy.compile.rootfs.resolve_runner`)
    runner: str = "chroot"
    #: the subordinate id files (tests pass their own)
    subid_files: tuple[Path, ...] = SUBID_FILES
    lock_timeout: float = 3600.0
    keyring: Path | None = DEBIAN_KEYRING
    log: Callable[[str], None] = field(default=lambda _line: None, repr=False)


def rootfs_home(cache_dir: Path, pin: RootfsPin) -> Path:
    return cache_dir / "rocm-root" / pin.dirname


def launchers_home(cache_dir: Path) -> Path:
    """Where launchers copied for a namespace runner live (the root may not be writable)."""
    return cache_dir / "rocm-root" / "launchers"


def _record(pin: RootfsPin, versions: Mapping[str, str]) -> dict[str, object]:
    return {"suite": pin.suite, "packages": list(pin.packages), "snapshot": pin.snapshot, "versions": dict(versions)}


def _done(home: Path, pin: RootfsPin, record: Mapping[str, object]) -> DebianRootfs | None:
    versions = record.get("versions")
    if not isinstance(versions, dict) or dict(record) != _record(pin, versions):
        return None
    if any(name not in versions for name in pin.packages) or not (home / "root" / "usr" / "bin" / "cmake").exists():
        return None
    return DebianRootfs(home / "root", pin, MappingProxyType(dict(versions)), reused=True)


def finished(home: Path, pin: RootfsPin) -> DebianRootfs | None:
    """The finished root of exactly this pin at ``home``, or None (absent, halfway, another pin)."""
    record = read_marker(home)
    return _done(home, pin, record) if record is not None else None


def make_rootfs(pin: RootfsPin, ctx: RootfsContext) -> DebianRootfs:
    """The pinned root under the project cache: reused when finished, else made."""
    home = rootfs_home(ctx.cache_dir, pin)
    if home.exists() and not os.access(home, os.R_OK | os.X_OK):
        raise ToolchainMissing(
            f"the ROCm Debian root {home} belongs to another user and cannot be read",
            untouched=f"{home}: nothing was changed",
            next_step=f"have its owner run chmod 755 {home}, or set [tool.skippy] cache_dir to a folder of your own",
        )
    ways: dict[str, str] = {}

    def check() -> None:
        ways.update(
            mode=_can_make(ctx),
            program=runner_program(ctx.runner, uid=ctx.uid, env=ctx.env, what=WHAT),
            mirror=_mirror(pin, ctx),
        )

    started = time.monotonic()
    root, made = fetch_once(
        home,
        done=lambda found, record: _done(found, pin, record),
        make=lambda folder: _make_into(folder, pin, ctx, **ways),
        what="making the ROCm Debian root",
        timeout=ctx.lock_timeout,
        remove=lambda folder: _remove(folder, ctx),
        check=check,
    )
    if made:
        took = time.monotonic() - started
        ctx.log(f"made the ROCm Debian root in {took:.0f} s: {root.path}")
        root = replace(root, reused=False, seconds=took)
    _readable_by_all(home, ctx)
    return root


def _readable_by_all(home: Path, ctx: RootfsContext) -> None:
    """A root of ours made 0700 (mkdtemp's mode, before roots were made 0755) opened to the
    other users, whose namespace runner reads it."""
    info = home.stat()
    if info.st_uid == ctx.uid and info.st_mode & 0o055 != 0o055:
        home.chmod(0o755)


def _subid_ranges(ctx: RootfsContext) -> list[Path]:
    """The subordinate id files with no range for the effective user (by name or uid)."""
    try:
        names = {str(ctx.uid), pwd.getpwuid(ctx.uid).pw_name}
    except KeyError:
        names = {str(ctx.uid)}
    lacking: list[Path] = []
    for path in ctx.subid_files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            lines = []
        if not any(line.split(":", 1)[0] in names for line in lines if line.count(":") == 2):
            lacking.append(path)
    return lacking


def _can_make(ctx: RootfsContext) -> str:
    """mmdebstrap's mode (``root`` as root, else ``unshare``), or ToolchainMissing naming what
    is missing and the next command."""
    untouched = "everything: nothing was downloaded or built"
    if proc.which("mmdebstrap", ctx.env) is None:
        raise ToolchainMissing(
            "the ROCm Debian root needs mmdebstrap, which is not on PATH",
            untouched=untouched,
            next_step="apt-get install mmdebstrap, then run the build again",
        )
    if ctx.uid == 0:
        return "root"
    if proc.which("newuidmap", ctx.env) is None or proc.which("newgidmap", ctx.env) is None:
        raise ToolchainMissing(
            "making the ROCm Debian root without root (mmdebstrap --mode=unshare) needs newuidmap and newgidmap",
            untouched=untouched,
            next_step="apt-get install uidmap, then run the build again",
        )
    lacking = _subid_ranges(ctx)
    if lacking:
        raise ToolchainMissing(
            "making the ROCm Debian root without root (mmdebstrap --mode=unshare) needs a subordinate id range "
            f"for this user in {' and '.join(map(str, lacking))}",
            untouched=untouched,
            next_step="as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 <user>, then run "
            "the build again (or make the root once as root: it is shared through the cache dir)",
        )
    return "unshare"


def _mirror(pin: RootfsPin, ctx: RootfsContext) -> str:
    if pin.snapshot:
        return pin.snapshot
    mirror = system_mirror(ctx.env)
    if mirror is None:
        raise ToolchainMissing(
            "the ROCm Debian root needs a Debian mirror, and the system's apt names none",
            untouched="everything: nothing was downloaded or built",
            next_step=f'set snapshot = "<URL of a Debian archive>" in [tool.skippy.build.{PIN_TABLE}], or install '
            f"ROCm >= 6.1 and set {TOOLKIT_ENV}=system",
        )
    return mirror


def _remove(folder: Path, ctx: RootfsContext) -> None:
    """A half-made root removed; one made by ``--mode=unshare`` belongs to the user's
    subordinate ids, so what the user cannot delete goes through ``mmdebstrap --unshare-helper``
    (which in turn cannot unlink from the user's own folders: the user removes what is left).
    Measured: the user's ``rm`` alone leaves the root's files; helper, then user, removes all."""
    remove_tree(folder)
    if folder.exists() and ctx.uid != 0:
        proc.run(
            ["mmdebstrap", "--unshare-helper", "rm", "-rf", "--", str(folder)],
            env=ctx.env,
            check=False,
            timeout=600,
        )
        remove_tree(folder)
    if folder.exists():
        raise ToolchainMissing(
            f"could not remove the half-made ROCm Debian root {folder}",
            untouched="the system; nothing was downloaded or built",
            next_step=f"remove it (mmdebstrap --unshare-helper rm -rf -- {folder}; then rm -rf {folder}), and run "
            "the build again",
        )


def _interrupted(partial: Path, ctx: RootfsContext, *, terminated: bool) -> Interrupted:
    """mmdebstrap was stopped by Ctrl-C or SIGTERM: unmount what it left mounted in the half-made
    root and remove that root, and say what was cleaned (or what is left, with the commands)."""
    rerun = "run the build again (nox -s build-rocm)"
    unmounted, failures = unmount_under(partial, ctx.env)
    cleaned = [f"unmounted {len(unmounted)} mount(s) it left ({', '.join(map(str, unmounted))})"] if unmounted else []
    left, next_step = None, rerun
    if failures:
        left = f"{partial}, with mount(s) that would not come off: " + "; ".join(failures)
        next_step = "; ".join(f"umount --lazy {line.split(':', 1)[0]}" for line in failures) + f", then {rerun}"
    else:
        try:
            _remove(partial, ctx)
            cleaned.append(f"removed the half-made root {partial}")
        except SkippyError as exc:
            left, next_step = f"{partial} ({exc.what})", f"{exc.next_step}" if exc.next_step else rerun
    what = f"{'SIGTERM' if terminated else 'Ctrl-C (SIGINT)'} while mmdebstrap made the ROCm Debian root: "
    what += "mmdebstrap was stopped" + "".join(f", {step}" for step in cleaned)
    # SIGTERM's exit code is what the shell reports for a process SIGTERM ended
    return (TerminatedError if terminated else Interrupted)(
        what + (f"; left: {left}" if left else ""),
        untouched="the system and the finished roots in the cache" + ("" if left else "; nothing half-made is left"),
        next_step=next_step,
    )


def _make_into(
    folder: Path, pin: RootfsPin, ctx: RootfsContext, *, mode: str, program: str, mirror: str
) -> Mapping[str, object]:
    """mmdebstrap makes the root in ``folder``/root; the versions of its packages are read inside."""
    keyring = present_keyring(ctx.keyring)
    ctx.log(
        f"making the ROCm Debian root ({pin.suite}: {', '.join(pin.packages)}) with mmdebstrap --mode={mode}; minutes"
    )
    target = folder / "root"
    try:
        # SIGTERM unwinds as Ctrl-C does: mmdebstrap is stopped and what it left is cleaned up
        with sigterm_unwinds():
            proc.run(
                mmdebstrap_argv(pin, mirror, target, keyring, mode=mode),
                env=ctx.env,
                timeout=MMDEBSTRAP_TIMEOUT,
                on_line=None,
                what=f"mmdebstrap --mode={mode} (the ROCm Debian root)",
            )
    except (KeyboardInterrupt, Terminated) as exc:
        raise _interrupted(folder, ctx, terminated=isinstance(exc, Terminated)) from None
    except CommandError as exc:
        raise NetworkError(
            f"mmdebstrap could not make the ROCm Debian root ({pin.suite})",
            untouched=f"the system's apt; the half-made root in {folder} is removed by the next run",
            next_step=f"check that the mirror answers and that suite {pin.suite} has every package in "
            f"[tool.skippy.build.{PIN_TABLE}], then run the build again",
            details=exc.details,
        ) from exc
    inside = runner_rootfs(target, program, ctx.runner, env=INSIDE_ENV)
    query = proc.run(inside.wrap(DPKG_QUERY), env=ctx.env, timeout=120, what="dpkg-query in the root")
    versions = parse_package_versions(query.stdout)
    missing = [name for name in pin.packages if name not in versions]
    if missing:
        raise ToolchainMissing(
            f"the ROCm Debian root lacks {', '.join(missing)} after mmdebstrap",
            untouched=f"the system; the half-made root in {folder} is removed by the next run",
            next_step=f"check the package names in [tool.skippy.build.{PIN_TABLE}]",
        )
    return _record(pin, versions)


__all__ = [
    "PIN_TABLE",
    "TOOLKIT_CHOICES",
    "TOOLKIT_ENV",
    "DebianRootfs",
    "RootfsContext",
    "RootfsPin",
    "launchers_home",
    "make_rootfs",
    "mmdebstrap_argv",
    "parse_package_versions",
    "parse_rootfs_pin",
    "resolve_toolkit_choice",
    "versions_digest",
]
