"""CTest's progress lines, read as each test finishes (skippy.flows.upstream_tests.ctest.finished)."""

from __future__ import annotations

import pytest

from skippy.flows.upstream_tests.ctest import Finished, finished

LINES = [
    ("1/5 Test #1: test-ok ..........................   Passed    0.02 sec", Finished(1, 5, "test-ok", "Passed", 0.02)),
    (
        " 2/38 Test #12: test-tokenizer-0-llama-spm ...***Failed    1.50 sec",
        Finished(2, 38, "test-tokenizer-0-llama-spm", "Failed", 1.5),
    ),
    (
        "4/5 Test #5: test-needs-net ...................***Not Run   0.00 sec",
        Finished(4, 5, "test-needs-net", "Not Run", 0.0),
    ),
    ("10/38 Test #3: test-rpc .....***Timeout 600.01 sec", Finished(10, 38, "test-rpc", "Timeout", 600.01)),
    (
        "7/9 Test #7: test-grad ....***Exception: SegFault  0.31 sec",
        Finished(7, 9, "test-grad", "Exception: SegFault", 0.31),
    ),
]


@pytest.mark.parametrize(("line", "expected"), LINES, ids=[e.said for _, e in LINES])
def test_a_finished_test_is_read_from_its_line(line: str, expected: Finished) -> None:
    assert finished(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "    Start 4: fetch",
        "Test project /tmp/build",
        "40% tests passed, 3 tests failed out of 5",
        "Failed test dependencies: fetch",
    ],
)
def test_other_lines_are_not_tests(line: str) -> None:
    assert finished(line) is None


def test_the_line_shown_marks_the_outcome() -> None:
    assert LINES[0][1].render() == "  1/5 ✓ test-ok: passed (0.0 s)"
    assert LINES[1][1].render() == "  2/38 ✗ test-tokenizer-0-llama-spm: failed (1.5 s)"
    assert LINES[2][1].render() == "  4/5 · test-needs-net: not run (0.0 s)"
    assert LINES[3][1].render().startswith("  10/38 ✗ test-rpc: timeout")
