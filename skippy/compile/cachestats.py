"""The compiler cache around one build: zero its counters, start a remote's server (or
fall back to the local directory), read the hits and misses after."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.compile.cache import CacheStorage, local_fallback_env, reachable
from skippy.compile.dist import DistCounts, DistSetup, dist_counts, parse_dist_status, probe_failure
from skippy.compile.plan import BuildPlan
from skippy.core import proc
from skippy.core.errors import CommandError
from skippy.core.ui import Console


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
    #: where the compiles ran when the build was sent to an sccache-dist cluster
    dist: DistCounts | None = None
    #: why the configured cluster was not used (every compile ran here instead)
    dist_fallback: str | None = None

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
        if self.dist is not None:
            line += f"; cluster: {self.dist.render()}"
        elif self.dist_fallback is not None:
            line += "; cluster not used: every compile ran here"
        return line

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "hits": self.hits,
            "misses": self.misses,
            "storage": self.storage,
            "languages": {lang: {"hits": h, "misses": m} for lang, (h, m) in sorted(self.languages.items())},
            "fallback": self.fallback,
            "dist": None if self.dist is None else self.dist.as_dict(),
            "dist_fallback": self.dist_fallback,
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


class CacheProbe:
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
        #: why the cluster (``dist``) was not used, when one is configured
        self.dist_fallback: str | None = None
        #: sccache may bring the remote's server up after its start timed out: stop it after the build
        self._stray_server = False

    def _run(self, *args: str, timeout: float = 120) -> proc.Result | None:
        if self.plan.launcher is None:
            return None
        # through the root's runner when the build runs inside one (its server lives there)
        return proc.run([*self.plan.launcher_argv, *args], env=self.env, check=False, timeout=timeout)

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
                self._use_cluster()
                return self.env
        # sccache starts its server on the first request (a second --start-server
        # would start a rival server on the same socket)
        if launcher.name in ("sccache", "ccache"):
            self._run("--zero-stats")
        self._use_cluster()
        return self.env

    #: seconds for ``sccache --dist-status`` (the scheduler's answer) and for the probe compile
    #: (the first one packages the compiler and sends it to a build server)
    DIST_STATUS_TIMEOUT: Final = 30.0
    DIST_PROBE_TIMEOUT: Final = 180.0

    def _use_cluster(self) -> None:
        """With a cluster configured: check it (the scheduler answers, has a build server, and
        runs a probe compile with our token); else fall back to local compiles, one warning."""
        dist = self.plan.dist
        if dist is None:
            if self.plan.dist_unused is not None:
                self.dist_fallback = self.plan.dist_unused
                self.console.warn(f"compile cluster: {self.plan.dist_unused}; compiling on this machine")
            return
        if self.fallback is not None:
            self.dist_fallback = "the build fell back to the local cache, compiled here"
            return
        why = self._cluster_problem(dist)
        if why is None:
            self._run("--zero-stats")
            return
        self.dist_fallback = why
        self.console.warn(
            f"compile cluster: {dist.cluster.description} ({dist.cluster.source}) cannot be used: {why}; "
            "compiling on this machine"
        )
        self.env = dist.fallback_env
        self._run("--zero-stats")

    def _cluster_problem(self, dist: DistSetup) -> str | None:
        try:
            status = self._run("--dist-status", timeout=self.DIST_STATUS_TIMEOUT)
        except CommandError as exc:
            return dist.cluster.scrub(str(exc))
        if status is None:
            return "no compiler cache"
        why = parse_dist_status(status.stdout + status.stderr).unusable()
        if why is not None:
            return dist.cluster.scrub(why)
        return self._probe_compile(dist)

    def _probe_compile(self, dist: DistSetup) -> str | None:
        """One tiny compile through the cluster (new text each time: never a cache hit)."""
        folder = self.plan.build_dir / "skippy-dist-probe"
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "probe.c"
        source.write_text(f"/* {secrets.token_hex(8)} */\nint skippy_dist_probe(int x) {{ return x + 1; }}\n", "utf-8")
        self._run("--zero-stats")
        argv = [*self.plan.launcher_argv, self._c_compiler(), "-c", str(source), "-o", str(folder / "probe.o")]
        try:
            done = proc.run(argv, env=self.env, cwd=folder, check=False, timeout=self.DIST_PROBE_TIMEOUT)
        except CommandError as exc:
            return dist.cluster.scrub(str(exc))
        stats = self._run("--show-stats", "--stats-format=json")
        try:
            counts = dist_counts(stats.stdout) if stats is not None and stats.ok else DistCounts()
        except ValueError:
            counts = DistCounts()
        if done.ok and counts.remote >= 1:
            return None
        return probe_failure(dist.cluster, done.tail(5) if not done.ok else "it ran on this machine instead")

    def _c_compiler(self) -> str:
        """The build's C compiler (CMakeCache.txt after configure), else ``cc``."""
        with contextlib.suppress(OSError):
            text = (self.plan.build_dir / "CMakeCache.txt").read_text("utf-8", errors="replace")
            for name in ("CMAKE_C_COMPILER", "CMAKE_CXX_COMPILER"):
                for line in text.splitlines():
                    key, _, value = line.partition("=")
                    if key.split(":")[0] == name and value.strip():
                        return value.strip()
        return "cc"

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
            proc.run([*self.plan.launcher_argv, "--stop-server"], env=self.plan.env, check=False, timeout=30)
        storage = self._storage
        served = "local directory"
        if storage is not None and storage.remote and self.fallback is None:
            served = storage.description
        try:
            read = self._read_sccache(storage) if launcher.name == "sccache" else self._read_ccache()
        except (ValueError, KeyError, AttributeError) as exc:
            self.console.warn(f"could not read {launcher.name} statistics: {exc}")
            return None
        if read is None:
            return None
        hits, misses, languages, dist = read
        return CacheStats(
            launcher.name,
            hits,
            misses,
            storage=served,
            languages=languages,
            fallback=self.fallback,
            dist=dist,
            dist_fallback=self.dist_fallback,
        )

    def _read_sccache(self, storage: CacheStorage | None) -> _Read | None:
        result = self._run("--show-stats", "--stats-format=json")
        if result is None or not result.ok:
            return None
        try:
            languages = sccache_languages(result.stdout)
        except ValueError:
            text = storage.scrub(result.tail(5)) if storage is not None else result.tail(5)
            raise ValueError(f"not JSON: {text!r}") from None
        hits, misses = sccache_counts(result.stdout)
        used = self.plan.dist is not None and self.dist_fallback is None
        return hits, misses, languages, dist_counts(result.stdout) if used else None

    def _read_ccache(self) -> _Read | None:
        if self.plan.launcher is None or self.plan.launcher.name != "ccache":
            return None
        result = self._run("--print-stats")
        if result is None or not result.ok:
            return None
        hits, misses = ccache_counts(result.stdout)
        return hits, misses, {}, None


_Read = tuple[int, int, dict[str, tuple[int, int]], DistCounts | None]


def stop_cache_server(plan: BuildPlan) -> None:
    """Stop the sccache server(s) a build of ``plan`` started (tests, benchmarks); inside its
    root when it has one (the root's mounts must still be up)."""
    if plan.launcher is not None and plan.launcher.name == "sccache":
        for env in plan.cache_server_envs:
            if env:
                proc.run([*plan.launcher_argv, "--stop-server"], env=env, check=False, timeout=60)
