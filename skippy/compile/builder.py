"""Execute a build plan: configure when needed, build, report.

The build is planned by :func:`skippy.compile.plan.plan_build` (pure); here
:func:`execute_plan` runs it through :func:`skippy.core.proc.run`: configure only
when the stamp changed (a stale cache is wiped, a generator mismatch or a cmake
that moved is recovered, :mod:`skippy.compile.configure` decides), fail on unused
``-D`` variables and on cache values that differ from the plan, then Ninja, then
report timings and the compiler cache hit rate (:mod:`skippy.compile.cachestats`).
:func:`skippy.flows.build_session.run_build_session` is what ``nox -s
build-<backend>`` calls: probe, prepare, plan, execute, spot check.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from skippy.compile.backends import languages
from skippy.compile.backends.base import RPC_TARGETS, SERVER_TARGET, Backend
from skippy.compile.cacheserver import claimed_server
from skippy.compile.cachestats import (
    CacheProbe,
    CacheStats,
)
from skippy.compile.configure import (
    ConfigureDecision,
    backend_uses,
    cache_mismatches,
    decide_configure,
    known_cache_names,
    missing_path_define,
    parse_cmake_cache,
    parse_cmake_cache_types,
    parse_unused_variables,
    unknown_given,
    unreached_readers,
)
from skippy.compile.localtree import MODE_LOCAL, MODE_PREPARED
from skippy.compile.noise import NoiseFilter
from skippy.compile.plan import (
    STAMP_NAME,
    TESTS_DEFINE,
    BuildPlan,
)
from skippy.compile.rootfs import remove_tree
from skippy.compile.toolchain import parse_ninja_targets
from skippy.core import proc
from skippy.core.errors import BuildError, CommandError
from skippy.core.strays import stop_strays
from skippy.core.ui import Console

#: a compile step of Ninja's output, in any language a registered backend compiles
COMPILE_LINE: Final = re.compile(rf"^\[\d+/\d+\] Building (?:{'|'.join(map(re.escape, languages()))}) object ")


@dataclass(frozen=True)
class BuildReport:
    backend: Backend
    build_dir: Path
    configured: bool
    configure_reason: str
    configure_seconds: float
    build_seconds: float
    #: compile steps Ninja ran (0 when up to date)
    compiled: int
    #: all Ninja steps run
    steps: int
    binaries: Mapping[str, Path]
    cache: CacheStats | None
    #: prepared (the queue on its upstream) or local (the workdir as it stood: --workdir-as-is)
    mode: str = MODE_PREPARED
    #: the backend's toolkit when it has a choice of them (BuildPlan.toolkit)
    toolkit: str | None = None

    @property
    def total_seconds(self) -> float:
        return self.configure_seconds + self.build_seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "build_dir": str(self.build_dir),
            "configured": self.configured,
            "configure_reason": self.configure_reason,
            "configure_seconds": round(self.configure_seconds, 3),
            "build_seconds": round(self.build_seconds, 3),
            "compiled": self.compiled,
            "steps": self.steps,
            "binaries": {k: str(v) for k, v in self.binaries.items()},
            "cache": None if self.cache is None else self.cache.as_dict(),
            "mode": self.mode,
            "toolkit": self.toolkit,
        }


def read_stamp(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _built_at(stamp_path: Path) -> float:
    server = stamp_path.parent / "bin" / SERVER_TARGET
    return max(stamp_path.stat().st_mtime, server.stat().st_mtime if server.is_file() else 0.0)


def built_from(stamp: Mapping[str, Any], source_dir: Path) -> bool:
    """Whether a build stamp is of ``source_dir`` (a stamp that names no tree cannot be told apart)."""
    recorded = stamp.get("source_dir")
    return not isinstance(recorded, str) or Path(recorded).resolve() == source_dir.resolve()


def newest_builds(build_root: Path, source_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """The newest build dir of each backend under ``build_root``: where its binaries are,
    the patched commit it was built from, its mode (``prepared``, or ``local`` for the
    workdir as it stood), when.  Newest by its llama-server (the binary the spot check
    picks), else by its stamp.  With ``source_dir``, only the builds of that tree (another
    workdir may share the build root)."""
    found: dict[str, dict[str, Any]] = {}
    stamps = sorted(build_root.glob(f"*/{STAMP_NAME}"), key=_built_at)
    for path in stamps:  # oldest first: the newest of a backend wins
        stamp = read_stamp(path)
        if stamp is None or not isinstance(stamp.get("backend"), str):
            continue
        if source_dir is not None and not built_from(stamp, source_dir):
            continue
        if tests_only(stamp, path.parent):
            continue  # its programs are tests, not the backend's binaries
        bin_dir = path.parent / "bin"
        found[stamp["backend"]] = {
            "build_dir": str(path.parent),
            "patched_sha": stamp.get("patched_sha"),
            # prepared (the queue on its upstream) or local (the workdir as it stood: --workdir-as-is)
            "mode": stamp.get("mode", MODE_PREPARED),
            "source_dir": stamp.get("source_dir"),
            "binaries": _backend_binaries(bin_dir),
            "built": int(_built_at(path)),
        }
    return found


def tests_only(stamp: Mapping[str, Any], build_dir: Path) -> bool:
    """Whether ``build_dir`` is a dir of upstream's tests alone (a tree beside the workdir, an
    older ``--upstream-tests``): configured with ``LLAMA_BUILD_TESTS=ON`` by skippy and without
    llama-server.  A maintainer's own build given that flag has llama-server: the backend's."""
    args = stamp.get("configure_args")
    return isinstance(args, list) and TESTS_DEFINE in args and not (build_dir / "bin" / SERVER_TARGET).is_file()


#: the name upstream's test programs start with (they build beside the binaries: --upstream-tests)
TEST_PROGRAM_PREFIX: Final = "test-"


def _backend_binaries(bin_dir: Path) -> dict[str, str]:
    """The programs in ``bin_dir`` but upstream's tests."""
    if not bin_dir.is_dir():
        return {}
    programs = (p for p in sorted(bin_dir.iterdir()) if p.is_file())
    return {p.name: str(p) for p in programs if not p.name.startswith(TEST_PROGRAM_PREFIX)}


#: build dirs of the workdir as it stood (``--workdir-as-is``) kept per backend and flags
KEEP_LOCAL_BUILDS: Final = 3


def prune_local_builds(build_dir: Path, *, keep: int = KEEP_LOCAL_BUILDS) -> list[Path]:
    """After a build of the workdir as it stood into ``build_dir``
    (``<backend>-<flags>-local-<state>``): the older build dirs of other states of the same
    backend and flags are removed, the newest ``keep`` (``build_dir`` one of them) kept.
    Only dirs whose stamp says ``local`` are touched: never a prepared tree's build dir, nor
    another flags' or backend's; a dir with something mounted inside is refused."""
    prefix = build_dir.name.rsplit("-", 1)[0] + "-"
    older = [
        stamp
        for stamp in build_dir.parent.glob(f"{prefix}*/{STAMP_NAME}")
        if stamp.parent != build_dir and (read_stamp(stamp) or {}).get("mode") == MODE_LOCAL
    ]
    older.sort(key=_built_at, reverse=True)
    removed = []
    for stamp in older[max(keep - 1, 0) :]:
        remove_tree(stamp.parent)
        removed.append(stamp.parent)
    return removed


def _wipe_cache(build_dir: Path) -> None:
    (build_dir / STAMP_NAME).unlink(missing_ok=True)
    (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
    shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)


@contextlib.contextmanager
def _timed(console: Console, title: str, box: list[float]) -> Iterator[None]:
    started = time.monotonic()
    try:
        with console.step(title):
            yield
    finally:
        box.append(time.monotonic() - started)


def _build_error(exc: CommandError, what: str, plan: BuildPlan, next_step: str) -> BuildError:
    return BuildError(
        f"{what} ({plan.backend}): exit code {exc.returncode}",
        untouched=f"the source tree; the build dir {plan.build_dir} is kept for inspection",
        next_step=next_step,
        details=exc.details,
    )


def _read_cache(cache_file: Path) -> dict[str, str] | None:
    if not cache_file.is_file():
        return None
    return parse_cmake_cache(cache_file.read_text(encoding="utf-8", errors="replace"))


def _check_configured(plan: BuildPlan, output: str) -> None:
    """CMake used every -D variable we gave it and kept every value we configured."""
    build_dir = plan.build_dir
    unused = parse_unused_variables(output)
    if unused:
        plan.stamp_path.unlink(missing_ok=True)
        raise BuildError(
            f"CMake did not use these -D variables: {', '.join(unused)}",
            untouched=f"the source tree; {build_dir} is configured but not built",
            next_step="remove or rename them (a typo, or an option this llama.cpp tree no longer has)",
            details="CMake: Manually-specified variables were not used by the project",
        )
    _check_given_known(plan)
    _check_backend_readers(plan)
    cache = _read_cache(build_dir / "CMakeCache.txt") or {}
    wrong = cache_mismatches(plan.expectations, cache)
    if wrong:
        plan.stamp_path.unlink(missing_ok=True)
        lines = [f"{name}: wanted {want!r}, CMakeCache.txt has {got!r}" for name, (want, got) in wrong.items()]
        raise BuildError(
            "CMake did not keep the values we configured",
            untouched=f"the source tree; {build_dir} is configured but not built",
            next_step="check which CMakeLists.txt overrides them (set(... FORCE)) and fix the patch",
            details="\n".join(lines),
        )


def _check_backend_readers(plan: BuildPlan) -> None:
    """Every source outside ggml that tests an enabled backend's ``GGML_USE_<NAME>`` has it on
    its compile line (read from CMake's ``compile_commands.json``, which llama.cpp always writes)."""
    commands_file = plan.build_dir / "compile_commands.json"
    try:
        commands = json.loads(commands_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return

    def read(rel: str) -> str:
        try:
            return (plan.source_dir / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    gaps = unreached_readers(backend_uses(commands, plan.source_dir), read)
    if not gaps:
        return
    plan.stamp_path.unlink(missing_ok=True)
    raise BuildError(
        f"{len(gaps)} source(s) outside ggml test a backend's GGML_USE_ definition their compile line lacks",
        untouched=f"the source tree; {plan.build_dir} is configured but not built",
        next_step=(
            "link ggml-backend-use in the target of each (target_link_libraries(<target> PRIVATE "
            "ggml-backend-use) in its CMakeLists.txt, in the patch that added the source), then "
            f"`nox -s build-{plan.backend}`"
        ),
        details="\n".join(f"{rel}: reads {', '.join(names)}" for rel, names in gaps.items()),
    )


def _cmake_words(source_dir: Path) -> str:
    """The text of every CMake file of the tree (what a -D name must appear in to be read by name)."""
    parts = []
    for path in (*source_dir.rglob("CMakeLists.txt"), *source_dir.rglob("*.cmake")):
        with contextlib.suppress(OSError):
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def _check_given_known(plan: BuildPlan) -> None:
    """Every -D the user gave names a variable the project knows (before anything is built)."""
    given = sorted(name for name, source in plan.provenance.items() if source == "given")
    cache_file = plan.build_dir / "CMakeCache.txt"
    if not given or not cache_file.is_file():
        return
    types = parse_cmake_cache_types(cache_file.read_text(encoding="utf-8", errors="replace"))
    words: list[str] = []

    def mentioned(name: str) -> bool:
        if not words:
            words.append(_cmake_words(plan.source_dir))
        return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", words[0]) is not None

    unknown = unknown_given(given, types, mentioned)
    if not unknown:
        return
    plan.stamp_path.unlink(missing_ok=True)
    known = known_cache_names(types)
    lines, fixes = [], []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        lines.append(
            f"{name}: CMake left it UNINITIALIZED in CMakeCache.txt and no CMake file of {plan.source_dir} names it; "
            + (f"closest known: {', '.join(close)}" if close else "no known variable is close")
        )
        value = plan.define(name) or ""
        fixes.append(f"-D{close[0]}={value}" if close else "")
    closest = [f for f in fixes if f]
    rerun = " ".join(["nox", "-s", f"build-{plan.backend}", *(["--", *closest] if closest else [])])
    raise BuildError(
        f"the project does not know the -D variable(s) you gave: {', '.join(unknown)}",
        untouched=f"the source tree; {plan.build_dir} is configured but not built",
        next_step=f"fix or drop them: {rerun}",
        details="\n".join(lines),
    )


def _configure(plan: BuildPlan, decision: ConfigureDecision, console: Console, box: list[float]) -> None:
    """Run CMake (wiping a stale cache first), check what it made, write the stamp."""
    if decision.wipe:
        console.info(f"reconfiguring {plan.build_dir.name}: {decision.reason}")
        _wipe_cache(plan.build_dir)
    with _timed(console, f"configure {plan.backend} ({decision.reason})", box):
        try:
            result = proc.run(plan.configure_argv, env=plan.env, on_line=console.info, echo=console.command)
        except CommandError as exc:
            raise _configure_error(exc, plan) from None
        _check_configured(plan, result.stdout + "\n" + result.stderr)


def _configure_error(exc: CommandError, plan: BuildPlan) -> BuildError:
    """A failed configure; when CMake names the path of a -D value that does not exist, that
    setting is the cause and its fix the next step (not the tree's CMake code)."""
    rerun = f"nox -s build-{plan.backend}"
    bad = missing_path_define(plan, exc.output_tail)
    if bad is None:
        return _build_error(
            exc, "CMake configure failed", plan, f"read the CMake error above, fix it, and rerun `{rerun}`"
        )
    name, value = bad
    return BuildError(
        f"CMake configure failed ({plan.backend}): exit code {exc.returncode}: -D{name}={value} names a path "
        "that does not exist",
        untouched=f"the source tree; the build dir {plan.build_dir} is kept for inspection",
        next_step=f"give -D{name} a path that exists (or drop it: it was given on the command line, in "
        f"[tool.skippy.build] or the environment), then rerun `{rerun}`",
        details=exc.details,
    )


def _write_stamp(plan: BuildPlan) -> None:
    plan.stamp_path.write_text(json.dumps(dict(plan.stamp), indent=2, sort_keys=True) + "\n", "utf-8")


@dataclass
class _NinjaCounter:
    """Counts Ninja's steps and compile steps while echoing its lines."""

    show: Callable[[str], None]
    compiled: int = 0
    steps: int = 0

    def __call__(self, line: str) -> None:
        if line.startswith("["):
            self.steps += 1
            if COMPILE_LINE.match(line):
                self.compiled += 1
        self.show(line)


#: seconds a compile the cache server still runs for an interrupted build gets after SIGTERM
STRAY_GRACE: Final = 5.0


def _run_ninja(
    plan: BuildPlan, targets: tuple[str, ...], console: Console, box: list[float]
) -> tuple[_NinjaCounter, CacheStats | None]:
    build_argv = plan.build_argv
    if targets != plan.targets:
        build_argv = tuple(a for a in plan.build_argv if a not in plan.targets) + targets
    probe = CacheProbe(plan, console)
    build_env = probe.before()
    shown = NoiseFilter(console.info, console.detail)
    counter = _NinjaCounter(shown)
    with _timed(console, f"build {plan.backend}: {' '.join(targets)}", box):
        try:
            proc.run(build_argv, env=build_env, on_line=counter, echo=console.command)
        except CommandError as exc:
            raise _build_error(
                exc,
                "the build failed",
                plan,
                f"fix the compile error above and rerun `nox -s build-{plan.backend}`",
            ) from None
        except (KeyboardInterrupt, proc.Terminated):
            # ninja stopped its own jobs; sccache's server, a daemon outside our process groups,
            # still runs the compiles it was handed for this build dir: those are stopped too
            if plan.launcher is not None and plan.launcher.name == "sccache":
                stop_strays(plan.build_dir, daemon="sccache", grace=STRAY_GRACE)
            raise
        finally:
            shown.close()
    stats = probe.after()
    if stats is not None:
        console.info(stats.render())
    return counter, stats


def _binaries(plan: BuildPlan, targets: tuple[str, ...]) -> dict[str, Path]:
    binaries = {t: plan.build_dir / "bin" / t for t in targets}
    missing = [str(p) for p in binaries.values() if not p.is_file()]
    if missing:
        raise BuildError(
            f"the build finished but did not produce {', '.join(missing)}",
            untouched=f"the source tree; {plan.build_dir} is kept",
            next_step="check that the targets still exist in this llama.cpp tree (ninja -t targets all)",
        )
    return binaries


def execute_plan(
    plan: BuildPlan, console: Console, *, build: bool = True, targets: tuple[str, ...] = ()
) -> BuildReport:
    """Configure (when the stamp says so) and build; returns timings and cache figures.

    ``build=False`` stops after configure and its checks (no binaries).  ``targets`` builds
    those Ninja targets instead of the plan's (objects, say: no binaries are looked for).
    """
    build_dir = plan.build_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    if plan.launcher_script is not None:
        plan.launcher_script.write()  # CMake's launcher for every compile: there before configure
    server: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if plan.launcher is not None and plan.launcher.name == "sccache":
        # inside a root the server runs there: stopped when the build ends, before the unmounts
        stop = plan.rootfs is not None
        if plan.dist is not None:
            plan.dist.write()  # sccache reads its cluster's client config when its server starts
        server = claimed_server(plan.launcher_argv, plan.cache_server_envs, console, stop_after=stop)
    with server:
        return _configure_and_build(plan, console, build=build, chosen=targets)


def _configure_and_build(plan: BuildPlan, console: Console, *, build: bool, chosen: tuple[str, ...]) -> BuildReport:
    build_dir = plan.build_dir
    decision = decide_configure(
        plan,
        stamp=read_stamp(plan.stamp_path),
        cache=_read_cache(build_dir / "CMakeCache.txt"),
        has_build_ninja=(build_dir / "build.ninja").is_file(),
        exists=lambda p: plan.host_path(p).exists(),
    )
    configure_time: list[float] = []
    build_time: list[float] = []
    if decision.needed:
        _configure(plan, decision, console, configure_time)
    else:
        console.info(f"{build_dir.name}: configure up to date (stamp matches)")
    targets = chosen or (plan.targets if plan.rpc_target_known else _resolve_rpc_target(plan, console))
    if decision.needed:
        _write_stamp(plan)
    report = BuildReport(
        backend=plan.backend,
        build_dir=build_dir,
        configured=decision.needed,
        configure_reason=decision.reason,
        configure_seconds=sum(configure_time),
        build_seconds=0.0,
        compiled=0,
        steps=0,
        binaries=MappingProxyType({}),
        cache=None,
        mode=str(plan.stamp.get("mode", MODE_PREPARED)),
        toolkit=plan.toolkit,
    )
    if not build:
        return report
    counter, stats = _run_ninja(plan, targets, console, build_time)
    return replace(
        report,
        build_seconds=sum(build_time),
        compiled=counter.compiled,
        steps=counter.steps,
        binaries=MappingProxyType({} if chosen else _binaries(plan, targets)),
        cache=stats,
    )


def _resolve_rpc_target(plan: BuildPlan, console: Console) -> tuple[str, ...]:
    ninja = plan.build_argv[: len(plan.runner) + 1]
    result = proc.run([*ninja, "-C", str(plan.build_dir), "-t", "targets", "all"], env=plan.env, check=True)
    available = parse_ninja_targets(result.stdout)
    for name in RPC_TARGETS:
        if name in available:
            console.detail(f"RPC server target: {name}")
            return tuple(name if t in RPC_TARGETS else t for t in plan.targets)
    raise BuildError(
        f"this tree has none of the RPC server targets {', '.join(RPC_TARGETS)}",
        untouched=f"the source tree; {plan.build_dir} is configured",
        next_step="check that GGML_RPC still builds an RPC server in this llama.cpp tree",
    )
