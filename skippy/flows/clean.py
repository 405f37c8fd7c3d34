"""``invoke clean``: remove what skippy made and a next build or prepare does not use.

:func:`plan_clean` reads the disk and decides (nothing is changed); :func:`clean`
removes what the plan lists, or only reports it (``--dry-run``).  Each path comes
with its size and the reason.

Removed:

* build dirs under the build root (recognised by the stamp a build writes,
  ``skippy-build-stamp.json``) other than the newest build of each backend of the
  prepared tree: older builds and other sets of CMake settings, builds of the workdir
  as it stood (``--workdir-as-is``), builds of a tree that no longer exists;
* CMake build dirs with no stamp (a configure that failed its checks or never
  finished), once untouched for :data:`UNSTAMPED_GRACE` seconds;
* source archives in the download cache that neither ``[tool.skippy.archives]`` nor
  a test-bed built under the cache dir (the project's own tests and bench make one; its
  manifest names the sdists it was made from) names any more, and downloads a fetch
  quarantined because their digest was wrong.

Listed and kept: the shared store of archive imports (``<cache_dir>/git/llama.cpp.git``),
with its size and the command that deletes it (safe: the next cold prepare imports again).

Kept, whatever their age: the newest build of each backend of every other workdir
that still exists (several workdirs may share one build root), anything a running
process uses (its working directory or an open file inside it), anything under the
build root that no build made.  Never looked at: the workdir, the patch queue, the
backups, the compiler cache, toolkits, system roots and models.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.compile.backends.base import SERVER_TARGET
from skippy.compile.builder import read_stamp, tests_only
from skippy.compile.localtree import MODE_LOCAL
from skippy.compile.plan import STAMP_NAME
from skippy.compile.rootfs import remove_tree
from skippy.core.errors import CleanFailed, SkippyError
from skippy.core.settings import Settings
from skippy.core.ui import Console, human_size, tree_size
from skippy.queue.archive_specs import load_archive_specs
from skippy.queue.archives import shared_store

#: a build dir without a stamp changed more recently than this (seconds) may be a configure under way
UNSTAMPED_GRACE: Final = 3600.0
#: how a build names its dir: ``<backend>-<flags digest>``, ``...-local-<workdir state>`` for
#: ``--workdir-as-is`` (:func:`skippy.compile.plan.plan_build`); a stampless CMake dir named
#: otherwise is someone's own and stays
BUILD_DIR_NAME: Final = re.compile(r"^[A-Za-z0-9_.]+-[0-9a-f]{10}(?:-local-[0-9a-f]{12})?$")
#: the manifest of a test-bed built under ``<cache_dir>/testbed`` (the project's tooling writes it): the
#: sdists it was made from, each with its sha256 (``versions``); their archives are kept
TESTBED_MANIFEST: Final = "skippy-testbed.json"
#: what ``invoke clean`` never touches, said in its report
NEVER_TOUCHED: Final = (
    "the workdir, the patch queue, the backups, the compiler cache, toolkits, system roots and models"
)


def testbed_archives(cache_dir: Path) -> dict[str, str]:
    """sha256 -> why it is kept, for each sdist a test-bed under ``<cache_dir>/testbed`` names in its
    manifest (:data:`TESTBED_MANIFEST`); a manifest that cannot be read names none."""
    named: dict[str, str] = {}
    for manifest in sorted((cache_dir / "testbed").glob(f"*/{TESTBED_MANIFEST}")):
        try:
            versions = json.loads(manifest.read_text(encoding="utf-8"))["versions"]
            found = {str(v["sha256"]): str(v["version"]) for v in versions}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for digest, version in found.items():
            why = f"the {version} sdist the test-bed {manifest.parent.name} was made from (nox -s bench, e2e tests)"
            named[digest] = why
    return named


@dataclass(frozen=True)
class Entry:
    """One path the plan removes or keeps, its size in bytes and why."""

    path: Path
    size: int
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "size": self.size, "why": self.why}


@dataclass(frozen=True)
class CleanPlan:
    remove: tuple[Entry, ...]
    keep: tuple[Entry, ...]

    @property
    def size(self) -> int:
        return sum(e.size for e in self.remove)

    def as_dict(self) -> dict[str, Any]:
        return {
            "remove": [e.as_dict() for e in self.remove],
            "keep": [e.as_dict() for e in self.keep],
            "size": self.size,
        }


@dataclass(frozen=True)
class _Build:
    path: Path
    stamp: Mapping[str, Any]
    built: float

    @property
    def backend(self) -> str:
        return str(self.stamp["backend"])

    @property
    def local(self) -> bool:
        return self.stamp.get("mode") == MODE_LOCAL

    @property
    def kind(self) -> str:
        """``"cpu"``, or ``"cpu tests"`` for a build dir of upstream's tests alone (the trees beside
        the workdir, an older ``--upstream-tests``), which is kept beside the binaries' build, not
        instead of it.  A build given ``LLAMA_BUILD_TESTS=ON`` that has llama-server is the backend's."""
        return f"{self.backend} tests" if tests_only(self.stamp, self.path) else self.backend

    def source(self, workdir: Path) -> Path:
        """The tree it was built from (a stamp that names none is taken for the workdir's)."""
        recorded = self.stamp.get("source_dir")
        return Path(recorded).resolve() if isinstance(recorded, str) else workdir.resolve()


@dataclass
class _Planner:
    settings: Settings
    in_use: Mapping[Path, int]
    now: float
    remove: list[Entry] = field(default_factory=list)
    keep: list[Entry] = field(default_factory=list)

    def user(self, path: Path) -> int | None:
        """The id of a process using ``path`` or something inside it, if any."""
        return next((pid for used, pid in self.in_use.items() if used == path or path in used.parents), None)

    def protected(self, path: Path) -> str | None:
        """What ``path`` is, when it is (or holds, or lies in) something clean never removes."""
        s = self.settings
        real = path.resolve()
        guarded = {
            "the workdir": s.workdir,
            "the patch queue": s.patch_dir,
            "the cache": s.cache_dir,
            "the project": s.root,
        }
        for what, kept in guarded.items():
            where = kept.resolve()
            if real == where or real in where.parents or (what == "the workdir" and where in real.parents):
                return what
        return None

    def add(self, path: Path, why: str, *, removable: bool, size: int | None = None) -> None:
        pid = self.user(path.resolve())
        guarded = self.protected(path)
        if guarded is not None:
            why, removable = f"{guarded}, never removed", False
        elif removable and pid is not None:
            why, removable = f"in use by process {pid} ({why})", False
        entry = Entry(path, tree_size(path) if size is None else size, why)
        (self.remove if removable else self.keep).append(entry)

    def builds(self) -> None:
        root = self.settings.build_root
        if not root.is_dir():
            return
        found: list[_Build] = []
        for child in sorted(root.iterdir()):
            stamp = read_stamp(child / STAMP_NAME) if child.is_dir() and not child.is_symlink() else None
            if stamp is not None and isinstance(stamp.get("backend"), str):
                found.append(_Build(child, stamp, _built_at(child)))
            elif child.is_dir() and not child.is_symlink() and (child / "CMakeCache.txt").is_file():
                self.unstamped(child)
            else:
                self.add(
                    child, "not a build dir (no build stamp, no CMakeCache.txt): not made by a build", removable=False
                )
        workdir = self.settings.workdir.resolve()
        newest: dict[tuple[Path, str], _Build] = {}
        for build in sorted(found, key=lambda b: b.built):  # oldest first: the newest wins
            if not build.local:
                newest[(build.source(workdir), build.kind)] = build
        for build in found:
            self.build(build, workdir, newest)

    def unstamped(self, path: Path) -> None:
        age = self.now - _changed_at(path)
        if not BUILD_DIR_NAME.match(path.name):
            why = "a CMake build dir no build made (a build names its dir <backend>-<digest>)"
            self.add(path, why, removable=False)
        elif age < UNSTAMPED_GRACE:
            why = (
                f"a CMake build dir with no build stamp, changed {age / 60:.0f} min ago: perhaps a configure under way"
            )
            self.add(path, why, removable=False)
        else:
            self.add(
                path,
                "a CMake build dir with no build stamp: its configure failed its checks or never finished",
                removable=True,
            )

    def build(self, build: _Build, workdir: Path, newest: Mapping[tuple[Path, str], _Build]) -> None:
        source = build.source(workdir)
        shown = self.settings.relative(source)
        mine = source == workdir
        tree = "the prepared tree" if mine else f"the prepared tree {shown}"
        head = str(build.stamp.get("patched_sha") or "")[:12]
        if build.local:
            why = f"a {build.backend} build of {shown} as it stood at HEAD {head} (--workdir-as-is)"
            self.add(build.path, why, removable=True)
        elif not mine and not source.is_dir():
            self.add(build.path, f"a {build.backend} build of {shown}, which no longer exists", removable=True)
        elif newest.get((source, build.kind)) is build:
            self.add(build.path, f"the newest {build.kind} build of {tree} (patched {head})", removable=False)
        else:
            latest = newest[(source, build.kind)].path.name
            why = f"an older {build.kind} build of {tree} (other CMake settings or an older tree) than {latest}"
            self.add(build.path, why, removable=True)

    def archives(self) -> None:
        cache = self.settings.cache_dir / "archives"
        if not cache.is_dir():
            return
        named = testbed_archives(self.settings.cache_dir)
        for key, spec in load_archive_specs(self.settings).items():
            named[spec.sha256] = f"the source archive of upstream {key[:12]} ([tool.skippy.archives])"
        for path in sorted(cache.glob("*.archive")):
            digest = path.name.removesuffix(".archive")
            if digest in named:
                self.add(path, named[digest], removable=False)
                continue
            why = "a source archive neither [tool.skippy.archives] nor a test-bed names any more"
            self.add(path, why, removable=True)
            lock = path.with_suffix(".lock")
            if lock.is_file() and self.user(lock.resolve()) is None:
                self.add(lock, "the lock file of that archive", removable=True, size=0)
        quarantine = cache / "quarantine"
        if quarantine.is_dir():
            for path in sorted(quarantine.iterdir()):
                self.add(path, "a download that did not match its sha256, moved aside by a fetch", removable=True)

    def store(self) -> None:
        """The shared store of archive imports: kept (the next cold prepare clones from it), named
        with its size so a user short of space knows it may go."""
        store = shared_store(self.settings)
        if store.is_dir():
            why = (
                "the imports of source archives, cloned into each new workdir; safe to delete "
                f"(`rm -rf {self.settings.relative(store)}`): the next cold prepare imports again"
            )
            self.add(store, why, removable=False)


def _built_at(build_dir: Path) -> float:
    """When a build dir was last built: its llama-server, else its stamp (as the builds read it)."""
    times = [p.stat().st_mtime for p in (build_dir / STAMP_NAME, build_dir / "bin" / SERVER_TARGET) if p.is_file()]
    return max(times, default=0.0)


def _changed_at(path: Path) -> float:
    """The newest change time of ``path`` and its first level (a configure touches files there)."""
    times = [path.lstat().st_mtime]
    with contextlib.suppress(OSError):
        times += [child.lstat().st_mtime for child in path.iterdir()]
    return max(times)


def paths_in_use(proc_root: Path = Path("/proc")) -> dict[Path, int]:
    """The working directories and open files of every process this user may read, with a
    process id using each (Linux; empty where ``proc_root`` does not exist)."""
    found: dict[Path, int] = {}
    if not proc_root.is_dir():
        return found
    for pid_dir in proc_root.glob("[0-9]*"):
        links: Iterable[Path]
        try:
            links = [pid_dir / "cwd", *(pid_dir / "fd").iterdir()]
        except OSError:
            continue  # gone, or not ours to read
        for link in links:
            with contextlib.suppress(OSError, ValueError):
                target = link.readlink()
                if target.is_absolute():
                    found.setdefault(target, int(pid_dir.name))
    return found


def plan_clean(settings: Settings, *, in_use: Mapping[Path, int] | None = None, now: float | None = None) -> CleanPlan:
    """What :func:`clean` would remove and what it keeps, with sizes and reasons (reads only)."""
    planner = _Planner(
        settings,
        in_use=paths_in_use() if in_use is None else in_use,
        now=time.time() if now is None else now,
    )
    planner.builds()
    planner.archives()
    planner.store()
    return CleanPlan(tuple(planner.remove), tuple(planner.keep))


def render_plan(plan: CleanPlan, settings: Settings, *, dry_run: bool) -> str:
    """The human report: what goes (or would go), what stays, why."""

    def line(entry: Entry) -> str:
        return f"  {settings.relative(entry.path)}  {human_size(entry.size)}  {entry.why}"

    lines = []
    if plan.remove:
        verb = "would remove" if dry_run else "removed"
        lines.append(f"{verb} {len(plan.remove)} path(s), {human_size(plan.size)}:")
        lines += [line(e) for e in plan.remove]
    else:
        lines.append("nothing to remove")
    if plan.keep:
        lines.append("kept:")
        lines += [line(e) for e in plan.keep]
    lines.append(f"never touched: {NEVER_TOUCHED} ({settings.relative(settings.workdir)} is the workdir)")
    if dry_run and plan.remove:
        lines.append("next: `invoke clean` removes them")
    return "\n".join(lines)


def clean(settings: Settings, console: Console, *, dry_run: bool) -> CleanPlan:
    """Remove what :func:`plan_clean` lists (nothing with ``dry_run``); the plan carried out.

    A path that cannot be removed (something mounted inside a build dir, a permission)
    does not stop the others; the error at the end names each one.
    """
    plan = plan_clean(settings)
    if dry_run:
        return plan
    done: list[Entry] = []
    failed: list[str] = []
    for entry in plan.remove:
        try:
            if entry.path.is_dir() and not entry.path.is_symlink():
                remove_tree(entry.path)
            else:
                entry.path.unlink(missing_ok=True)
        except (OSError, SkippyError) as exc:
            what = exc.what if isinstance(exc, SkippyError) else str(exc)
            failed.append(f"{settings.relative(entry.path)}: {what}")
            continue
        done.append(entry)
        console.detail(f"removed {settings.relative(entry.path)} ({human_size(entry.size)})")
    carried = CleanPlan(tuple(done), plan.keep)
    if failed:
        raise CleanFailed(
            f"could not remove {len(failed)} of {len(plan.remove)} path(s) "
            f"({human_size(carried.size)} freed by the others)",
            untouched="the paths listed, and everything `invoke clean --dry-run` lists as kept",
            next_step="fix what each line says, then run `invoke clean` again",
            details="\n".join(failed),
        )
    return carried
