"""One build of one tree's tests: the subject (the toolchain and options the binaries were built
with), its plan (the binaries' own build dir, or one of upstream's tests alone), and CTest in it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.configure import cmake_on, parse_cmake_cache
from skippy.compile.plan import TESTS_DEFINE, BuildOptions, BuildPlan, plan_build
from skippy.compile.toolchain import Toolchain, inspect_tree
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.upstream_tests import ctest

#: the build commit of the baseline and attribution builds (test binaries, never shipped): one
#: value for every commit and pin, so that moving the tree beside the workdir recompiles only the
#: files that changed (the unpatched tree puts the commit on every compile line of libllama)
ASIDE_BUILD_COMMIT: Final = "0" * 40


def tests_options(options: BuildOptions) -> BuildOptions:
    """The options of a build dir of upstream's tests alone (``LLAMA_BUILD_TESTS=ON`` last, so it wins)."""
    return replace(options, cmake_args=(*options.cmake_args, TESTS_DEFINE))


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


def _with_targets(plan: BuildPlan, targets: Sequence[str]) -> BuildPlan:
    argv = tuple(a for a in plan.build_argv if a not in plan.targets) + tuple(targets)
    return replace(plan, targets=tuple(targets), build_argv=argv, rpc_target_known=True)


@dataclass(frozen=True)
class Subject:
    """The tree whose tests run: how it was built and what it is."""

    toolchain: Toolchain
    options: BuildOptions
    upstream_sha: str
    patched_sha: str
    queue_digest: str | None
    build_number: int | None
    #: the plan its binaries were built with: upstream's tests build in the same dir
    plan: BuildPlan | None = None


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
        return self.subject.options.jobs or os.cpu_count() or 1

    def plan(
        self, source: Path, commit: str, queue_digest: str | None, *, aside: bool = False, own_dir: bool = False
    ) -> BuildPlan:
        """The plan of a build of ``source``: the binaries' own, or (``own_dir``) a dir of upstream's tests alone."""
        return plan_build(
            self.backend,
            self.settings,
            tree=inspect_tree(source),
            toolchain=self.subject.toolchain,
            patched_sha=commit,
            options=tests_options(self.subject.options) if own_dir else self.subject.options,
            upstream_sha=ASIDE_BUILD_COMMIT if aside else self.upstream_sha,
            queue_digest=queue_digest,
            build_number=None if aside else self.subject.build_number,
        )

    def patched(self) -> BuildPlan:
        """The patched tree's tests, configured: in the build dir of its binaries (the session's
        plan, configured and built just before; else planned alike and configured here), or in a
        dir of their own where that dir has them off."""
        subject = self.subject
        plan = subject.plan
        if plan is None:
            plan = self.plan(self.settings.workdir, subject.patched_sha, subject.queue_digest)
            execute_plan(plan, self.console, build=False)
        if builds_tests(plan.build_dir):
            return plan
        self.console.info(
            f"{plan.build_dir.name}: LLAMA_BUILD_TESTS is off there; upstream's tests get a build dir of their own"
        )
        return self.configured(plan.source_dir, subject.patched_sha, subject.queue_digest)

    def configured(self, source: Path, commit: str, queue_digest: str | None, *, aside: bool = False) -> BuildPlan:
        """A build dir of upstream's tests alone (``LLAMA_BUILD_TESTS=ON``), configured.  The
        trees beside the workdir use one: they build nothing but tests."""
        plan = self.plan(source, commit, queue_digest, aside=aside, own_dir=True)
        execute_plan(plan, self.console, build=False)
        return plan

    def build_and_run(
        self, plan: BuildPlan, names: Sequence[str] | None, own: Sequence[str]
    ) -> tuple[BuildReport, ctest.Run, tuple[ctest.Case, ...]]:
        """Build the tests' programs in the configured ``plan``, run them (``names``, or the selection)."""
        chosen = self._chosen(plan, names, own)
        targets = sorted({c.target for c in chosen if c.target})
        report = execute_plan(_with_targets(plan, targets), self.console)
        with self.console.step(f"ctest: {len(chosen)} tests"):
            run = self.run(plan, [c.name for c in chosen])
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
