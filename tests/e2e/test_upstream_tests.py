"""Upstream's own tests on the real pinned tree, and a queue that breaks one of them.

A copy of this project (as in the maintainer's week, under ``.deps/e2e/upstream-tests``, its
upstream a local mirror of the real test-bed pinned to the 0.3.35 tree, plus one upstream
commit that changes only the README) gets one more core patch, ``0006``, that makes top-k keep
one token too few: ``test-sampling`` (in ``ctest -L main``) checks exactly that; the spot
check's greedy chat does not see it.

1. ``nox -s build-cpu -- --upstream-tests`` builds upstream's tests on the patched tree and runs
   ``ctest -L main`` plus the queue's own test (``test-skippy-gemma3``). Every other test passes
   or is named red upstream / not run with its reason; ``test-sampling`` fails, passes on the
   pin (the baseline, run once and kept, with the queue's build-only patches 0003-0005 on it so
   its objects come from the compiler cache), and the bisection over the prepared
   commits names ``core/0006-...``. The session fails (skippy's exit code 15) with the report in ``--json``.
2. ``invoke pin-bump --sha <README-only commit>`` builds, runs the tests, finds the same break
   and leaves the pin where it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e import test_maintainer_week as week
from tooling.testbed import LlamaTestbed

HERE = week.ROOT / ".deps" / "e2e" / "upstream-tests"
BROKEN_TEST = "test-sampling"
PATCH = "0006-core-top-k-keeps-one-token-less.patch"
#: the line of src/llama-sampler.cpp the breaking patch rewrites
LINE = "    k = std::min(k, (int) cur_p->size);\n"


def breaking_patch(workdir: Path) -> str:
    """A commit on the prepared workdir that breaks top-k, exported as the queue's next core patch."""
    path = workdir / "src" / "llama-sampler.cpp"
    text = path.read_text(encoding="utf-8")
    assert LINE in text, "the top-k line the test breaks is in this tree"
    path.write_text(text.replace(LINE, "    k = std::min(k > 1 ? k - 1 : k, (int) cur_p->size);\n", 1))
    week.git(workdir, "commit", "--quiet", "-am", "core: top-k keeps one token less")
    patch = week.git(workdir, "format-patch", "-1", "--stdout", "--no-signature", "--zero-commit", "HEAD")
    week.git(workdir, "reset", "--quiet", "--hard", "HEAD~1")
    return patch


def upstream_report(stdout: str) -> dict[str, object]:
    report = json.loads(stdout)
    found = report.get("upstream_tests")
    assert isinstance(found, dict), report
    return found


@pytest.mark.timeout(5400)
def test_a_broken_upstream_test_is_traced_to_its_patch_and_keeps_the_pin(
    testbed: LlamaTestbed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(week, "WEEK", HERE)
    pin, _target, _line = week.make_project(testbed)
    readme_only = week.git(HERE / "upstream.git", "rev-parse", "master").strip()
    workdir = HERE / ".deps" / "llama.cpp"
    week.run("invoke prepare")
    (HERE / "queue" / "patches" / PATCH).write_text(breaking_patch(workdir), encoding="utf-8")
    week.git(HERE, "add", "-A")
    week.git(HERE, "commit", "--quiet", "-m", "queue: a patch that breaks top-k")

    # 1. the build session: every test of ctest -L main and the queue's own, the break traced
    result = week.run("nox -s build-cpu -- --upstream-tests --no-spot-check --json", ok=False)
    assert result.returncode != 0, result.stderr[-4000:]
    failure = json.loads(result.stdout)
    assert failure["error"] == "UpstreamTestsFailed" and failure["exit_code"] == 15, failure
    report = failure["upstream_tests"]
    tests = {t["name"]: t for t in report["tests"]}
    assert len(tests) >= 30, sorted(tests)
    broken = tests[BROKEN_TEST]
    assert broken["status"] == "broken by the queue", broken
    assert broken["blame"]["patch"] == f"core/{PATCH}", broken
    assert broken["blame"]["gave_up"] is None
    assert broken["output"], "the failing output is in the report"
    # the queue's own test ran and passed
    assert tests["test-skippy-gemma3"]["own"] and tests["test-skippy-gemma3"]["status"] == "passed"
    others = {name: t["status"] for name, t in tests.items() if name != BROKEN_TEST}
    assert set(others.values()) <= {"passed", "red upstream", "not run"}, others
    assert sum(s == "passed" for s in others.values()) >= 25, others
    for name, t in tests.items():
        if t["status"] == "not run":
            assert t["output"], f"{name} not run without a reason"
    assert report["baseline"].startswith(("run", "cached")), report["baseline"]
    # the pin got the queue's build-only patches (CMake files alone): its objects are the prepared tree's
    assert "with the queue's build-only patches (core/0003-" in report["baseline"], report["baseline"]
    assert "core/0005-" in report["baseline"] and "core/0001-" not in report["baseline"], report["baseline"]
    assert f"{BROKEN_TEST}: broken by the queue, first failing with core/{PATCH}" in result.stderr

    # 2. the pin does not move when the queue breaks an upstream test
    moved = week.run(f"invoke pin-bump --sha {readme_only}", ok=False)
    assert moved.returncode == 15, moved.stderr[-4000:]
    assert f"first failing with core/{PATCH}" in moved.stderr
    assert (HERE / "queue" / "upstream.txt").read_text(encoding="utf-8") == pin + "\n"
    shutil.rmtree(HERE / "upstream.git", ignore_errors=True)
