"""The verdicts on the tests that failed twice: red upstream (the baseline fails them too) or
broken by the queue, with the patch each is blamed on."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from filelock import FileLock

from skippy.core.errors import NotPrepared
from skippy.core.git import Repo
from skippy.flows.upstream_tests import ctest
from skippy.flows.upstream_tests.aside import AsideTree, queue_commits
from skippy.flows.upstream_tests.baseline import _Baseline, build_only
from skippy.flows.upstream_tests.bisect import _attribute
from skippy.flows.upstream_tests.report import Blame, Status
from skippy.flows.upstream_tests.tree import _Tree
from skippy.queue import workdir as wd


@dataclass
class _Verdicts:
    baseline: str
    #: tests that fail on the unpatched pin too
    red_upstream: frozenset[str] = frozenset()
    judged: bool = False
    blames: dict[str, Blame] = field(default_factory=dict)
    baseline_seconds: float = 0.0
    attribution_seconds: float = 0.0

    def status(self, name: str, verdict: ctest.Verdict) -> Status:
        if verdict != "failed":
            return verdict
        if not self.judged:
            return "failed"
        return "red upstream" if name in self.red_upstream else "broken by the queue"


def _judge(
    tree: _Tree,
    patched_sha: str,
    *,
    failed: Sequence[str],
    own: Sequence[str],
    results: Mapping[str, ctest.Result],
    budget: float,
) -> _Verdicts:
    """The baseline for ``failed`` (cached per upstream commit), then the blame of each test it passes."""
    settings = tree.settings
    stamp = wd.read_stamp(wd.git_dir_of(settings.workdir) or settings.workdir / ".git")
    if stamp is None or stamp.patched_sha != patched_sha:
        raise NotPrepared(
            f"the workdir {settings.workdir} is not the prepared tree {patched_sha[:12]}",
            untouched="the workdir; the tests' build dir is kept",
            next_step="invoke prepare --pinned",
        )
    aside = AsideTree(settings, settings.workdir)
    repo = Repo(settings.workdir, settings.env)
    build_patches = build_only(repo, queue_commits(repo, stamp.base_commit, patched_sha))
    (settings.cache_dir / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(settings.cache_dir / "locks" / "upstream-tests.lock")):
        start = time.monotonic()
        base = _Baseline(tree, aside, stamp.base_commit, own)
        known = base.results(failed, build_patches)
        suspects = [n for n in failed if known[n].verdict == "failed"]
        if base.applied and suspects:
            # a test that fails with the build-only patches is red upstream only if it fails on the bare pin
            bare = base.results(suspects, ())
            red = frozenset(n for n in suspects if bare[n].verdict == "failed")
        else:
            red = frozenset(suspects)
        verdicts = _Verdicts(
            baseline="; ".join(base.said),
            red_upstream=red,
            judged=True,
            baseline_seconds=time.monotonic() - start,
        )
        start = time.monotonic()
        verdicts.blames = _attribute(
            tree,
            aside,
            repo,
            span=(stamp.base_commit, patched_sha),
            broken=[n for n in failed if n not in verdicts.red_upstream],
            own=own,
            tip=results,
            budget=budget,
        )
        verdicts.attribution_seconds = time.monotonic() - start
    return verdicts
