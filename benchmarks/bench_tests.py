"""Upstream's tests on the patched tree: what ``--upstream-tests`` costs.

* the tests' build dir cold (no compiler cache) and fresh from the project's warm cache;
* ``ctest -L main`` wall time (plus the queue's own test);
* the attribution of one broken test: a copy of the queue with one more core patch that
  breaks top-k (``test-sampling``), prepared into a workdir of its own; the baseline on the
  unpatched pin, then the bisection, each timed.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_proofs import _prepared, _quiet, machine_settings, share_downloads
from skippy.compile.request import build_request
from skippy.compile.toolchain import probe_toolchain
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.upstream_tests.report import UpstreamTestsReport
from skippy.flows.upstream_tests.run import run_upstream_tests
from skippy.flows.upstream_tests.tree import Subject
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare

#: the line of src/llama-sampler.cpp the bench's breaking patch rewrites (as the e2e test does)
TOP_K_LINE = "    k = std::min(k, (int) cur_p->size);\n"


def _subject(settings: Settings) -> Subject:
    request = build_request("cpu", settings)
    stamp = wd.read_stamp(settings.workdir / ".git")
    assert stamp is not None, "the workdir is prepared"
    return Subject(
        toolchain=probe_toolchain("cpu", settings, given=request.defines),
        request=request,
        upstream_sha=stamp.upstream_sha,
        patched_sha=stamp.patched_sha,
        queue_digest=stamp.queue_digest,
        build_number=None,
    )


def _timed_tests(settings: Settings) -> tuple[UpstreamTestsReport, float]:
    started = time.perf_counter()
    report = run_upstream_tests("cpu", settings, _quiet(), _subject(settings))
    return report, time.perf_counter() - started


def _breaking_queue(settings: Settings, into: Path) -> None:
    """A copy of the project's queue plus core 0006, made on the prepared workdir."""
    shutil.copytree(settings.patch_dir, into)
    repo = Repo(settings.workdir, settings.env)
    path = settings.workdir / "src" / "llama-sampler.cpp"
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original.replace(TOP_K_LINE, "    k = std::min(k > 1 ? k - 1 : k, (int) cur_p->size);\n", 1))
        diff = repo.git("diff", "--", "src/llama-sampler.cpp").stdout
    finally:
        path.write_text(original, encoding="utf-8")
    assert diff, "the top-k line is in this tree"
    header = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: bench <bench@localhost>\nDate: Fri, 4 Dec 2026 12:00:00 +0000\n"
        "Subject: [PATCH] core: top-k keeps one token less\n\n---\n"
    )
    (into / "0006-core-top-k-keeps-one-token-less.patch").write_text(header + diff, encoding="utf-8")


def bench_upstream_tests(settings: Settings, console: Console, *, cold: bool = True) -> dict[str, Any]:
    """The figures of ``--upstream-tests`` on the CPU build (see the module docstring)."""
    _prepared(settings)
    root = settings.cache_dir.parent / "bench" / "upstream-tests"
    shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {}
    if cold:
        first = machine_settings(settings, root, "cold", SKIPPY_COMPILER_CACHE="none")
        share_downloads(settings, first)
        report, wall = _timed_tests(first)
        out["cold_no_cache"] = {"wall_s": round(wall, 1), "build_s": round(report.build.total_seconds, 1)}
    # a fresh build dir served by the project's own (warm) compiler cache
    warm = machine_settings(settings, root, "warm")
    share_downloads(settings, warm)
    (warm.cache_dir / "sccache").symlink_to((settings.cache_dir / "sccache").resolve())
    report, wall = _timed_tests(warm)
    out["fresh_dir_from_cache"] = {
        "wall_s": round(wall, 1),
        "build_s": round(report.build.total_seconds, 1),
        "hits": report.build.cache.hits if report.build.cache else None,
        "misses": report.build.cache.misses if report.build.cache else None,
    }
    out["ctest"] = {"wall_s": round(report.ctest_seconds, 1), "counts": report.counts()}
    out["attribution"] = _bench_attribution(settings, root)
    console.info(
        "upstream tests: tests build dir "
        + (f"cold {out['cold_no_cache']['build_s']:.0f} s, " if cold else "")
        + f"fresh from the cache {out['fresh_dir_from_cache']['build_s']:.0f} s; ctest -L main "
        f"{out['ctest']['wall_s']:.0f} s; one broken test: baseline {out['attribution']['baseline_s']:.0f} s, "
        f"attribution {out['attribution']['attribution_s']:.0f} s"
    )
    shutil.rmtree(root / "cold" / "build", ignore_errors=True)
    shutil.rmtree(root / "warm" / "build", ignore_errors=True)
    return out


def _bench_attribution(settings: Settings, root: Path) -> dict[str, Any]:
    queue = root / "broken-queue"
    _breaking_queue(settings, queue)
    table = {**settings.raw, "patch_dir": str(queue), "workdir": str(root / "broken" / "llama.cpp")}
    table["compat_link"] = False
    broken = Settings.from_table(settings.root, table, {k: v for k, v in settings.env.items() if k != "CI"})
    prepare(broken, Target.pinned(), console=_quiet())
    started = time.perf_counter()
    report = run_upstream_tests("cpu", broken, _quiet(), _subject(broken))
    assert not report.ok, "the breaking patch broke no test"
    wall = time.perf_counter() - started
    blamed = {t.name: t.blame.patch for t in report.tests if t.blame is not None}
    return {
        "wall_s": round(wall, 1),
        "baseline_s": round(report.baseline_seconds, 1),
        "attribution_s": round(report.attribution_seconds, 1),
        "blamed": blamed,
        "probes": max((t.blame.probes for t in report.tests if t.blame is not None), default=0),
    }
