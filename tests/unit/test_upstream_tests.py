"""Upstream's tests: reading CTest's list and verdicts, the queue's own tests, the bisection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skippy.flows.upstream_tests import ctest
from skippy.flows.upstream_tests.bisect import bisect_first_failing
from skippy.flows.upstream_tests.run import own_test_targets
from skippy.flows.upstream_tests.verdicts import _Verdicts
from skippy.queue.model import Lane, Patch, Queue

BUILD = Path("/b")

LISTING = {
    "kind": "ctestInfo",
    "version": {"major": 1, "minor": 0},
    "tests": [
        {
            "name": "test-sampling",
            "command": ["/b/bin/test-sampling"],
            "properties": [{"name": "LABELS", "value": ["main"]}],
        },
        {
            "name": "test-tokenizer-0-gpt-2",
            "command": ["/b/bin/test-tokenizer-0", "/src/models/ggml-vocab-gpt-2.gguf"],
            "properties": [{"name": "LABELS", "value": ["main"]}],
        },
        {
            "name": "test-tokenizers-ggml-vocabs",
            "command": ["/src/tests/test-tokenizers-repo.sh", "https://example.invalid/vocabs"],
            "properties": [{"name": "LABELS", "value": ["main"]}],
        },
        {
            "name": "test-save-load-state",
            "command": ["/b/bin/test-save-load-state"],
            "properties": [
                {"name": "LABELS", "value": ["model"]},
                {"name": "FIXTURES_REQUIRED", "value": ["test-download-model"]},
            ],
        },
        {"name": "test-skippy-gemma3", "command": ["/b/bin/test-skippy-gemma3"], "properties": []},
    ],
}

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="5" failures="3" disabled="0" skipped="1" time="0">
  <testcase name="ok" classname="ok" time="0.25" status="run"><system-out>fine</system-out></testcase>
  <testcase name="bad" classname="bad" time="0.5" status="fail">
    <failure message=""/><system-out>line 1
assertion failed: top_k</system-out>
  </testcase>
  <testcase name="vocabs" classname="vocabs" time="1" status="fail">
    <failure message=""/><system-out>fatal: 'https://example.invalid/x/': Could not resolve host</system-out>
  </testcase>
  <testcase name="setup" classname="setup" time="0.1" status="fail">
    <failure message=""/><system-out>download failed</system-out>
  </testcase>
  <testcase name="needs" classname="needs" time="0" status="notrun">
    <skipped message="Fixture dependency failed"/><system-out>Failed test dependencies: setup</system-out>
  </testcase>
</testsuite>
"""


def test_listing_names_the_target_that_builds_each_test() -> None:
    cases = {c.name: c for c in ctest.parse_listing(json.dumps(LISTING), BUILD)}
    assert cases["test-sampling"].target == "test-sampling"
    # several tests share one program
    assert cases["test-tokenizer-0-gpt-2"].target == "test-tokenizer-0"
    # a script of the source tree is built by no target
    assert cases["test-tokenizers-ggml-vocabs"].target == ""
    assert cases["test-save-load-state"].fixtures_required == ("test-download-model",)


def test_listing_that_is_not_ctest_json_is_refused() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        ctest.parse_listing("Test project /b", BUILD)
    with pytest.raises(ValueError, match="'tests'"):
        ctest.parse_listing("{}", BUILD)


def test_the_programs_are_read_from_the_testfiles_cmake_3_and_4_write(tmp_path: Path) -> None:
    """CMake 4 quotes a test's name, CMake 3.x brackets it: either way its program is found."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "CTestTestfile.cmake").write_text(
        f'add_test("test-quoted" "{tmp_path}/bin/test-quoted")\nsubdirs("tests")\n', "utf-8"
    )
    (tmp_path / "tests" / "CTestTestfile.cmake").write_text(
        f'add_test([=[test-bracketed]=] "{tmp_path}/bin/test-bracketed")\n'
        f'set_tests_properties([=[test-bracketed]=] PROPERTIES LABELS "main")\n'
        "add_test([[a test]] [==[/usr/bin/env]==] [==[true]==])\n",
        "utf-8",
    )
    assert ctest.declared_programs(tmp_path) == {
        "test-quoted": f"{tmp_path}/bin/test-quoted",
        "test-bracketed": f"{tmp_path}/bin/test-bracketed",
        "a test": "/usr/bin/env",
    }


def test_selection_is_the_main_label_plus_the_queues_own_tests() -> None:
    cases = ctest.parse_listing(json.dumps(LISTING), BUILD)
    picked = [c.name for c in ctest.select(cases, own_targets=["test-skippy-gemma3"])]
    assert picked == ["test-sampling", "test-tokenizer-0-gpt-2", "test-tokenizers-ggml-vocabs", "test-skippy-gemma3"]
    assert "test-skippy-gemma3" not in [c.name for c in ctest.select(cases)]


def test_junit_verdicts_setups_and_network() -> None:
    results = {r.name: r for r in ctest.parse_junit(JUNIT, ["ok", "bad", "vocabs", "needs"])}
    assert results["ok"].verdict == "passed" and results["ok"].output == ""
    assert results["bad"].verdict == "failed"
    assert "assertion failed: top_k" in results["bad"].output
    # no network is not a verdict on the tree
    assert results["vocabs"].verdict == "not run"
    assert results["vocabs"].output.startswith("needs the network (Could not resolve host)")
    # CTest added the set-up by itself: marked, so it is reported apart from the selected tests
    assert results["setup"].setup and results["setup"].verdict == "failed"
    assert not results["bad"].setup
    assert results["needs"].verdict == "not run"
    assert "Fixture dependency failed" in results["needs"].output


def test_name_regex_matches_only_the_names() -> None:
    import re

    pattern = re.compile(ctest.name_regex(["test-a+b", "test-c"]))
    assert pattern.match("test-a+b") and pattern.match("test-c")
    assert not pattern.match("test-a+bc") and not pattern.match("xtest-c")


def _patch(tmp_path: Path, name: str, body: str, lane: Lane = Lane.CORE) -> Patch:
    path = tmp_path / name
    data = body.encode()
    path.write_bytes(data)
    return Patch(lane=lane, path=path, number=1, data=data)


def test_own_tests_are_the_new_files_under_tests(tmp_path: Path) -> None:
    adds = _patch(
        tmp_path,
        "0001-x.patch",
        "diff --git a/tests/test-mine.cpp b/tests/test-mine.cpp\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test-mine.cpp\n@@ -0,0 +1 @@\n+int main() {}\n"
        "diff --git a/tests/helper.h b/tests/helper.h\n--- /dev/null\n+++ b/tests/helper.h\n",
    )
    edits = _patch(
        tmp_path,
        "0002-y.patch",
        "--- a/tests/test-sampling.cpp\n+++ b/tests/test-sampling.cpp\n@@ -1 +1 @@\n-a\n+b\n",
    )
    queue = Queue(root=tmp_path, patches=(adds, edits), digest="d")
    assert own_test_targets(queue) == ("test-mine",)


@pytest.mark.parametrize("first", [1, 2, 5, 9])
def test_bisection_finds_the_first_failing_prefix(first: int) -> None:
    asked: list[int] = []

    def fails_at(k: int) -> bool:
        asked.append(k)
        return k >= first

    good, bad, finished = bisect_first_failing(9, fails_at, deadline=float("inf"))
    assert finished and bad == first and good == first - 1
    # a bisection, not a walk: at most ceil(log2(9)) probes
    assert len(asked) <= 4


def test_bisection_stops_at_the_deadline_with_the_range_left() -> None:
    ticks = iter([0.0, 0.0, 100.0, 100.0])

    good, bad, finished = bisect_first_failing(16, lambda k: k >= 3, deadline=50.0, clock=lambda: next(ticks))
    assert not finished
    # two probes ran (8 fails, 4 fails) before the clock passed the deadline
    assert (good, bad) == (0, 4)


def test_a_failure_is_only_the_queues_once_judged() -> None:
    unjudged = _Verdicts(baseline="not run")
    assert unjudged.status("t", "failed") == "failed"
    judged = _Verdicts(baseline="run", red_upstream=frozenset({"red"}), judged=True)
    assert judged.status("red", "failed") == "red upstream"
    assert judged.status("t", "failed") == "broken by the queue"
    assert judged.status("t", "passed") == "passed"
    assert judged.status("t", "not run") == "not run"


OPS_OUTPUT = """Testing 2 devices

Backend 1/2: Vulkan0
  Device description: llvmpipe (LLVM 15.0.6, 256 bits)
  ADD(type=f32,ne=[10,5,4,3],nr=[1,1,1,1],nf=1): \x1b[1;32mOK\x1b[0m
  ADD(type=f16,ne=[10,5,4,3],nr=[2,1,1,1],nf=1): \x1b[1;31mFAIL\x1b[0m
  ADD(type=bf16,ne=[10,5,4,3],nr=[1,1,1,1],nf=1): not supported [Vulkan0]
  2/3 tests passed
  Backend Vulkan0: \x1b[1;31mFAIL\x1b[0m
"""


def test_backend_ops_cases_are_counted_from_the_console_lines() -> None:
    from skippy.flows.upstream_tests.backend_ops import parse_cases

    passed, failed, unsupported, failures = parse_cases(OPS_OUTPUT)
    assert (passed, failed, unsupported) == (1, 1, 1)
    assert failures == ("ADD(type=f16,ne=[10,5,4,3],nr=[2,1,1,1],nf=1): FAIL",)


def test_backend_ops_time_box_cuts_short_and_says_so(tmp_path: Path) -> None:
    import os

    from skippy.flows.upstream_tests.backend_ops import run_ops

    program = tmp_path / "test-backend-ops"
    # prints one passing case of the op it is given; SLOW never finishes
    program.write_text('#!/bin/sh\nop="$5"\necho "  $op(type=f32): OK"\n[ "$op" = SLOW ] && exec sleep 30\nexit 0\n')
    program.chmod(0o755)
    ops = (("ADD", None), ("SLOW", None), ("MUL", None))
    results = run_ops(program, "Vulkan0", dict(os.environ), ops=ops, budget=3.0)
    by_op = {r.op: r for r in results}
    assert by_op["ADD"].verdict == "passed" and by_op["ADD"].cut_short is None
    assert by_op["SLOW"].passed == 1 and by_op["SLOW"].cut_short is not None
    assert "time box" in by_op["SLOW"].cut_short
    assert by_op["MUL"].verdict == "not run" and "not reached" in str(by_op["MUL"].cut_short)


def test_a_flaky_test_is_reported_and_keeps_nothing_from_passing(tmp_path: Path) -> None:
    from skippy.compile.builder import BuildReport
    from skippy.flows.upstream_tests.report import TestOutcome, UpstreamTestsReport

    build = BuildReport(
        backend="cpu",
        build_dir=tmp_path,
        configured=False,
        configure_reason="",
        configure_seconds=0.0,
        build_seconds=0.0,
        compiled=0,
        steps=0,
        binaries={},
        cache=None,
    )
    tests = (TestOutcome("test-a", "passed", 1.0), TestOutcome("test-rpc", "flaky", 31.0, "timeout"))
    report = UpstreamTestsReport("cpu", "a" * 40, tmp_path, build, 40.0, tests, baseline="not needed")
    assert report.ok
    assert report.summary() == "1 passed, 1 flaky"
    assert "  · test-rpc: flaky (failed, then passed on a rerun of the same build)" in report.render()
