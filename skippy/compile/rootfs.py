"""Roots: a file system the configure and the build run inside (:class:`Rootfs`), the two
ways of running commands there (``chroot`` as root, mounting the work folders in around the
build; ``bwrap`` in an unprivileged user namespace, the namespace runner, binding them in its
command line), and never deleting through a mount one leaves.

A root is made by a backend's toolkit (the ROCm toolkit from Debian's packages,
:mod:`skippy.compile.backends.rocm_rootfs`); this module knows nothing of backends.  With the
namespace runner the binds are in the command line itself and nothing is mounted on the host:
:func:`mounted` only makes the work folders.  With ``chroot``, around the commands
:func:`mounted` mounts ``/proc`` (a fresh proc file system) and ``/dev`` (bound) inside the
root, and binds the work folders (the source tree, the build dir) at the same paths, so every
path in the plan means the same inside and out; it unmounts them again, in reverse order,
whatever happens (an error, Ctrl-C, a SIGTERM: while the mounts are up it raises
:class:`skippy.core.proc.Terminated`, so the same cleanup runs).  A mount left behind by a
killed run is never deleted through: :func:`mounts_under` reads the kernel's mount table,
and :func:`remove_tree` refuses a folder that has a mount inside it (``shutil.rmtree``
would delete the host's ``/dev`` through a bind).

The compiler cache runs inside too: :func:`install_launcher` copies the host's sccache
(a static-enough binary: it links only an old glibc) once, by content, into the root
(chroot) or into the root's launcher folder beside it, bound read-only (namespace: the
root itself may not be writable by the user).

``chroot`` and ``mount`` need root; the namespace runner needs only ``bwrap`` and
unprivileged user namespaces.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.compile.tool import Tool
from skippy.core import proc
from skippy.core.errors import BuildError, CommandError, SettingsError, ToolchainMissing
from skippy.core.proc import sigterm_unwinds

#: how commands run inside a root: ``chroot`` (root; :func:`mounted` mounts the
#: work folders in around the build) or ``namespace`` (``bwrap`` in an unprivileged user
#: namespace: the root's system folders bound read-only, the work folders bound at their own
#: paths, nothing mounted on the host)
ROOT_RUNNERS: Final = ("chroot", "namespace")

#: the root's top-level folders a namespace runner binds (read-only); its top-level links
#: (``bin -> usr/bin`` ...) are made again; /proc, /dev, /tmp, /run and /root are fresh
NAMESPACE_SYSTEM_DIRS: Final = ("usr", "etc", "var", "opt")
#: the folders a namespace runner makes empty (its own tmpfs each, gone with the command)
NAMESPACE_FRESH: Final = ("/tmp", "/run", "/root")  # noqa: S108 - a private tmpfs inside the namespace
#: where a namespace runner binds the launchers copied for the root (read-only)
NAMESPACE_LAUNCHERS: Final = Path("/skippy")


@dataclass(frozen=True)
class Rootfs:
    """A root file system the configure and the build run inside, for a toolkit that lives
    there rather than on the host (ROCm from Debian's packages).

    The work folders (the source tree, the build dir, the compiler cache's) are at the same
    paths inside and out, so every path in the plan means the same on both sides: the
    ``chroot`` runner mounts them into the root around the build
    (:func:`mounted`); the ``namespace`` runner (``bwrap`` in a user namespace,
    no privilege needed) binds them in its command line (:attr:`binds`, :meth:`with_binds`),
    beside the root's system folders (:attr:`layout`, read-only) and the launchers' folder.
    Nothing of the host's environment passes: the commands run under ``env -i`` with
    :attr:`env` only.  The compiler cache (sccache, a copy) runs inside with a server of its
    own: the plan adds its variables to :attr:`env` (:meth:`with_env`); the host's server is
    never asked to run the root's compilers."""

    path: Path
    #: the host's ``chroot`` or ``bwrap`` program (by :attr:`runner`)
    program: str
    #: the whole environment of the commands inside (PATH included)
    env: Mapping[str, str]
    #: cmake and ninja inside the root (paths as seen inside)
    cmake: Tool
    ninja: Tool
    #: what the root is, for notes and reports (``debian-root sid (packages 1a2b3c4d5e6f)``)
    label: str
    #: one of :data:`ROOT_RUNNERS`
    runner: str = "chroot"
    #: namespace: the root's top level, ``(name, link text)`` for a link and ``(name, None)``
    #: for a system folder (:data:`NAMESPACE_SYSTEM_DIRS`) (:func:`read_layout`)
    layout: tuple[tuple[str, str | None], ...] = ()
    #: namespace: the host folders bound at their own paths, read-write
    binds: tuple[Path, ...] = ()
    #: namespace: the host folder of the launchers copied for this root (bound read-only at
    #: :data:`NAMESPACE_LAUNCHERS`); chroot: None (they are copied into the root)
    launchers: Path | None = None

    @property
    def namespace(self) -> bool:
        return self.runner == "namespace"

    @property
    def prefix(self) -> tuple[str, ...]:
        """What runs a command inside: ``chroot ROOT /usr/bin/env -i NAME=VALUE ...``, or
        ``bwrap --unshare-user --uid 0 --gid 0 <binds> -- /usr/bin/env -i NAME=VALUE ...``."""
        assignments = tuple(f"{name}={value}" for name, value in sorted(self.env.items()))
        if not self.namespace:
            return (self.program, str(self.path), "/usr/bin/env", "-i", *assignments)
        return (self.program, *self._namespace_args(), "--", "/usr/bin/env", "-i", *assignments)

    def _namespace_args(self) -> tuple[str, ...]:
        args = ["--unshare-user", "--uid", "0", "--gid", "0"]
        for name, link in self.layout:
            if link is None:
                args += ["--ro-bind", str(self.path / name), f"/{name}"]
            else:
                args += ["--symlink", link, f"/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for fresh in NAMESPACE_FRESH:
            args += ["--tmpfs", fresh]
        if self.launchers is not None:
            args += ["--ro-bind", str(self.launchers), str(NAMESPACE_LAUNCHERS)]
        # shallow first: a folder bound inside another bound one stays visible
        for folder in sorted(self.binds, key=lambda p: (len(p.parts), str(p))):
            args += ["--bind", os.path.realpath(folder), str(folder)]
        return (*args, "--chdir", "/")

    @property
    def server_tag(self) -> str:
        """A short name for this root (its path; with a namespace runner also the folders bound
        in, which a server started in one namespace is limited to): the compiler cache
        server inside is its own."""
        key = str(self.path) if not self.namespace else "\n".join([str(self.path), *map(str, sorted(self.binds))])
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def with_env(self, extra: Mapping[str, str]) -> Rootfs:
        """The same root whose commands also get ``extra`` (the compiler cache's variables)."""
        return replace(self, env=MappingProxyType({**self.env, **extra}))

    def with_binds(self, folders: Sequence[Path]) -> Rootfs:
        """The same root with ``folders`` (absolute, as the plan names them) bound in at their
        own paths by a namespace runner (the chroot runner mounts them around the build: the
        root is returned as it is).  A folder a namespace runner cannot bind is refused:
        under one of the root's read-only system folders or links (``/usr``, ``/opt``, ``/lib`` ...)."""
        if not self.namespace:
            return self
        taken = {name for name, _link in self.layout}
        added = list(self.binds)
        for folder in (Path(f).absolute() for f in folders):
            top = folder.parts[1] if len(folder.parts) > 1 else ""
            if top in taken or top == NAMESPACE_LAUNCHERS.name or folder == Path(folder.anchor):
                raise BuildError(
                    f"{folder} cannot be bound into the root {self.path} by the namespace runner: /{top} "
                    "inside is the root's own (read-only)",
                    untouched="the root, the source tree and the build dir: nothing was run",
                    next_step="keep the work folders (the project, [tool.skippy] build_root and cache_dir) outside "
                    f"/{', /'.join(sorted(taken | {NAMESPACE_LAUNCHERS.name}))}, or use the chroot runner as "
                    "root (SKIPPY_ROOT_RUNNER=chroot)",
                )
            if folder not in added:
                added.append(folder)
        return replace(self, binds=tuple(added))

    def wrap(self, argv: Sequence[str]) -> tuple[str, ...]:
        return (*self.prefix, *argv)

    def host_path(self, inside: str | Path) -> Path:
        """Where a path inside the root is on the host (``/usr/bin/cmake`` -> ``ROOT/usr/bin/cmake``;
        with a namespace runner a launcher under ``/skippy`` is in :attr:`launchers`)."""
        path = Path(inside)
        if not path.is_absolute():
            return self.path / path
        if self.launchers is not None and path.is_relative_to(NAMESPACE_LAUNCHERS):
            return self.launchers / path.relative_to(NAMESPACE_LAUNCHERS)
        return self.path / path.relative_to("/")


def read_layout(root: Path) -> tuple[tuple[str, str | None], ...]:
    """The top level of ``root`` a namespace runner rebuilds: its links (``bin -> usr/bin``)
    and its system folders (:data:`NAMESPACE_SYSTEM_DIRS`), by name."""
    out: list[tuple[str, str | None]] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_symlink():
            out.append((entry.name, str(Path(entry.path).readlink())))
        elif entry.name in NAMESPACE_SYSTEM_DIRS and entry.is_dir():
            out.append((entry.name, None))
    return tuple(out)


MOUNTINFO: Final = Path("/proc/self/mountinfo")
MOUNT_TIMEOUT: Final = 60.0
#: where launchers copied into a root live (inside it): ``/opt/skippy/<name>-<digest>/<name>``
LAUNCHER_HOME: Final = Path("/opt/skippy")


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) -> the text."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mount_points(mountinfo: str) -> list[Path]:
    """The mount points of ``/proc/self/mountinfo`` (the fifth field of each line)."""
    points: list[Path] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(Path(_unescape(fields[4])))
    return points


def mounts_under(folder: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below ``folder`` (its real path), deepest first."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(encoding="utf-8")
        except OSError:
            return []
    real = Path(os.path.realpath(folder))
    found = {p for p in parse_mount_points(mountinfo) if p == real or p.is_relative_to(real)}
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(folder: Path, *, mountinfo: str | None = None) -> None:
    """``shutil.rmtree``, refused when something is mounted inside ``folder``."""
    mounted = mounts_under(folder, mountinfo)
    if mounted:
        raise BuildError(
            f"{folder} still has {len(mounted)} mount(s) inside it (a build run inside it was killed): "
            + ", ".join(str(p) for p in mounted),
            untouched=f"{folder} and everything mounted in it: nothing was deleted",
            next_step="unmount them (" + "; ".join(f"umount {p}" for p in mounted) + ") and run the build again",
        )
    shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Mount:
    """One mount inside the root: the ``mount`` argv and the mount point (host path)."""

    argv: tuple[str, ...]
    target: Path
    #: the host folder bound there (made when missing: a new build dir)
    source: Path | None = None


def _inside(root: Path, path: Path) -> Path:
    """``path`` (absolute, as seen inside) under ``root``, refused when it resolves outside."""
    target = root / path.relative_to(path.anchor)
    real_root = Path(os.path.realpath(root))
    if not Path(os.path.realpath(target)).is_relative_to(real_root):
        raise BuildError(
            f"{path} would be mounted at {target}, which resolves outside the root {root}",
            untouched="the root and the host: nothing was mounted",
            next_step=f"remove the link in {root} that leads out, or move the work folders",
        )
    return target


def plan_mounts(root: Path, binds: Sequence[Path]) -> tuple[Mount, ...]:
    """The mounts a build inside ``root`` needs, in the order they are made: ``/proc``,
    ``/dev``, then each work folder (its real path) bound at its own path."""
    mounts = [
        Mount(("mount", "-t", "proc", "proc", str(root / "proc")), root / "proc"),
        Mount(("mount", "--bind", "/dev", str(root / "dev")), root / "dev"),
    ]
    seen: set[Path] = set()
    for folder in binds:
        path = Path(folder).absolute()  # as the plan names it (a link stays a link)
        if path in seen:
            continue
        seen.add(path)
        target = _inside(root, path)
        mounts.append(Mount(("mount", "--bind", os.path.realpath(path), str(target)), target, path))
    return tuple(mounts)


def _unmount(target: Path, env: Mapping[str, str]) -> str | None:
    """Unmount ``target`` (lazily when it is busy); the error text when both fail."""
    try:
        proc.run(["umount", str(target)], env=env, timeout=MOUNT_TIMEOUT, what=f"umount {target}")
    except CommandError:
        try:
            proc.run(["umount", "--lazy", str(target)], env=env, timeout=MOUNT_TIMEOUT)
        except CommandError as exc:
            return f"{target}: {exc.what}"
    return None


def _unmount_all(made: list[Mount], env: Mapping[str, str], log: Callable[[str], None]) -> list[str]:
    failures: list[str] = []
    for mount in reversed(made):
        problem = _unmount(mount.target, env)
        if problem:
            failures.append(problem)
            log(f"could not unmount {mount.target}: run `umount --lazy {mount.target}`")
    return failures


def unmount_under(folder: Path, env: Mapping[str, str]) -> tuple[list[Path], list[str]]:
    """Unmount whatever is mounted at or below ``folder`` (deepest first; lazily when busy):
    ``(unmounted, failures)`` -- what a process killed while it worked in there left mounted."""
    done: list[Path] = []
    failures: list[str] = []
    for point in mounts_under(folder):
        problem = _unmount(point, env)
        if problem:
            failures.append(problem)
        else:
            done.append(point)
    return done, failures


@contextlib.contextmanager
def mounted(
    root: Rootfs | None,
    binds: Sequence[Path],
    *,
    env: Mapping[str, str],
    log: Callable[[str], None] = lambda _line: None,
) -> Iterator[None]:
    """Inside: ``/proc``, ``/dev`` and ``binds`` are mounted in ``root`` (nothing when None).
    Everything mounted is unmounted on the way out, also on an error, Ctrl-C or SIGTERM
    (which raises :class:`skippy.core.proc.Terminated` while the mounts are up).  A namespace
    runner binds in its own command line: the folders are only made (``bwrap`` binds existing
    ones)."""
    if root is None:
        yield
        return
    if root.namespace:
        for folder in (*binds, *root.binds):
            Path(folder).mkdir(parents=True, exist_ok=True)
        yield
        return
    made: list[Mount] = []
    with sigterm_unwinds():
        try:
            for mount in plan_mounts(root.path, binds):
                _mount(root, mount, env)
                made.append(mount)
            yield
        finally:
            failures = _unmount_all(made, env, log)
    if failures:
        raise BuildError(
            f"could not unmount {len(failures)} mount(s) inside {root.path}",
            untouched="the build's results",
            next_step="; ".join(f"umount --lazy {line.split(':', 1)[0]}" for line in failures),
            details="\n".join(failures),
        )


def _mount(root: Rootfs, mount: Mount, env: Mapping[str, str]) -> None:
    if mount.source is not None:
        mount.source.mkdir(parents=True, exist_ok=True)
    mount.target.mkdir(parents=True, exist_ok=True)
    try:
        proc.run(list(mount.argv), env=env, timeout=MOUNT_TIMEOUT, what=" ".join(mount.argv))
    except CommandError as exc:
        raise BuildError(
            f"could not mount {mount.target} for the build inside {root.path}",
            untouched="the source tree and the build dir; what was mounted is unmounted again",
            next_step="run the build as root (chroot and mount need it)",
            details=exc.details,
        ) from None


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def install_launcher(root: Rootfs, tool: Tool) -> Tool:
    """``tool`` (a compiler cache on the host) copied for ``root`` once, named by its content:
    into the root (chroot), or into its launcher folder (namespace, bound read-only at
    ``/skippy``); the returned tool's path is the one inside the root."""
    source = Path(os.path.realpath(tool.path))
    home = NAMESPACE_LAUNCHERS if root.launchers is not None else LAUNCHER_HOME
    inside = home / f"{tool.name}-{_file_digest(source)}" / tool.name
    target = root.host_path(inside)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{tool.name}.partial-{os.getpid()}")
        shutil.copy2(source, partial)
        partial.replace(target)
    return Tool(tool.name, str(inside), tool.version)


# --- the runners: which one, and the host's program for it ---------------------------------

#: ``[tool.skippy.build] root_runner`` / ``SKIPPY_ROOT_RUNNER`` values (auto: chroot for root)
RUNNER_CHOICES: Final = ("auto", *ROOT_RUNNERS)
RUNNER_ENV: Final = "SKIPPY_ROOT_RUNNER"
RUNNER_KEY: Final = "root_runner"


def resolve_runner(table: Mapping[str, object], env: Mapping[str, str], uid: int) -> str:
    """``SKIPPY_ROOT_RUNNER``, else ``[tool.skippy.build] root_runner``, else ``auto``: chroot
    for root, the namespace runner for everyone else."""
    raw = env.get(RUNNER_ENV) or table.get(RUNNER_KEY) or RUNNER_CHOICES[0]
    choice = str(raw).strip().lower()
    if choice not in RUNNER_CHOICES:
        raise SettingsError(
            f"unknown root runner {raw!r}",
            untouched="everything: nothing was downloaded or built",
            next_step=f"set {RUNNER_ENV} (or [tool.skippy.build] {RUNNER_KEY}) to {', '.join(RUNNER_CHOICES)}",
        )
    if choice == "auto":
        return "chroot" if uid == 0 else "namespace"
    return choice


def runner_rootfs(
    path: Path,
    program: str,
    runner: str,
    *,
    env: Mapping[str, str],
    launchers: Path | None = None,
    cmake: Tool | None = None,
    ninja: Tool | None = None,
    label: str = "",
) -> Rootfs:
    """A :class:`Rootfs` for the file system at ``path``, its commands run by ``runner`` with
    ``program`` under ``env`` only (its top level read now, for a namespace runner)."""
    namespace = runner == "namespace"
    if namespace and launchers is not None:
        launchers.mkdir(parents=True, exist_ok=True)
    return Rootfs(
        path=path,
        program=program,
        env=MappingProxyType(dict(env)),
        cmake=cmake or Tool("cmake", "/usr/bin/cmake", ""),
        ninja=ninja or Tool("ninja", "/usr/bin/ninja", ""),
        label=label or str(path),
        runner=runner,
        layout=read_layout(path) if namespace else (),
        launchers=launchers if namespace else None,
    )


def chroot_program(env: Mapping[str, str]) -> str | None:
    """The host's ``chroot`` (often in /usr/sbin, which a user's PATH may lack)."""
    return proc.which("chroot", env) or next(
        (str(p) for p in (Path("/usr/sbin/chroot"), Path("/sbin/chroot")) if os.access(p, os.X_OK)), None
    )


#: the namespace runner's own check: a user namespace mapping the user to root, the host's
#: / read-only (milliseconds)
BWRAP_CHECK: Final = ("--unshare-user", "--uid", "0", "--gid", "0", "--ro-bind", "/", "/", "--", "true")


def runner_program(runner: str, *, uid: int, env: Mapping[str, str], what: str = "the root") -> str:
    """The host's program for ``runner`` (chroot as root; ``bwrap``, checked to make a user
    namespace here), or ToolchainMissing naming what is missing and the next command
    (``what``: the root, as the messages call it)."""
    untouched = "everything: nothing was downloaded or built"
    if runner == "chroot":
        if uid != 0:
            raise ToolchainMissing(
                f"{what}'s chroot runner needs root (chroot and mount)",
                untouched=untouched,
                next_step=f"run the build as root, or use the namespace runner ({RUNNER_ENV}=namespace or auto)",
            )
        chroot = chroot_program(env)
        if chroot is None:
            raise ToolchainMissing(
                f"{what} needs chroot, which was not found",
                untouched=untouched,
                next_step="apt-get install coreutils, then run the build again",
            )
        return chroot
    bwrap = proc.which("bwrap", env)
    if bwrap is None:
        raise ToolchainMissing(
            f"{what}'s namespace runner needs bwrap (bubblewrap), which is not on PATH",
            untouched=untouched,
            next_step="apt-get install bubblewrap, then run the build again"
            + (f" (or, as root, {RUNNER_ENV}=chroot)" if uid == 0 else ""),
        )
    check = proc.run([bwrap, *BWRAP_CHECK], env=env, check=False, timeout=60)
    if not check.ok:
        raise ToolchainMissing(
            f"{what}'s namespace runner cannot make a user namespace here "
            f"(`bwrap --unshare-user` exit code {check.returncode})",
            untouched=untouched,
            next_step="let unprivileged users make user namespaces (sysctl user.max_user_namespaces=10000; "
            "kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0 where the "
            f"kernel has them), or run the build as root with {RUNNER_ENV}=chroot",
            details=check.tail(),
        )
    return bwrap
