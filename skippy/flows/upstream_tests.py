"""Upstream's own tests on the patched tree, each failure traced to the patch that caused it.

1. Upstream's tests build in the binaries' own build dir (llama.cpp configures them there:
   ``LLAMA_BUILD_TESTS`` is on for a top-level build), so asking for them configures nothing
   again and generates nothing twice (a Vulkan build's shaders); only a build dir that has
   them off gets a dir of its own with ``LLAMA_BUILD_TESTS=ON``. CTest runs what
   llama.cpp's CI runs (``-L main``) plus every test the queue's own patches add.
2. Only when something fails, the same tests run on the pin (the *baseline*, kept per
   upstream commit under the cache dir, so a pin is tested once), with the queue's build-only
   patches on it where they apply (:class:`_Baseline`): a test that fails on the bare pin too
   is *red upstream*; one that fails only with the queue is the queue's.
3. For each test the queue breaks, a bisection over the prepared commits (each carries
   its ``Skippy-Patch`` trailer) names the first patch whose application makes it fail:
   one tree beside the workdir (a ``git clone --shared``: no object is copied) is moved
   from commit to commit and built incrementally. It stops at a time budget and says so.

The workdir itself is never checked out, built in or changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from filelock import FileLock

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.configure import cmake_on, parse_cmake_cache
from skippy.compile.plan import TESTS_DEFINE, BuildOptions, BuildPlan, plan_build, workdir_key
from skippy.compile.toolchain import Toolchain, inspect_tree
from skippy.core import specs
from skippy.core.errors import CommandError, NotPrepared
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.mail import label_of
from skippy.queue.model import Queue, load_queue
from skippy.spot import backend_ops, ctest

#: the build commit of the baseline and attribution builds (test binaries, never shipped): one
#: value for every commit and pin, so that moving the tree beside the workdir recompiles only the
#: files that changed (the unpatched tree puts the commit on every compile line of libllama)
ASIDE_BUILD_COMMIT: Final = "0" * 40
#: upstream's program that compares a device's ops with the CPU's
BACKEND_OPS_TARGET: Final = "test-backend-ops"


def budget_of(settings: Settings, key: str) -> float:
    """``[tool.skippy.upstream_tests]`` ``attribution_budget`` / ``ops_budget`` (or its variable)."""
    names = [s.key for s in specs.UPSTREAM_TESTS]
    table = settings.subtable("upstream_tests", names, example="ops_budget = 600")
    return float(specs.value(specs.UPSTREAM_TESTS, key, table, settings.env, where="[tool.skippy.upstream_tests]"))


#: a new file under tests/ in a patch: the queue's own test (its target is the file's stem)
_NEW_TEST = re.compile(r"^--- /dev/null\n\+\+\+ b/tests/([A-Za-z0-9_.-]+)\.(?:c|cpp)$", re.MULTILINE)

Status = Literal["passed", "broken by the queue", "red upstream", "failed", "flaky", "not run"]


@dataclass(frozen=True)
class Blame:
    """The first patch (in queue order) whose application makes a test fail."""

    patch: str | None
    commit: str | None
    output: str = ""
    #: set when the bisection stopped before it named one patch: why, and how far it got
    gave_up: str | None = None
    probes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "commit": self.commit,
            "output": self.output,
            "gave_up": self.gave_up,
            "probes": self.probes,
        }


@dataclass(frozen=True)
class TestOutcome:
    name: str
    status: Status
    seconds: float
    output: str = ""
    #: added by one of the queue's patches
    own: bool = False
    blame: Blame | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "output": self.output,
            "own": self.own,
            "blame": self.blame.as_dict() if self.blame else None,
        }


@dataclass(frozen=True)
class UpstreamTestsReport:
    backend: str
    upstream_sha: str
    build_dir: Path
    build: BuildReport
    ctest_seconds: float
    tests: tuple[TestOutcome, ...]
    #: "not needed (...)", "cached (...)" or "run (...)"
    baseline: str
    baseline_seconds: float = 0.0
    attribution_seconds: float = 0.0
    #: fixture set-ups CTest added that failed (e.g. a model download without a network)
    setups_failed: tuple[ctest.Result, ...] = ()
    #: a GPU backend's ops against the CPU (test-backend-ops on the device), and the device
    ops: tuple[backend_ops.OpResult, ...] = ()
    ops_device: str | None = None

    @property
    def ok(self) -> bool:
        tests_ok = not any(t.status in ("broken by the queue", "failed") for t in self.tests)
        return tests_ok and not any(o.failed for o in self.ops)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tests:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    def summary(self) -> str:
        if self.ops_device is not None:
            passed = sum(o.passed for o in self.ops)
            failed = sum(o.failed for o in self.ops)
            return f"{len(self.ops)} ops on {self.ops_device} against the CPU: {passed} cases passed, {failed} failed"
        counts = self.counts()
        order: tuple[Status, ...] = ("passed", "broken by the queue", "failed", "red upstream", "flaky", "not run")
        return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "upstream_sha": self.upstream_sha,
            "ok": self.ok,
            "counts": self.counts(),
            "build_dir": str(self.build_dir),
            "build_seconds": round(self.build.total_seconds, 3),
            "compiled": self.build.compiled,
            "ctest_seconds": round(self.ctest_seconds, 3),
            "baseline": self.baseline,
            "baseline_seconds": round(self.baseline_seconds, 3),
            "attribution_seconds": round(self.attribution_seconds, 3),
            "setups_failed": [r.as_dict() for r in self.setups_failed],
            "tests": [t.as_dict() for t in self.tests],
            "ops_device": self.ops_device,
            "ops": [o.as_dict() for o in self.ops],
        }

    def render(self) -> list[str]:
        """The lines a maintainer reads: the counts, then each test that is not simply passed."""
        lines = [f"upstream tests ({self.backend}): {self.summary()}; baseline {self.baseline}"]
        for t in self.tests:
            if t.status == "passed":
                continue
            if t.status == "broken by the queue" and t.blame is not None:
                where = t.blame.patch or "no single patch"
                lines.append(f"  ✗ {t.name}: broken by the queue, first failing with {where}")
                if t.blame.gave_up:
                    lines.append(f"      attribution gave up: {t.blame.gave_up}")
            elif t.status == "flaky":
                lines.append(f"  · {t.name}: flaky (failed, then passed on a rerun of the same build)")
            else:
                lines.append(f"  {'✗' if t.status in ('failed', 'broken by the queue') else '·'} {t.name}: {t.status}")
            if t.output and t.status != "not run":
                lines.extend("      " + line for line in t.output.splitlines()[-8:])
        for s in self.setups_failed:
            first = s.output.strip().splitlines()[-1] if s.output.strip() else "failed"
            lines.append(f"  · set-up {s.name} failed ({first}): the tests needing it did not run")
        for o in self.ops:
            mark = "✗" if o.failed else "✓" if o.passed else "·"
            counts = f"{o.passed} passed, {o.failed} failed, {o.unsupported} not supported, {o.seconds:.0f} s"
            lines.append(f"  {mark} {o.op}: {counts}" + (f" ({o.cut_short})" if o.cut_short else ""))
            lines.extend(f"      {f}" for f in o.failures)
        return lines


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


def own_test_targets(queue: Queue) -> tuple[str, ...]:
    """The test executables the queue's patches add (a new ``tests/<name>.c(pp)``)."""
    found: list[str] = []
    for patch in queue.patches:
        text = patch.data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        found.extend(m.group(1) for m in _NEW_TEST.finditer(text) if m.group(1) not in found)
    return tuple(found)


def ctest_of(toolchain: Toolchain) -> str:
    """CTest beside the CMake that configures (the wheel's or the system's)."""
    beside = Path(toolchain.cmake.path).with_name("ctest")
    return str(beside) if beside.is_file() else "ctest"


def _with_targets(plan: BuildPlan, targets: Sequence[str]) -> BuildPlan:
    argv = tuple(a for a in plan.build_argv if a not in plan.targets) + tuple(targets)
    return replace(plan, targets=tuple(targets), build_argv=argv, rpc_target_known=True)


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


def _baseline_file(settings: Settings, backend: str, upstream_sha: str, digest: str) -> Path:
    return settings.cache_dir / "upstream-tests" / f"baseline-{upstream_sha[:12]}-{backend}-{digest}.json"


def _read_baseline(path: Path) -> dict[str, ctest.Result]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            name: ctest.Result(
                name=name, verdict=r["verdict"], seconds=float(r["seconds"]), output=str(r.get("output", ""))
            )
            for name, r in data["results"].items()
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_baseline(path: Path, upstream_sha: str, results: Mapping[str, ctest.Result]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    payload = {"upstream_sha": upstream_sha, "results": {n: r.as_dict() for n, r in sorted(results.items())}}
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


class AsideTree:
    """A ``git clone --shared`` of the workdir under the cache dir, moved between commits."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        # one per workdir (keyed as build dirs are): its commits are reached through that workdir's objects
        key = workdir_key(settings, workdir) or "default"
        self.path = settings.cache_dir / "upstream-tests" / f"tree-{key}" / "llama.cpp"
        self.workdir = workdir
        self.env = settings.env

    def at(self, commit: str) -> Path:
        """The tree checked out at ``commit`` (made again when the workdir it borrows from was
        re-made, so its objects are gone)."""
        try:
            return self._checkout(commit)
        except CommandError:
            shutil.rmtree(self.path, ignore_errors=True)
            return self._checkout(commit)

    def apply(self, commits: Sequence[str]) -> str | None:
        """The changes of ``commits`` (in order) on the checked-out tree, uncommitted: a key of
        what was applied, or None (the tree left as checked out) when one does not apply."""
        repo = Repo(self.path, self.env)
        digest = hashlib.sha256()
        for sha in commits:
            diff = repo.git("diff", "--binary", f"{sha}^", sha).stdout
            digest.update(diff.encode("utf-8", errors="surrogateescape"))
            if repo.git("apply", "--whitespace=nowarn", "-", input=diff, check=False).returncode != 0:
                repo.git("checkout", "--force", "--quiet", "HEAD")
                repo.git("clean", "-fdq")
                return None
        return digest.hexdigest()

    def _checkout(self, commit: str) -> Path:
        if not (self.path / ".git").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            Repo(self.path.parent, self.env).git(
                "clone", "--shared", "--no-checkout", "--quiet", str(self.workdir), str(self.path)
            )
        repo = Repo(self.path, self.env)
        # the workdir's objects are this clone's alternates: every commit there is here
        repo.git("checkout", "--detach", "--force", "--quiet", commit)
        repo.git("clean", "-fdq")
        return self.path


@dataclass(frozen=True)
class QueueCommit:
    sha: str
    label: str


def queue_commits(repo: Repo, base: str, patched: str) -> tuple[QueueCommit, ...]:
    """The prepared commits from the base to the tip, oldest first, each with its patch label."""
    out = repo.out("log", "--reverse", "--format=%H%x00%B%x01", f"{base}..{patched}")
    commits: list[QueueCommit] = []
    for raw in out.split("\x01"):
        chunk = raw.strip("\n")
        if not chunk:
            continue
        sha, _, message = chunk.partition("\x00")
        commits.append(QueueCommit(sha=sha.strip(), label=label_of(message) or f"commit {sha.strip()[:12]}"))
    return tuple(commits)


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
    plan = tree.patched()
    report = execute_plan(_with_targets(plan, [BACKEND_OPS_TARGET]), console)
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
    plan = tree.patched()
    report, run, chosen = tree.build_and_run(plan, None, own)
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


#: the files a build-only patch changes: how the tree is built (its compile lines), not what it computes
_BUILD_FILE: Final = re.compile(r"(?:^|/)(?:CMakeLists\.txt|[^/]+\.cmake)$")


def build_only(repo: Repo, commits: Iterable[QueueCommit]) -> tuple[QueueCommit, ...]:
    """The prepared commits that change CMake files and nothing else (CMakeLists.txt, ``*.cmake``)."""
    found: list[QueueCommit] = []
    for commit in commits:
        names = repo.out("diff-tree", "--no-commit-id", "--name-only", "-r", commit.sha).splitlines()
        if names and all(_BUILD_FILE.search(name) for name in names):
            found.append(commit)
    return tuple(found)


class _Baseline:
    """Tests on the pin, in the tree beside the workdir, kept per upstream commit.

    With the queue's build-only patches on the pin (when they apply there), the pin's objects
    are the prepared tree's: only the queue moves what a compile line carries (the build
    commit, a backend's ``GGML_USE_*``), so the compiler cache serves libllama and common
    instead of a cold build of a second variant of them.  A test that fails there is run on
    the bare pin before it is called red upstream.
    """

    def __init__(self, tree: _Tree, aside: AsideTree, base: str, own: Sequence[str]) -> None:
        self.tree, self.aside, self.base, self.own = tree, aside, base, own
        #: the build-only patches the last run applied (none when they did not apply)
        self.applied: tuple[QueueCommit, ...] = ()
        #: what each run said, for the report
        self.said: list[str] = []

    def results(self, names: Sequence[str], patches: Sequence[QueueCommit]) -> dict[str, ctest.Result]:
        tree, sha = self.tree, self.tree.upstream_sha
        source = self.aside.at(self.base)
        key = self.aside.apply([c.sha for c in patches]) if patches else None
        if patches and key is None:
            tree.console.info("the queue's build-only patches do not apply to the bare pin: its baseline is bare")
        self.applied = tuple(patches) if key else ()
        plan = tree.plan(source, self.base, None, aside=True, own_dir=True)
        digest = f"{plan.digest[:16]}-{key[:12]}" if key else plan.digest
        cache_file = _baseline_file(tree.settings, tree.backend, sha, digest)
        on = f"upstream {sha[:12]}" + (
            f" with the queue's build-only patches ({', '.join(c.label for c in self.applied)})" if self.applied else ""
        )
        known = _read_baseline(cache_file)
        missing = [n for n in names if n not in known]
        if not missing:
            self.said.append(f"cached ({on})")
            return {n: known[n] for n in names}
        start = time.monotonic()
        with tree.console.step(f"baseline: {len(missing)} failing tests on {on}"):
            execute_plan(plan, tree.console, build=False)
            _, run, _ = tree.build_and_run(plan, missing, self.own)
        for name in missing:
            known[name] = run.by_name().get(name) or ctest.Result(name, "not run", 0.0, "no such test upstream")
        _write_baseline(cache_file, sha, known)
        self.said.append(f"run ({len(missing)} tests on {on}, {time.monotonic() - start:.0f} s)")
        return {n: known[n] for n in names}


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
