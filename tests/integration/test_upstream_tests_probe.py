"""The baseline and the blame of upstream's tests on a real tree: the CMake probe in real git,
configured and built by real CMake and Ninja, its test run by CTest.

The queue's build-only patches (CMake files and nothing else) go on the pin for the baseline,
so its compile lines are the prepared tree's; a test that fails there is run on the bare pin
before it is called red upstream, so a build-only patch that breaks a test is still the
queue's."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.upstream_tests import ctest
from skippy.flows.upstream_tests.tree import Subject, _Tree
from skippy.flows.upstream_tests.verdicts import _judge, _Verdicts
from skippy.queue import workdir as wd
from tests.gitfixtures import Upstream, hermetic_git_env

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"
#: a build-only patch: the probe's test gets PROBE_FAIL from CMake
BREAKS_IN_CMAKE = "\nif(TARGET test-probe)\n    target_compile_definitions(test-probe PRIVATE PROBE_FAIL=1)\nendif()\n"
#: a build-only patch that changes nothing a test sees
HARMLESS_CMAKE = "\n# a downstream note\n"
FAILING_SOURCE = "int main(void) { return 1; }\n"


def _files(root: Path) -> dict[str, str | None]:
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file()}


class Project:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "proj"
        self.root.mkdir()
        (self.root / "pyproject.toml").write_text("[tool.skippy]\n", encoding="utf-8")
        env = {**hermetic_git_env(tmp_path / "home"), "PATH": os.environ.get("PATH", os.defpath)}
        self.work = Upstream.create(self.root / ".deps" / "llama.cpp", env)
        self.settings = Settings.load(self.root, env)
        self.out = io.StringIO()
        self.toolchain = probe_toolchain("cpu", self.settings)

    def cmake(self, extra: str) -> str:
        return (PROBE / "CMakeLists.txt").read_text(encoding="utf-8") + extra

    def judge(self, base: str, patches: Mapping[str, Mapping[str, str | None]]) -> tuple[_Verdicts, str]:
        """The queue's commits on ``base`` (label -> files), prepared; the probe's test judged."""
        tip = base
        for label, files in patches.items():
            tip = self.work.commit(f"{label}\n\nwhy\n\nSkippy-Patch: core/{label}.patch", files)
        wd.write_stamp(
            self.work.path / ".git",
            wd.Stamp(upstream_sha=base, patched_sha=tip, queue_digest="probe", base_commit=base),
        )
        subject = Subject(self.toolchain, build_request("cpu", self.settings), base, tip, "probe", None)
        tree = _Tree("cpu", self.settings, Console(env={}, stream=self.out), subject)
        failing = ctest.Result("test-probe", "failed", 0.1, "exit 1")
        verdicts = _judge(tree, tip, failed=["test-probe"], own=(), results={"test-probe": failing}, budget=300)
        return verdicts, self.out.getvalue()


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path)
    yield p
    # the compiler cache server the builds started (one per cache dir)
    tree = inspect_tree(p.work.path)
    stop_cache_server(
        plan_build(build_request("cpu", p.settings), p.settings, tree=tree, toolchain=p.toolchain, patched_sha="0" * 40)
    )


def test_a_source_patch_that_breaks_a_test_is_blamed_with_the_build_only_patches_on_the_baseline(
    project: Project,
) -> None:
    base = project.work.commit("Import upstream", _files(PROBE))
    verdicts, _ = project.judge(
        base,
        {
            "0001-build-a-note": {"CMakeLists.txt": project.cmake(HARMLESS_CMAKE)},
            "0002-core-a-source-change": {"src/common.c": "int probe_common = 2;\n"},
            "0003-core-breaks-the-test": {"tests/test-probe.c": FAILING_SOURCE},
        },
    )
    assert verdicts.red_upstream == frozenset()
    baseline = verdicts.baseline
    assert baseline.startswith("run (1 tests on upstream"), baseline
    assert "with the queue's build-only patches (core/0001-build-a-note.patch)" in baseline
    assert baseline.count("run (") == 1, "passing there, the bare pin is not built"
    assert verdicts.blames["test-probe"].patch == "core/0003-core-breaks-the-test.patch"


def test_a_build_only_patch_that_breaks_a_test_is_the_queues_not_upstreams(project: Project) -> None:
    base = project.work.commit("Import upstream", _files(PROBE))
    verdicts, _ = project.judge(
        base,
        {
            "0001-core-a-source-change": {"src/common.c": "int probe_common = 2;\n"},
            "0002-build-breaks-the-test": {"CMakeLists.txt": project.cmake(BREAKS_IN_CMAKE)},
        },
    )
    baseline = verdicts.baseline
    # it failed with the build-only patches, then passed on the bare pin: not red upstream
    assert "build-only patches (core/0002-build-breaks-the-test.patch)" in baseline, baseline
    assert baseline.count("run (1 tests on upstream") == 2, baseline
    assert verdicts.red_upstream == frozenset()
    assert verdicts.blames["test-probe"].patch == "core/0002-build-breaks-the-test.patch"


def test_a_test_that_fails_on_the_bare_pin_is_red_upstream(project: Project) -> None:
    files = _files(PROBE)
    files["tests/test-probe.c"] = FAILING_SOURCE
    base = project.work.commit("Import upstream", files)
    verdicts, _ = project.judge(base, {"0001-build-a-note": {"CMakeLists.txt": project.cmake(HARMLESS_CMAKE)}})
    assert verdicts.red_upstream == frozenset({"test-probe"})
    assert verdicts.blames == {}
    # a second judgement of the same pin takes both runs from the kept baseline
    verdicts, _ = project.judge(base, {"0002-core-a-source-change": {"src/common.c": "int probe_common = 2;\n"}})
    assert verdicts.red_upstream == frozenset({"test-probe"})
    assert verdicts.baseline.count("cached (") == 2 and "run (" not in verdicts.baseline, verdicts.baseline


def test_build_only_patches_that_do_not_apply_to_the_pin_leave_the_baseline_bare(project: Project) -> None:
    base = project.work.commit("Import upstream", _files(PROBE))
    verdicts, out = project.judge(
        base,
        {
            # the build-only patch edits a line the source patch before it added: it cannot go on the bare pin
            "0001-core-adds-a-line": {
                "CMakeLists.txt": project.cmake("\n# line one\n"),
                "src/common.c": "int probe_common = 2;\n",
            },
            "0002-build-edits-it": {"CMakeLists.txt": project.cmake("\n# line one, edited\n")},
            "0003-core-breaks-the-test": {"tests/test-probe.c": FAILING_SOURCE},
        },
    )
    assert "do not apply to the bare pin" in out
    baseline = verdicts.baseline
    assert "build-only" not in baseline, baseline
    assert verdicts.blames["test-probe"].patch == "core/0003-core-breaks-the-test.patch"
