"""skippy.flows.upstream_tests.ctest against the real CMake and CTest, on a project of four tests."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from skippy.core import proc
from skippy.core.errors import SkippyError
from skippy.flows.upstream_tests import ctest

PROJECT = """\
cmake_minimum_required(VERSION 3.16)
project(t C)
enable_testing()
add_executable(test-ok ok.c)
add_executable(test-bad bad.c)
add_test(NAME test-ok COMMAND test-ok)
add_test(NAME test-bad COMMAND test-bad)
add_test(NAME test-ok-twice COMMAND test-ok twice)
set_tests_properties(test-ok test-bad test-ok-twice PROPERTIES LABELS main)
add_test(NAME fetch COMMAND ${CMAKE_COMMAND} -E false)
set_tests_properties(fetch PROPERTIES FIXTURES_SETUP net)
add_test(NAME test-needs-net COMMAND test-ok)
set_tests_properties(test-needs-net PROPERTIES FIXTURES_REQUIRED net LABELS main)
add_test(NAME test-other COMMAND test-ok)
set_tests_properties(test-other PROPERTIES LABELS model)
"""


def _tool(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (.ci/setup installs it)")
    return found


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    (src / "CMakeLists.txt").write_text(PROJECT)
    (src / "ok.c").write_text('#include <stdio.h>\nint main(void) { puts("fine"); return 0; }\n')
    (src / "bad.c").write_text('#include <stdio.h>\nint main(void) { puts("expected 3, got 4"); return 1; }\n')
    build = tmp_path_factory.mktemp("build")
    env = dict(os.environ)
    proc.run([_tool("cmake"), "-S", src, "-B", build, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"], env=env)
    proc.run([_tool("ninja"), "-C", build], env=env)
    return build


def test_listing_selection_and_verdicts(build_dir: Path) -> None:
    env = dict(os.environ)
    cases = ctest.list_cases(_tool("ctest"), build_dir, env)
    chosen = ctest.select(cases)
    assert [c.name for c in chosen] == ["test-ok", "test-bad", "test-ok-twice", "test-needs-net"]
    # two tests of one program: one target to build
    assert {c.target for c in chosen} == {"test-ok", "test-bad"}

    run = ctest.run_cases(_tool("ctest"), build_dir, [c.name for c in chosen], env, jobs=2)
    results = run.by_name()
    assert results["test-ok"].verdict == "passed"
    assert results["test-ok-twice"].verdict == "passed"
    assert results["test-bad"].verdict == "failed"
    assert "expected 3, got 4" in results["test-bad"].output
    # CTest ran the set-up the selected test needs; it failed, so the test did not run
    assert results["fetch"].setup and results["fetch"].verdict == "failed"
    assert results["test-needs-net"].verdict == "not run"
    assert "test-other" not in results


def test_run_of_a_name_that_does_not_exist_says_where(build_dir: Path) -> None:
    env = dict(os.environ)
    run = ctest.run_cases(_tool("ctest"), build_dir, ["test-ok"], env)
    assert [r.name for r in run.results] == ["test-ok"]
    with pytest.raises(SkippyError, match="ctest ran no test named no-such-test"):
        ctest.run_cases(_tool("ctest"), build_dir, ["no-such-test"], env)


def test_each_test_is_told_as_ctest_finishes_it(build_dir: Path) -> None:
    env = dict(os.environ)
    told: list[ctest.Finished] = []
    names = ["test-ok", "test-bad", "test-needs-net"]
    run = ctest.run_cases(_tool("ctest"), build_dir, names, env, jobs=2, progress=told.append)
    # every test CTest ran, the set-up it added included, as it finished: counted out of the whole run
    assert sorted(t.name for t in told) == sorted(r.name for r in run.results) == sorted([*names, "fetch"])
    assert sorted(t.done for t in told) == [1, 2, 3, 4] and {t.total for t in told} == {4}
    said = {t.name: t.said for t in told}
    assert said == {"test-ok": "Passed", "test-bad": "Failed", "fetch": "Failed", "test-needs-net": "Not Run"}
    line = next(t for t in told if t.name == "test-bad").render()
    assert line.startswith("  ") and "✗ test-bad: failed (" in line


def test_upstream_tests_show_each_test_as_it_finishes(build_dir: Path) -> None:
    """What pin-bump and --upstream-tests run: the console gets one line per finished test."""
    import io
    from types import SimpleNamespace
    from typing import Any

    from skippy.compile.backends import parse_backend
    from skippy.compile.request import build_request
    from skippy.compile.tool import Tool
    from skippy.compile.toolchain import Toolchain
    from skippy.core.settings import Settings
    from skippy.core.ui import Console
    from skippy.flows.upstream_tests.tree import Subject, _Tree

    stream = io.StringIO()
    cmake, ninja = Tool("cmake", _tool("cmake"), ""), Tool("ninja", _tool("ninja"), "")
    toolchain = Toolchain(parse_backend("cpu"), "Linux", cmake, ninja)
    settings = Settings.load(build_dir.parent, dict(os.environ))
    subject = Subject(toolchain, build_request("cpu", settings, jobs=1), "a" * 40, "b" * 40, None, None)
    tree = _Tree("cpu", settings, Console(stream=stream), subject)
    # the plan's build dir and environment are all the run reads of it
    plan: Any = SimpleNamespace(build_dir=build_dir, env=dict(os.environ))
    tree.run(plan, ["test-ok", "test-ok-twice"])
    lines = stream.getvalue().splitlines()
    assert [line.split(" ", 4)[2:4] for line in lines] == [["1/2", "✓"], ["2/2", "✓"]]
