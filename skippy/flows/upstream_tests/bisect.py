"""The blame: a bisection over the prepared commits names the first patch whose application makes a test fail."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from skippy.core.git import Repo
from skippy.flows.upstream_tests import ctest
from skippy.flows.upstream_tests.aside import AsideTree, queue_commits
from skippy.flows.upstream_tests.report import Blame
from skippy.flows.upstream_tests.tree import _Tree


def bisect_first_failing(
    count: int, fails_at: Callable[[int], bool], *, deadline: float, clock: Callable[[], float] = time.monotonic
) -> tuple[int, int, bool]:
    """Prefix 0 passes and prefix ``count`` fails: the smallest failing prefix.

    Returns ``(good, bad, finished)``: ``bad`` is the first failing prefix when ``finished``,
    else the bisection stopped at the deadline with the answer in ``good+1 .. bad``.
    """
    good, bad = 0, count
    while bad - good > 1:
        if clock() > deadline:
            return good, bad, False
        mid = (good + bad) // 2
        if fails_at(mid):
            bad = mid
        else:
            good = mid
    return good, bad, True


def _attribute(
    tree: _Tree,
    aside: AsideTree,
    repo: Repo,
    *,
    span: tuple[str, str],
    broken: Iterable[str],
    own: Sequence[str],
    tip: Mapping[str, ctest.Result],
    budget: float,
) -> dict[str, Blame]:
    """Bisect the prepared commits for each broken test (probes shared between tests; the
    whole queue's results, ``tip``, are the last probe)."""
    names = list(broken)
    if not names:
        return {}
    commits = queue_commits(repo, *span)
    if not commits:
        why = "the prepared tree is its base (the queue adds no commit): nothing to bisect"
        return {name: Blame(None, None, gave_up=why) for name in names}
    deadline = time.monotonic() + budget
    probes: dict[int, dict[str, ctest.Result]] = {len(commits): dict(tip)}

    def probe(k: int) -> dict[str, ctest.Result]:
        if k not in probes:
            commit = commits[k - 1].sha
            with tree.console.step(f"attribution: {', '.join(names)} after patch {k}/{len(commits)}"):
                _, run, _ = tree.build_and_run(
                    tree.configured(aside.at(commit), commit, "attribution", aside=True), names, own
                )
            probes[k] = run.by_name()
        return probes[k]

    blames: dict[str, Blame] = {}
    for name in names:

        def fails_at(k: int, name: str = name) -> bool:
            found = probe(k).get(name)
            return found is not None and found.verdict == "failed"

        good, bad, finished = bisect_first_failing(len(commits), fails_at, deadline=deadline)
        if finished:
            first = commits[bad - 1]
            out = probes[bad][name].output if name in probes[bad] else ""
            blames[name] = Blame(first.label, first.sha, out, probes=len(probes))
        else:
            suspects = ", ".join(c.label for c in commits[good:bad])
            blames[name] = Blame(
                None,
                None,
                gave_up=f"the {budget:.0f} s budget ran out; the first failing patch is one of: {suspects}",
                probes=len(probes),
            )
    return blames
