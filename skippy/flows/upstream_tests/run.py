"""Upstream's tests run: CTest on the patched tree (the baseline and the blame when something
fails twice), or a GPU backend's ops against the CPU."""

from __future__ import annotations

import re
from typing import Final

from skippy.compile.builder import execute_plan
from skippy.core import specs
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.upstream_tests import backend_ops
from skippy.flows.upstream_tests.report import TestOutcome, UpstreamTestsReport
from skippy.flows.upstream_tests.tree import Subject, _Tree
from skippy.flows.upstream_tests.verdicts import _judge, _Verdicts
from skippy.queue.model import Queue, load_queue

#: upstream's program that compares a device's ops with the CPU's
BACKEND_OPS_TARGET: Final = "test-backend-ops"


def budget_of(settings: Settings, key: str) -> float:
    """``[tool.skippy.upstream_tests]`` ``attribution_budget`` / ``ops_budget`` (or its variable)."""
    names = [s.key for s in specs.UPSTREAM_TESTS]
    table = settings.subtable("upstream_tests", names, example="ops_budget = 600")
    return float(specs.value(specs.UPSTREAM_TESTS, key, table, settings.env, where="[tool.skippy.upstream_tests]"))


#: a new file under tests/ in a patch: the queue's own test (its target is the file's stem)
_NEW_TEST = re.compile(r"^--- /dev/null\n\+\+\+ b/tests/([A-Za-z0-9_.-]+)\.(?:c|cpp)$", re.MULTILINE)


def own_test_targets(queue: Queue) -> tuple[str, ...]:
    """The test executables the queue's patches add (a new ``tests/<name>.c(pp)``)."""
    found: list[str] = []
    for patch in queue.patches:
        text = patch.data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        found.extend(m.group(1) for m in _NEW_TEST.finditer(text) if m.group(1) not in found)
    return tuple(found)


def run_backend_ops(
    backend: str,
    settings: Settings,
    console: Console,
    subject: Subject,
    *,
    device: str,
) -> UpstreamTestsReport:
    """A GPU backend's share of upstream's tests: its ops against the CPU on ``device``
    (``test-backend-ops``, the one upstream test that exercises a device; ``ctest -L main``
    runs on the CPU build)."""
    tree = _Tree(backend, settings, console, subject)
    tests = tree.patched()
    plan = tests.plan
    report = execute_plan(tree.programs(tests, [BACKEND_OPS_TARGET]), console)
    env = {**plan.env, **plan.spot_check_env}
    seconds = budget_of(settings, "ops_budget")
    with console.step(f"test-backend-ops on {device}: {len(backend_ops.MODEL_OPS)} ops, {seconds:.0f} s time box"):
        ops = backend_ops.run_ops(report.binaries[BACKEND_OPS_TARGET], device, env, budget=seconds)
    return UpstreamTestsReport(
        backend,
        subject.upstream_sha,
        plan.build_dir,
        report,
        sum(o.seconds for o in ops),
        (),
        baseline="not needed (ctest -L main runs on the CPU build)",
        ops=ops,
        ops_device=device,
    )


def run_upstream_tests(
    backend: str,
    settings: Settings,
    console: Console,
    subject: Subject,
    *,
    prepared: bool = True,
) -> UpstreamTestsReport:
    """Build and run upstream's tests on the workdir; when some fail, the baseline and the blame.

    ``prepared=False`` (the workdir as it stands): failures are reported as failed, with no
    baseline and no blame, since no prepared base says what the queue changed.
    """
    own = own_test_targets(load_queue(settings.patch_dir))
    tree = _Tree(backend, settings, console, subject)
    patched_sha = subject.patched_sha
    patched = tree.patched()
    plan = patched.plan
    report, run, chosen = tree.build_and_run(patched, None, own)
    own_names = {c.name for c in chosen if c.target in own}
    results = {r.name: r for r in run.results if not r.setup}
    failed = sorted(n for n, r in results.items() if r.verdict == "failed")
    flaky: frozenset[str] = frozenset()
    if failed:
        # a failure must hold on the same tree before a baseline is built for it: run those again
        again = tree.run(plan, failed).by_name()
        flaky = frozenset(n for n in failed if n in again and again[n].verdict == "passed")
        failed = [n for n in failed if n not in flaky]
    verdict = _Verdicts(baseline="not needed (nothing failed twice)" if flaky else "not needed (nothing failed)")
    if failed and not prepared:
        verdict = _Verdicts(baseline="not run (the workdir as it stands has no prepared base to compare with)")
    elif failed:
        verdict = _judge(
            tree, patched_sha, failed=failed, own=own, results=results, budget=budget_of(settings, "attribution_budget")
        )
    tests = tuple(
        TestOutcome(
            name,
            "flaky" if name in flaky else verdict.status(name, r.verdict),
            r.seconds,
            r.output,
            own=name in own_names,
            blame=verdict.blames.get(name),
        )
        for name, r in results.items()
    )
    return UpstreamTestsReport(
        backend,
        subject.upstream_sha,
        plan.build_dir,
        report,
        run.seconds,
        tests,
        baseline=verdict.baseline,
        baseline_seconds=verdict.baseline_seconds,
        attribution_seconds=verdict.attribution_seconds,
        setups_failed=tuple(r for r in run.results if r.setup and r.verdict != "passed"),
    )
