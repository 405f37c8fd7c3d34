"""One build of one tree's tests: the subject (the toolchain and request the binaries were built
with), its plan (the binaries' own build dir, or one of upstream's tests alone), and CTest in it.

The tests' programs are built by a plan of their own: the same request of those targets,
planned again (:meth:`_Tree.programs`), never a plan edited after it was made."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.configure import cmake_on, parse_cmake_cache
from skippy.compile.localtree import WorkdirState
from skippy.compile.plan import TESTS_SWITCH, BuildPlan, plan_build
from skippy.compile.request import BuildRequest
from skippy.compile.toolchain import Toolchain, inspect_tree
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.upstream_tests import ctest

#: the build commit of the baseline and attribution builds (test binaries, never shipped): one
#: value for every commit and pin, so that moving the tree beside the workdir recompiles only the
#: files that changed (the unpatched tree puts the commit on every compile line of libllama)
ASIDE_BUILD_COMMIT: Final = "0" * 40


def builds_tests(build_dir: Path) -> bool:
    """Whether the configured ``build_dir`` has upstream's tests (its CMake cache says
    ``LLAMA_BUILD_TESTS`` is on: llama.cpp's default when it is the top-level project)."""
    try:
        cache = parse_cmake_cache((build_dir / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False
    return cmake_on(cache.get("LLAMA_BUILD_TESTS", ""))


def ctest_of(toolchain: Toolchain) -> str:
    """CTest beside the CMake that configures (the wheel's or the system's)."""
    beside = Path(toolchain.cmake.path).with_name("ctest")
    return str(beside) if beside.is_file() else "ctest"


@dataclass(frozen=True)
class Subject:
    """The tree whose tests run: how it was built and what it is."""

    toolchain: Toolchain
    #: the request its binaries were built from (the backend, the -D values, the jobs)
    request: BuildRequest
    upstream_sha: str
    patched_sha: str
    queue_digest: str | None
    build_number: int | None
    #: the plan its binaries were built with: upstream's tests build in the same dir
    plan: BuildPlan | None = None
    #: the workdir's state when it was built as it stands (its build dir is named by it)
    local_state: WorkdirState | None = None


@dataclass(frozen=True)
class TestsDir:
    """A build dir of a tree's tests (its plan) and what it was planned from: the programs of the
    tests chosen are built by the same request of those targets, planned again."""

    plan: BuildPlan
    source: Path
    commit: str
    queue_digest: str | None
    #: a tree beside the workdir (baseline, attribution)
    aside: bool = False
    #: a dir of upstream's tests alone (``LLAMA_BUILD_TESTS=ON``)
    own_dir: bool = False


@dataclass(frozen=True)
class _Tree:
    """What one build of one tree needs, apart from its source: the subject's toolchain and options."""

    backend: str
    settings: Settings
    console: Console
    subject: Subject

    @property
    def upstream_sha(self) -> str:
        return self.subject.upstream_sha

    @property
    def jobs(self) -> int:
        return self.subject.request.jobs or os.cpu_count() or 1

    def _plan(
        self,
        source: Path,
        commit: str,
        queue_digest: str | None,
        *,
        aside: bool,
        own_dir: bool,
        targets: Sequence[str] | None = None,
    ) -> BuildPlan:
        """The subject's request of a build of ``source`` (of ``targets``, or the backend's own), planned."""
        request = self.subject.request
        if own_dir:
            request = request.with_define(TESTS_SWITCH, "ON")
        if targets is not None:
            request = request.with_targets(targets)
        return plan_build(
            request,
            self.settings,
            tree=inspect_tree(source),
            toolchain=self.subject.toolchain,
            patched_sha=commit,
            upstream_sha=ASIDE_BUILD_COMMIT if aside else self.upstream_sha,
            queue_digest=queue_digest,
            build_number=None if aside else self.subject.build_number,
            # the binaries' own dir is named as the session named it
            local_state=None if aside or own_dir else self.subject.local_state,
        )

    def plan(
        self, source: Path, commit: str, queue_digest: str | None, *, aside: bool = False, own_dir: bool = False
    ) -> TestsDir:
        """The build of ``source``, planned: the binaries' own, or (``own_dir``) a dir of upstream's tests alone."""
        plan = self._plan(source, commit, queue_digest, aside=aside, own_dir=own_dir)
        return TestsDir(plan, source, commit, queue_digest, aside=aside, own_dir=own_dir)

    def programs(self, tests: TestsDir, targets: Sequence[str]) -> BuildPlan:
        """The plan of the build of ``targets`` (the tests' programs) in the dir of ``tests``."""
        return self._plan(
            tests.source, tests.commit, tests.queue_digest, aside=tests.aside, own_dir=tests.own_dir, targets=targets
        )

    def patched(self) -> TestsDir:
        """The patched tree's tests, configured: in the build dir of its binaries (the session's
        plan, configured and built just before; else planned alike and configured here), or in a
        dir of their own where that dir has them off."""
        subject = self.subject
        if subject.plan is not None:
            tests = TestsDir(subject.plan, subject.plan.source_dir, subject.patched_sha, subject.queue_digest)
        else:
            tests = self.plan(self.settings.workdir, subject.patched_sha, subject.queue_digest)
            execute_plan(tests.plan, self.console, build=False)
        build_dir = tests.plan.build_dir
        if builds_tests(build_dir):
            return tests
        self.console.info(
            f"{build_dir.name}: LLAMA_BUILD_TESTS is off there; upstream's tests get a build dir of their own"
        )
        return self.configured(tests.source, subject.patched_sha, subject.queue_digest)

    def configured(self, source: Path, commit: str, queue_digest: str | None, *, aside: bool = False) -> TestsDir:
        """A build dir of upstream's tests alone (``LLAMA_BUILD_TESTS=ON``), configured.  The
        trees beside the workdir use one: they build nothing but tests."""
        tests = self.plan(source, commit, queue_digest, aside=aside, own_dir=True)
        execute_plan(tests.plan, self.console, build=False)
        return tests

    def build_and_run(
        self, tests: TestsDir, names: Sequence[str] | None, own: Sequence[str]
    ) -> tuple[BuildReport, ctest.Run, tuple[ctest.Case, ...]]:
        """Build the tests' programs in the configured dir of ``tests``, run them (``names``, or the selection)."""
        chosen = self._chosen(tests.plan, names, own)
        targets = sorted({c.target for c in chosen if c.target})
        report = execute_plan(self.programs(tests, targets), self.console)
        with self.console.step(f"ctest: {len(chosen)} tests"):
            run = self.run(tests.plan, [c.name for c in chosen])
        return report, run, chosen

    def run(self, plan: BuildPlan, names: Sequence[str]) -> ctest.Run:
        """CTest runs ``names`` in ``plan``'s build dir (their programs built)."""
        return ctest.run_cases(
            ctest_of(self.subject.toolchain),
            plan.build_dir,
            names,
            plan.env,
            jobs=self.jobs,
            progress=lambda test: self.console.info(test.render()),
        )

    def _chosen(self, plan: BuildPlan, names: Sequence[str] | None, own: Sequence[str]) -> tuple[ctest.Case, ...]:
        cases = ctest.list_cases(ctest_of(self.subject.toolchain), plan.build_dir, plan.env)
        if names is None:
            return ctest.select(cases, own_targets=own)
        return tuple(c for c in cases if c.name in set(names))
