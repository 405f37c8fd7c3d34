"""Plan, then execute, a CMake + Ninja build of one backend.

* :func:`plan_build` is pure: from the backend's registry entry, the settings,
  what the tree declares (:class:`~skippy.build.toolchain.TreeInfo`) and the tools
  found (:class:`~skippy.build.toolchain.Toolchain`) it computes the configure and
  build command lines, the targets and binaries, the compiler launchers, the
  values CMakeCache.txt must hold afterwards, the spot-check environment and
  the stamp that says when configuring can be skipped.
* :func:`execute_plan` runs it through :func:`skippy.core.proc.run`: configure only
  when the stamp changed (a stale cache is wiped, a generator mismatch or a
  cmake that moved is recovered), fail on unused ``-D`` variables and on
  cache values that differ from the plan, then Ninja, then report timings and
  the compiler cache hit rate.
* :func:`run_build_session` is what ``nox -s build-<backend>`` calls:
  probe, prepare, plan, execute, spot check.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from skippy.build.backends import (
    COMMON_DEFINES,
    RPC_TARGETS,
    TREE_OPTIONAL_DEFINES,
    Backend,
    registry,
    spec,
    switches,
)
from skippy.build.backends.base import Tool
from skippy.build.cache import CacheStorage, local_fallback_env, reachable, select_storage, shared_cache_env
from skippy.build.toolchain import (
    Toolchain,
    TreeInfo,
    parse_ninja_targets,
)
from skippy.core import proc
from skippy.core.errors import BuildError, CommandError
from skippy.core.settings import Settings
from skippy.core.ui import Console

GENERATOR: Final = "Ninja"
STAMP_NAME: Final = "skippy-build-stamp.json"
STAMP_SCHEMA: Final = 1
#: Unix sockets have a ~108-byte path limit; past this sccache uses its TCP port
_UDS_MAX: Final = 100
_TRUE = frozenset({"ON", "TRUE", "YES", "Y", "1"})
_FALSE = frozenset({"OFF", "FALSE", "NO", "N", "0", ""})
COMPILE_LINE = re.compile(r"^\[\d+/\d+\] Building (?:C|CXX|CUDA|HIP|OBJC|OBJCXX) object ")
_DEFINE_ARG = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_.+-]*)(?::[A-Za-z]+)?=(.*)$", re.DOTALL)


# --- plan -----------------------------------------------------------------------


@dataclass(frozen=True)
class Define:
    name: str
    value: str
    #: a tool or directory path: kept out of the build-dir digest, not asserted in the cache
    path: bool = False

    @property
    def arg(self) -> str:
        return f"-D{self.name}={self.value}"


@dataclass(frozen=True)
class BuildOptions:
    """What the user asked for on top of the registry."""

    #: extra CMake arguments (``-DNAME=VALUE`` ones override the registry)
    cmake_args: tuple[str, ...] = ()
    jobs: int | None = None


@dataclass(frozen=True)
class BuildPlan:
    backend: Backend
    source_dir: Path
    build_dir: Path
    digest: str
    defines: tuple[Define, ...]
    extra_args: tuple[str, ...]
    configure_argv: tuple[str, ...]
    build_argv: tuple[str, ...]
    targets: tuple[str, ...]
    #: False when the tree did not name its RPC target: it is looked up after configure
    rpc_target_known: bool
    binaries: Mapping[str, Path]
    #: values CMakeCache.txt must hold after configure
    expectations: Mapping[str, str]
    #: variables added to the environment of cmake/ninja/launcher (on top of settings.env;
    #: a remote cache storage's may hold credentials: kept out of repr)
    env_overrides: Mapping[str, str] = field(repr=False)
    env: Mapping[str, str] = field(repr=False)
    launcher: Tool | None = None
    spot_check_env: Mapping[str, str] = field(default_factory=dict)
    spot_check_args: tuple[str, ...] = ()
    stamp: Mapping[str, Any] = field(default_factory=dict)
    #: where each choice came from, e.g. {"CMAKE_CUDA_ARCHITECTURES": "detected (nvidia-smi)"}
    provenance: Mapping[str, str] = field(default_factory=dict)
    #: where the compiler cache keeps objects (None without a launcher)
    cache_storage: CacheStorage | None = None
    #: the whole environment of a build with the local cache, when the remote cannot be reached
    cache_fallback_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def stamp_path(self) -> Path:
        return self.build_dir / STAMP_NAME

    def define(self, name: str) -> str | None:
        for d in self.defines:
            if d.name == name:
                return d.value
        return None


def split_cmake_args(args: Sequence[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """``-DNAME[:TYPE]=VALUE`` args -> {NAME: VALUE} (last wins); the rest in order."""
    defines: dict[str, str] = {}
    rest: list[str] = []
    pending_d = False
    for raw in args:
        arg = raw
        if pending_d:
            arg = "-D" + raw
            pending_d = False
        elif raw == "-D":
            pending_d = True
            continue
        m = _DEFINE_ARG.match(arg)
        if m:
            defines[m.group(1)] = m.group(2)
        else:
            rest.append(arg)
    return defines, tuple(rest)


#: [tool.skippy.build] keys of every build, besides those each backend reads
COMMON_TABLE_KEYS: Final = frozenset({"native", "jobs", "compiler_cache", "cache_storage"})


def build_table_keys() -> frozenset[str]:
    """Every key [tool.skippy.build] may hold: the common ones and each registered backend's."""
    return COMMON_TABLE_KEYS.union(*(b.table_keys for b in registry().values()))


def _build_table(settings: Settings) -> Mapping[str, Any]:
    return settings.subtable("build", build_table_keys(), example="jobs = 2")


def requested_defines(settings: Settings, options: BuildOptions, backend: Backend) -> dict[str, str]:
    """The -D values the user asked for: [tool.skippy.build] and the environment (read by the
    backend they concern), then the command line's -D values (last wins, any backend)."""
    out = spec(backend).requested(_build_table(settings), settings.env)
    given, _ = split_cmake_args(options.cmake_args)
    out.update(given)
    return out


def _digest(payload: Mapping[str, Any]) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


#: cache variables of the queue's provenance patch (upstream commit, queue digest)
PROVENANCE_DEFINES: tuple[str, str] = ("SKIPPY_UPSTREAM_SHA", "SKIPPY_QUEUE_DIGEST")


def plan_build(
    backend: Backend,
    settings: Settings,
    *,
    tree: TreeInfo,
    toolchain: Toolchain,
    patched_sha: str,
    options: BuildOptions | None = None,
    upstream_sha: str | None = None,
    queue_digest: str | None = None,
    build_number: int | None = None,
) -> BuildPlan:
    """Everything a build of ``backend`` will do, computed without running anything.

    ``upstream_sha``/``queue_digest`` are passed to trees whose queue reports build
    provenance (they declare ``SKIPPY_UPSTREAM_SHA``/``SKIPPY_QUEUE_DIGEST``); they are
    kept out of the build-dir digest, so a queue change reuses the dir (and its objects).
    """
    options = options or BuildOptions()
    s = spec(backend)
    given = requested_defines(settings, options, s.name)
    _, extra_args = split_cmake_args(options.cmake_args)
    provenance: dict[str, str] = {}

    values: dict[str, Define] = {}

    def put(name: str, value: str, *, path: bool = False, source: str | None = None) -> None:
        values[name] = Define(name, value, path=path)
        if source:
            provenance[name] = source

    for name, value in COMMON_DEFINES.items():
        put(name, value)
    for name, value in TREE_OPTIONAL_DEFINES.items():
        if name in tree.options:
            put(name, value)
    for name, value in {**switches(s.name), **s.extra_defines}.items():
        put(name, value)
    if settings.on_ci or not _native(settings):
        # portable code: the same binaries (and compiler cache) locally and on CI, and no
        # -march=native paths a VM cannot run (AMX tiles fault in llama-server on some hosts)
        put("GGML_NATIVE", "OFF", source="CI" if settings.on_ci else "default (opt in with native = true)")
    put("CMAKE_MAKE_PROGRAM", toolchain.ninja.path, path=True)
    if upstream_sha and tree.build_info_overridable:
        # the tree would ask git for HEAD: every new patched commit would change libllama's
        # compile definitions and recompile all of it. Name the upstream commit instead (the
        # queue is named by the provenance below); kept out of the build-dir digest.
        put("LLAMA_BUILD_COMMIT", upstream_sha[:12], path=True, source="upstream commit")
        put("LLAMA_BUILD_NUMBER", str(build_number or 0), path=True, source="upstream commit count")
    if upstream_sha and queue_digest and set(PROVENANCE_DEFINES) <= tree.options:
        put(PROVENANCE_DEFINES[0], upstream_sha, path=True, source="queue provenance")
        put(PROVENANCE_DEFINES[1], queue_digest, path=True, source="queue provenance")

    facts = toolchain.plan_facts(given, tree.source_dir)
    for choice in s.choices(facts):
        put(choice.name, choice.value, path=choice.path, source=choice.source)
    backend_env = dict(s.env_overrides(facts))
    env_overrides: dict[str, str] = dict(backend_env)
    launcher = toolchain.launcher
    storage: CacheStorage | None = None
    fallback_env: dict[str, str] = {}
    if launcher is not None:
        languages = [lang for lang in s.languages if lang in tree.languages or lang in ("C", "CXX")]
        for lang in languages:
            put(f"CMAKE_{lang}_COMPILER_LAUNCHER", launcher.path, path=True, source=launcher.name)
        storage = select_storage(_build_table(settings).get("cache_storage"), settings.env)
        env_overrides.update(launcher_env(launcher.name, settings.cache_dir, storage))
        if storage.remote and launcher.name == "sccache":
            # a remote that cannot be reached: the same build with the local directory
            local = launcher_env(launcher.name, settings.cache_dir)
            fallback_env = {**local_fallback_env(settings.env), **backend_env, **local}

    # the user's -D values win over everything above
    path_like = {name for name, d in values.items() if d.path}
    for name, value in given.items():
        put(name, value, path=name in path_like or name.endswith(("_DIR", "_COMPILER", "_LAUNCHER")))
        provenance.setdefault(name, "given")
        if provenance[name].startswith(("default", "detected")):
            provenance[name] = "given"

    defines = tuple(sorted(values.values(), key=lambda d: d.name))
    identity: dict[str, Any] = {
        "backend": s.name,
        "generator": GENERATOR,
        "defines": [[d.name, d.value] for d in defines if not d.path],
        "path_defines": [d.name for d in defines if d.path],
        "extra": list(extra_args),
    }
    if toolchain.facts.get("toolkit"):
        # a backend toolkit's kind and version (e.g. CUDA from wheels): another toolkit, another dir
        identity["toolkit"] = toolchain.facts["toolkit"]
    digest = _digest(identity)
    build_root = settings.build_root
    source_dir = tree.source_dir
    if _inside(build_root, source_dir):
        raise BuildError(
            f"build_root {build_root} is inside the source tree {source_dir}",
            untouched="everything: nothing was configured or built",
            next_step="set [tool.skippy] build_root to a directory outside the llama.cpp tree",
        )
    build_dir = build_root / f"{s.name}-{digest}"
    if storage is not None and launcher is not None:
        env_overrides.update(shared_cache_env(storage, launcher.name, settings.env, (source_dir, build_dir)))

    rpc_target = tree.rpc_target or RPC_TARGETS[0]
    targets = tuple(rpc_target if t in RPC_TARGETS else t for t in s.default_targets)
    configure_argv = (
        toolchain.cmake.path,
        "-S",
        str(source_dir),
        "-B",
        str(build_dir),
        "-G",
        GENERATOR,
        *(d.arg for d in defines),
        *extra_args,
    )
    jobs = options.jobs if options.jobs is not None else _table_jobs(settings)
    build_argv = (
        toolchain.ninja.path,
        "-C",
        str(build_dir),
        *(("-j", str(jobs)) if jobs else ()),
        *targets,
    )
    binaries = {t: build_dir / "bin" / t for t in targets}
    expectations = {d.name: d.value for d in defines if not d.path}
    stamp = {
        "schema": STAMP_SCHEMA,
        "backend": s.name,
        "patched_sha": patched_sha,
        "generator": GENERATOR,
        "source_dir": str(source_dir),
        "configure_args": [d.arg for d in defines] + list(extra_args),
        "tools": toolchain.tool_versions(),
    }
    spot_env = {k: v.replace("{cache_dir}", str(settings.cache_dir)) for k, v in s.spot_check_env.items()}
    return BuildPlan(
        backend=s.name,
        source_dir=source_dir,
        build_dir=build_dir,
        digest=digest,
        defines=defines,
        extra_args=extra_args,
        configure_argv=configure_argv,
        build_argv=build_argv,
        targets=targets,
        rpc_target_known=tree.rpc_target is not None,
        binaries=MappingProxyType(binaries),
        expectations=MappingProxyType(expectations),
        env_overrides=MappingProxyType(env_overrides),
        env=MappingProxyType({**settings.env, **env_overrides}),
        launcher=launcher,
        spot_check_env=MappingProxyType(spot_env),
        spot_check_args=s.spot_check_args,
        stamp=MappingProxyType(stamp),
        provenance=MappingProxyType(provenance),
        cache_storage=storage,
        cache_fallback_env=MappingProxyType(fallback_env),
    )


def _native(settings: Settings) -> bool:
    """``SKIPPY_NATIVE=1`` or ``[tool.skippy.build] native = true``: let ggml use -march=native."""
    value = settings.env.get("SKIPPY_NATIVE")
    if value:
        return value.lower() in ("1", "true", "yes", "on")
    return bool(_build_table(settings).get("native", False))


def _table_jobs(settings: Settings) -> int | None:
    value = settings.env.get("SKIPPY_BUILD_JOBS") or _build_table(settings).get("jobs")
    try:
        return int(value) if value else None
    except (TypeError, ValueError):
        return None


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def launcher_env(kind: str, cache_dir: Path, storage: CacheStorage | None = None) -> dict[str, str]:
    """Environment for the compiler cache: its store under ``cache_dir``, or the remote
    ``storage`` in sccache's own variables (served by a server of its own)."""
    if kind == "sccache":
        env = {"SCCACHE_DIR": str(cache_dir / "sccache")}
        # a server of our own, so SCCACHE_DIR is honoured and the stats are ours; one per
        # storage, so a running server with another storage is never reused
        tag = storage.socket_tag() if storage is not None else ""
        sock = cache_dir / (f"sccache-{tag}.sock" if tag else "sccache.sock")
        if len(str(sock)) <= _UDS_MAX:
            env["SCCACHE_SERVER_UDS"] = str(sock)
        else:
            # too long for a Unix socket: a loopback port derived from the cache dir
            seed = int(hashlib.sha256((str(cache_dir) + tag).encode()).hexdigest()[:8], 16)
            env["SCCACHE_SERVER_PORT"] = str(20000 + seed % 20000)
        if storage is not None:
            env.update(storage.env)
        return env
    if kind == "ccache":
        return {"CCACHE_DIR": str(cache_dir / "ccache")}
    return {}


# --- configure decision (pure) ----------------------------------------------------


@dataclass(frozen=True)
class ConfigureDecision:
    needed: bool
    #: remove CMakeCache.txt and CMakeFiles/ first
    wipe: bool
    reason: str


def parse_cmake_cache(text: str) -> dict[str, str]:
    """``NAME:TYPE=VALUE`` lines of CMakeCache.txt -> {NAME: VALUE}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith(("#", "//")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.partition(":")[0]] = value
    return out


def decide_configure(
    plan: BuildPlan,
    *,
    stamp: Mapping[str, Any] | None,
    cache: Mapping[str, str] | None,
    has_build_ninja: bool,
    exists: Callable[[str], bool],
) -> ConfigureDecision:
    if cache is None:
        return ConfigureDecision(True, False, "new build directory")
    generator = cache.get("CMAKE_GENERATOR", "")
    if generator != GENERATOR:
        return ConfigureDecision(True, True, f"generator mismatch: the cache says {generator!r}")
    home = cache.get("CMAKE_HOME_DIRECTORY")
    if home and Path(home) != plan.source_dir:
        return ConfigureDecision(True, True, f"the cache was made for another source tree ({home})")
    for key, label in (("CMAKE_COMMAND", "cmake"), ("CMAKE_MAKE_PROGRAM", "ninja")):
        tool = cache.get(key)
        if tool and not exists(tool):
            return ConfigureDecision(True, True, f"the {label} this dir was configured with is gone ({tool})")
    if not has_build_ninja:
        return ConfigureDecision(True, True, "the last configure did not finish (no build.ninja)")
    if stamp is None:
        return ConfigureDecision(True, True, "no stamp (configured outside skippy)")
    changed = [key for key in sorted(set(stamp) | set(plan.stamp)) if stamp.get(key) != plan.stamp.get(key)]
    if changed:
        labels = {
            "patched_sha": "the patched tree changed",
            "configure_args": "the configure arguments changed",
            "tools": "the tools changed",
        }
        return ConfigureDecision(True, True, "; ".join(labels.get(k, f"{k} changed") for k in changed))
    return ConfigureDecision(False, False, "up to date")


def parse_unused_variables(output: str) -> list[str]:
    """Names under CMake's "Manually-specified variables were not used by the project:"."""
    names: list[str] = []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "Manually-specified variables were not used by the project" not in line:
            continue
        started = False
        for follow in lines[i + 1 :]:
            token = follow.strip()
            if not token:
                if started:
                    break
                continue
            if not follow.startswith((" ", "\t")) or " " in token:
                break
            started = True
            names.append(token)
    return names


def _normalize(value: str) -> str:
    upper = value.strip().upper()
    if upper in _TRUE:
        return "ON"
    if upper in _FALSE:
        return "OFF"
    return value.strip()


def cache_mismatches(expectations: Mapping[str, str], cache: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{name: (wanted, in force)} for every expectation CMakeCache.txt does not hold."""
    out: dict[str, tuple[str, str]] = {}
    for name, wanted in expectations.items():
        actual = cache.get(name)
        if actual is None or _normalize(actual) != _normalize(wanted):
            out[name] = (wanted, "<unset>" if actual is None else actual)
    return out


# --- execute ------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheStats:
    tool: str
    hits: int
    misses: int
    #: the storage that served this build (redacted), e.g. "local directory", "redis redis://host:6379"
    storage: str | None = None
    #: per language, in the cache's own names ("C/C++", "CUDA" ...): (hits, misses)
    languages: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: why the configured remote storage was not used (the local directory served instead)
    fallback: str | None = None

    @property
    def requests(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.requests if self.requests else None

    def render(self) -> str:
        rate = self.hit_rate
        pct = f"{rate * 100:.0f}%" if rate is not None else "n/a"
        where = f" ({self.storage})" if self.storage else ""
        line = f"{self.tool}{where}: {self.hits} hits, {self.misses} misses ({pct} hit rate)"
        if len(self.languages) > 1:
            line += "; " + ", ".join(f"{lang} {h}/{h + m}" for lang, (h, m) in sorted(self.languages.items()))
        return line

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "hits": self.hits,
            "misses": self.misses,
            "storage": self.storage,
            "languages": {lang: {"hits": h, "misses": m} for lang, (h, m) in sorted(self.languages.items())},
            "fallback": self.fallback,
        }


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
        }


def sccache_counts(stats_json: str) -> tuple[int, int]:
    by_language = sccache_languages(stats_json)
    return sum(h for h, _ in by_language.values()), sum(m for _, m in by_language.values())


def sccache_languages(stats_json: str) -> dict[str, tuple[int, int]]:
    """``sccache --show-stats --stats-format=json`` -> {language: (hits, misses)}."""
    data = json.loads(stats_json)
    stats = data.get("stats", {})
    hits = {k: int(v) for k, v in stats.get("cache_hits", {}).get("counts", {}).items()}
    misses = {k: int(v) for k, v in stats.get("cache_misses", {}).get("counts", {}).items()}
    return {lang: (hits.get(lang, 0), misses.get(lang, 0)) for lang in sorted(set(hits) | set(misses))}


def ccache_counts(print_stats: str) -> tuple[int, int]:
    """``ccache --print-stats`` (tab-separated key/value) -> (hits, misses)."""
    values: dict[str, int] = {}
    for line in print_stats.splitlines():
        key, _, value = line.partition("\t")
        with contextlib.suppress(ValueError):
            values[key.strip()] = int(value.strip())
    hits = values.get("direct_cache_hit", 0) + values.get("preprocessed_cache_hit", 0)
    return hits, values.get("cache_miss", 0)


class _CacheProbe:
    """Zero the compiler cache's counters before a build, read them after.

    With a remote storage, ``before`` checks that it can be reached (bounded) and
    starts sccache's server with it; when either fails, the build goes on with the
    local directory and a warning naming the storage (redacted).
    """

    #: seconds sccache may take to start its server with a remote storage
    START_TIMEOUT: Final = 30.0

    def __init__(self, plan: BuildPlan, console: Console) -> None:
        self.plan = plan
        self.console = console
        #: the environment the build runs with (the plan's, or the local fallback)
        self.env: Mapping[str, str] = plan.env
        self.fallback: str | None = None
        #: sccache may bring the remote's server up after its start timed out: stop it after the build
        self._stray_server = False

    def _run(self, *args: str, timeout: float = 120) -> proc.Result | None:
        launcher = self.plan.launcher
        if launcher is None:
            return None
        return proc.run([launcher.path, *args], env=self.env, check=False, timeout=timeout)

    @property
    def _storage(self) -> CacheStorage | None:
        return self.plan.cache_storage

    def before(self) -> Mapping[str, str]:
        """Prepare the cache; returns the environment the build must run with."""
        launcher = self.plan.launcher
        if launcher is None:
            return self.env
        for env in (self.plan.env_overrides, self.plan.cache_fallback_env):
            for key in ("SCCACHE_DIR", "CCACHE_DIR"):
                if key in env:
                    Path(env[key]).mkdir(parents=True, exist_ok=True)
            if "SCCACHE_SERVER_UDS" in env:
                Path(env["SCCACHE_SERVER_UDS"]).parent.mkdir(parents=True, exist_ok=True)
        storage = self._storage
        if storage is not None and storage.remote:
            if launcher.name != "sccache":
                self.console.warn(
                    f"compiler cache: {storage.description} ({storage.source}) is used through sccache only; "
                    f"{launcher.name} builds with its local directory"
                )
                self.fallback = f"{launcher.name} has no remote storage here"
            else:
                self._start_remote(storage)
                return self.env
        # sccache starts its server on the first request (a second --start-server
        # would start a rival server on the same socket)
        if launcher.name in ("sccache", "ccache"):
            self._run("--zero-stats")
        return self.env

    def _start_remote(self, storage: CacheStorage) -> None:
        why = reachable(storage)
        if why is None:
            started = self._run("--zero-stats", timeout=self.START_TIMEOUT)
            if started is None or not started.ok:
                why = "sccache could not start with it: " + storage.scrub(
                    started.tail(3) if started is not None else "no launcher"
                )
                self._run("--stop-server", timeout=30)
                self._stray_server = True
        if why is None:
            return
        self.fallback = why
        self.console.warn(
            f"compiler cache: {storage.description} ({storage.source}) cannot be used: {why}; "
            "building with the local cache"
        )
        self.env = self.plan.cache_fallback_env or local_fallback_env(self.plan.env)
        self._run("--zero-stats")

    def after(self) -> CacheStats | None:
        launcher = self.plan.launcher
        if launcher is None:
            return None
        if self._stray_server:
            proc.run([launcher.path, "--stop-server"], env=self.plan.env, check=False, timeout=30)
        storage = self._storage
        served = "local directory"
        if storage is not None and storage.remote and self.fallback is None:
            served = storage.description
        languages: dict[str, tuple[int, int]] = {}
        try:
            if launcher.name == "sccache":
                result = self._run("--show-stats", "--stats-format=json")
                if result is None or not result.ok:
                    return None
                try:
                    languages = sccache_languages(result.stdout)
                except ValueError:
                    text = storage.scrub(result.tail(5)) if storage is not None else result.tail(5)
                    raise ValueError(f"not JSON: {text!r}") from None
                hits, misses = sccache_counts(result.stdout)
            elif launcher.name == "ccache":
                result = self._run("--print-stats")
                if result is None or not result.ok:
                    return None
                hits, misses = ccache_counts(result.stdout)
            else:
                return None
        except (ValueError, KeyError, AttributeError) as exc:
            self.console.warn(f"could not read {launcher.name} statistics: {exc}")
            return None
        return CacheStats(launcher.name, hits, misses, storage=served, languages=languages, fallback=self.fallback)


def stop_cache_server(plan: BuildPlan) -> None:
    """Stop the sccache server(s) a build of ``plan`` started (tests, benchmarks)."""
    if plan.launcher is not None and plan.launcher.name == "sccache":
        for env in (plan.env, plan.cache_fallback_env):
            if env:
                proc.run([plan.launcher.path, "--stop-server"], env=env, check=False, timeout=60)


def read_stamp(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def newest_builds(build_root: Path) -> dict[str, dict[str, Any]]:
    """The newest build dir of each backend under ``build_root`` (by its stamp): where its
    binaries are, the patched commit it was built from, when."""
    found: dict[str, dict[str, Any]] = {}
    stamps = sorted(build_root.glob(f"*/{STAMP_NAME}"), key=lambda p: p.stat().st_mtime)
    for path in stamps:  # oldest first: the newest of a backend wins
        stamp = read_stamp(path)
        if stamp is None or not isinstance(stamp.get("backend"), str):
            continue
        bin_dir = path.parent / "bin"
        found[stamp["backend"]] = {
            "build_dir": str(path.parent),
            "patched_sha": stamp.get("patched_sha"),
            "binaries": {p.name: str(p) for p in sorted(bin_dir.iterdir()) if p.is_file()} if bin_dir.is_dir() else {},
            "built": int(path.stat().st_mtime),
        }
    return found


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


def execute_plan(plan: BuildPlan, console: Console, *, build: bool = True) -> BuildReport:
    """Configure (when the stamp says so) and build; returns timings and cache figures.

    ``build=False`` stops after configure and its checks (no binaries).
    """
    build_dir = plan.build_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    cache_file = build_dir / "CMakeCache.txt"
    cache = (
        parse_cmake_cache(cache_file.read_text(encoding="utf-8", errors="replace")) if cache_file.is_file() else None
    )
    decision = decide_configure(
        plan,
        stamp=read_stamp(plan.stamp_path),
        cache=cache,
        has_build_ninja=(build_dir / "build.ninja").is_file(),
        exists=lambda p: Path(p).exists(),
    )
    configure_time: list[float] = []
    build_time: list[float] = []
    targets = plan.targets
    show = console.info

    if decision.needed:
        if decision.wipe:
            console.info(f"reconfiguring {build_dir.name}: {decision.reason}")
            _wipe_cache(build_dir)
        with _timed(console, f"configure {plan.backend} ({decision.reason})", configure_time):
            try:
                result = proc.run(plan.configure_argv, env=plan.env, on_line=show, echo=console.command)
            except CommandError as exc:
                raise _build_error(
                    exc,
                    "CMake configure failed",
                    plan,
                    f"read the CMake error above, fix it, and rerun `nox -s build-{plan.backend}`",
                ) from None
            unused = parse_unused_variables(result.stdout + "\n" + result.stderr)
            if unused:
                plan.stamp_path.unlink(missing_ok=True)
                raise BuildError(
                    f"CMake did not use these -D variables: {', '.join(unused)}",
                    untouched=f"the source tree; {build_dir} is configured but not built",
                    next_step="remove or rename them (a typo, or an option this llama.cpp tree no longer has)",
                    details="CMake: Manually-specified variables were not used by the project",
                )
            cache = parse_cmake_cache(cache_file.read_text(encoding="utf-8", errors="replace"))
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
            if not plan.rpc_target_known:
                targets = _resolve_rpc_target(plan, console)
            plan.stamp_path.write_text(json.dumps(dict(plan.stamp), indent=2, sort_keys=True) + "\n", "utf-8")
    else:
        console.info(f"{build_dir.name}: configure up to date (stamp matches)")
        if not plan.rpc_target_known:
            targets = _resolve_rpc_target(plan, console)

    if not build:
        return BuildReport(
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
        )
    build_argv = plan.build_argv
    if targets != plan.targets:
        build_argv = tuple(a for a in plan.build_argv if a not in plan.targets) + targets
    probe = _CacheProbe(plan, console)
    build_env = probe.before()
    compiled = 0
    steps = 0

    def on_line(line: str) -> None:
        nonlocal compiled, steps
        if line.startswith("["):
            steps += 1
            if COMPILE_LINE.match(line):
                compiled += 1
        show(line)

    with _timed(console, f"build {plan.backend}: {' '.join(targets)}", build_time):
        try:
            proc.run(build_argv, env=build_env, on_line=on_line, echo=console.command)
        except CommandError as exc:
            raise _build_error(
                exc,
                "the build failed",
                plan,
                f"fix the compile error above and rerun `nox -s build-{plan.backend}`",
            ) from None
    stats = probe.after()
    if stats is not None:
        console.info(stats.render())
    binaries = {t: build_dir / "bin" / t for t in targets}
    missing = [str(p) for p in binaries.values() if not p.is_file()]
    if missing:
        raise BuildError(
            f"the build finished but did not produce {', '.join(missing)}",
            untouched=f"the source tree; {build_dir} is kept",
            next_step="check that the targets still exist in this llama.cpp tree (ninja -t targets all)",
        )
    return BuildReport(
        backend=plan.backend,
        build_dir=build_dir,
        configured=decision.needed,
        configure_reason=decision.reason,
        configure_seconds=sum(configure_time),
        build_seconds=sum(build_time),
        compiled=compiled,
        steps=steps,
        binaries=MappingProxyType(binaries),
        cache=stats,
    )


def _resolve_rpc_target(plan: BuildPlan, console: Console) -> tuple[str, ...]:
    result = proc.run([plan.build_argv[0], "-C", str(plan.build_dir), "-t", "targets", "all"], env=plan.env, check=True)
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


__all__ = [
    "BuildOptions",
    "BuildPlan",
    "BuildReport",
    "CacheStats",
    "Define",
    "execute_plan",
    "plan_build",
]
