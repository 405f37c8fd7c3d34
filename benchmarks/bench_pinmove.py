"""Pin moves: what a new upstream commit recompiles, skippy's CPU build beside a raw one.

Two upstream moves from the pinned upstream (the test-bed's 0.3.35 commit), made as commits in a
local mirror of the test-bed (as ``tests/e2e/test_maintainer_week.py`` does), each naming the run
so that no compiler cache has seen their objects: (a) the README alone; (b) one line on top of
one source file (``src/llama-batch.cpp``, a ``.cpp`` no other file includes). For each, from
built CPU build dirs of the pin (``llama-server`` and the RPC server):

* skippy: the bench's pin file moved to the commit, then the CPU build session (prepare,
  configure, build; no spot check): Ninja's compile steps, the compiler cache's misses, seconds;
* raw: a clone of the same patched tree with a build dir of its own, configured by hand with
  skippy's -D values but the commit strings held at the pin's (no compiler launcher), built with
  plain cmake + ninja; after checking out the new patched commit: Ninja's compile steps and the
  rebuild's seconds;
* what a tree without core 0003/0004 would recompile: the compile lines that carry the commit
  in the unpatched pin configured as upstream configures it (git asked; no build).

Between the moves (and at the end) both sides go back to the pin. The checkouts and build dirs
stay under ``.deps/bench/pin-move``: a later run starts from built dirs (the first one builds the
raw dir cold, without a compiler cache).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.bench_proofs import share_downloads
from skippy.compile.builder import COMPILE_LINE
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import PROVENANCE_DEFINES, STAMP_NAME, plan_build
from skippy.compile.request import DEFINE_ARG, build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.git import Repo, hermetic_env
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import Collaborators, SessionOutcome, SessionRequest, run_build_session
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare
from skippy.queue.run import PrepareReport

#: (name in the JSON, file the upstream commit changes, its subject)
MOVES: Final = (
    ("readme_only", "README.md", "README: one more line"),
    ("one_source", "src/llama-batch.cpp", "batch: one more line"),
)
#: a README-only move compiles at most this many objects (the commit string's units)
README_ONLY_TARGET: Final = 2
#: skippy compiles at most this many objects more than the raw build with the commit held fixed
EXTRA_TARGET: Final = 2
#: the -D values that carry the commit into a build (held fixed in the raw dir)
COMMIT_DEFINES: Final = ("LLAMA_BUILD_COMMIT", "LLAMA_BUILD_NUMBER")
#: Ninja's step that re-runs CMake because an input of the manifest changed
RERUN_LINE: Final = re.compile(r"^\[\d+/\d+\] Re-running CMake")
_DATES: Final = {"GIT_AUTHOR_DATE": "2024-06-02T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-06-02T00:00:00+0000"}


# --- pure pieces (tests/unit/test_bench_pinmove.py) ------------------------------------------


def moved_text(path: str, text: str, marker: str) -> str:
    """``text`` of ``path`` after the move's upstream commit: a Markdown file gets a line at its end;
    a source file a line of code on top that names the run (a comment would leave the preprocessed
    source as another run's, which the compiler cache then serves: the object must be new)."""
    if path.endswith(".md"):
        return text + ("" if text.endswith("\n") or not text else "\n") + f"\n{marker}\n"
    literal = marker.replace("\\", "\\\\").replace('"', '\\"')
    return f'[[maybe_unused]] static const char skippy_bench_pin_move[] = "{literal}";\n{text}'


def _launcher(name: str) -> bool:
    return name.startswith("CMAKE_") and name.endswith("_COMPILER_LAUNCHER")


def _split(configure_args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """A build stamp's configure arguments: its -D values by name (the last wins), the others in order."""
    defines: dict[str, str] = {}
    rest: list[str] = []
    for arg in configure_args:
        match = DEFINE_ARG.match(arg)
        if match is None:
            rest.append(arg)
        else:
            defines[match.group(1)] = match.group(2)
    return defines, rest


def raw_configure_args(configure_args: Sequence[str]) -> list[str]:
    """skippy's configure arguments (a build stamp's) for the raw dir: no compiler launcher; the
    commit strings and the provenance kept as given (held fixed through the moves)."""
    defines, rest = _split(configure_args)
    return [f"-D{k}={v}" for k, v in defines.items() if not _launcher(k)] + rest


def unpatched_configure_args(configure_args: Sequence[str]) -> list[str]:
    """skippy's configure arguments as an unpatched tree is configured by hand: no launcher, no
    commit given (upstream asks git), no provenance (the unpatched tree declares none)."""
    dropped = {*COMMIT_DEFINES, *PROVENANCE_DEFINES}
    defines, rest = _split(configure_args)
    return [f"-D{k}={v}" for k, v in defines.items() if not _launcher(k) and k not in dropped] + rest


def compile_entries(
    compdb: Sequence[Mapping[str, Any]], wanted: Collection[str] | None = None
) -> list[Mapping[str, Any]]:
    """The compile commands of a ``ninja -t compdb`` list: those that make an object file (links and
    custom commands left out), and only the objects in ``wanted`` when given (a target's inputs)."""
    return [
        e
        for e in compdb
        if str(e.get("output", "")).endswith((".o", ".obj")) and (wanted is None or e.get("output") in wanted)
    ]


def carrying(entries: Sequence[Mapping[str, Any]], needle: str) -> int:
    """How many compile commands of ``entries`` carry ``needle`` (a commit string) on their command line."""
    if not needle:
        raise ValueError("an empty needle is on every line")
    return sum(1 for e in compile_entries(entries) if needle in str(e.get("command", "")))


def move_met(skippy_steps: int, raw_steps: int, *, readme_only: bool) -> bool:
    """A move meets the target: skippy compiles at most EXTRA_TARGET more than the raw build with
    the commit held fixed, and a README-only move at most README_ONLY_TARGET."""
    within = skippy_steps <= raw_steps + EXTRA_TARGET
    return within and (not readme_only or skippy_steps <= README_ONLY_TARGET)


@dataclass
class CompileCounter:
    """Counts Ninja's compile steps in its output lines."""

    compiled: int = 0
    lines: list[str] = field(default_factory=list)
    #: Ninja re-ran CMake first (its manifest depends on the tree's git index, among others)
    reconfigured: bool = False

    def __call__(self, line: str) -> None:
        if RERUN_LINE.match(line):
            self.reconfigured = True
        if COMPILE_LINE.match(line):
            self.compiled += 1
            self.lines.append(line.split(" object ", 1)[1].strip())


# --- the upstream, the skippy side, the raw side ----------------------------------------------


@dataclass(frozen=True)
class Upstream:
    mirror: Path
    pin: str
    #: move name -> the upstream commit
    moves: Mapping[str, str]


def make_upstream(bed_path: Path, root: Path, pin: str, env: Mapping[str, str], marker: str) -> Upstream:
    """A fresh mirror of the test-bed with one commit on ``pin`` per move (pushed as branches)."""
    mirror, work = root / "upstream.git", root / "upstream-work"
    for folder in (mirror, work):
        shutil.rmtree(folder, ignore_errors=True)
    genv = hermetic_env(env, root)
    proc.run(["git", "clone", "--quiet", "--mirror", str(bed_path), str(mirror)], env=genv)
    proc.run(["git", "clone", "--quiet", "--no-checkout", str(mirror), str(work)], env=genv)
    repo = Repo(work, env)
    moves: dict[str, str] = {}
    for name, path, subject in MOVES:
        repo.git("checkout", "--quiet", "--force", "--detach", pin)
        target = work / path
        target.write_text(moved_text(path, target.read_text(encoding="utf-8"), marker), encoding="utf-8")
        repo.git("commit", "--quiet", "-am", subject, env=_DATES)
        moves[name] = repo.out("rev-parse", "HEAD")
        repo.git("push", "--quiet", "--force", "origin", f"HEAD:refs/heads/pin-move/{name}")
    shutil.rmtree(work)
    return Upstream(mirror, pin, moves)


def bench_settings(settings: Settings, root: Path, upstream: Upstream) -> Settings:
    """The project's settings on the bench's upstream mirror, pin file, workdir, build root and
    cache dir (the project's queue; downloads and compiler cache objects shared)."""
    table = {
        **settings.raw,
        "upstream_url": upstream.mirror.as_uri(),
        "pin_file": str(root / "upstream.txt"),
        "patch_dir": str(settings.patch_dir),
        "workdir": str(root / "llama.cpp"),
        "build_root": str(root / "build"),
        "cache_dir": str(root / "cache"),
        "compat_link": False,
    }
    overrides = ("CI", "LLAMA_UPSTREAM_URL", "LLAMA_WORKDIR", "LLAMA_PIN_FILE", "LLAMA_PATCH_DIR")
    env = {k: v for k, v in settings.env.items() if k not in overrides}
    bench = Settings.from_table(settings.root, table, env)
    share_downloads(settings, bench)
    objects = bench.cache_dir / "sccache"
    if (settings.cache_dir / "sccache").is_dir() and not objects.exists():
        objects.symlink_to((settings.cache_dir / "sccache").resolve())
    return bench


@dataclass(frozen=True)
class SkippyBuild:
    outcome: SessionOutcome
    prepared: PrepareReport
    wall_s: float
    #: the objects Ninja compiled (read from the session's output)
    objects: tuple[str, ...]


def skippy_build(bench: Settings, upstream_commit: str) -> SkippyBuild:
    """Move the bench's pin file to ``upstream_commit`` and run the CPU build session (no spot check)."""
    bench.pin_file.write_text(upstream_commit + "\n", encoding="utf-8")
    reports: list[PrepareReport] = []

    def prepare_pinned(s: Settings, c: Console, _backend: str) -> PrepareReport:
        reports.append(prepare(s, Target.pinned(), console=c))
        return reports[-1]

    said = io.StringIO()
    started = time.perf_counter()
    request = SessionRequest(build_request("cpu", bench), spot_check=False)
    outcome = run_build_session(request, bench, Console(env={}, stream=said), Collaborators(prepare=prepare_pinned))
    wall = time.perf_counter() - started
    assert outcome.build is not None and reports
    counter = CompileCounter()
    for line in said.getvalue().splitlines():
        counter(line)
    return SkippyBuild(outcome, reports[-1], wall, tuple(counter.lines))


@dataclass(frozen=True)
class RawDir:
    """The by-hand side: a clone of the patched tree and its own build dir."""

    tree: Path
    build_dir: Path
    cmake: str
    ninja: str
    targets: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def repo(self) -> Repo:
        return Repo(self.tree, self.env)

    def checkout(self, workdir: Path, patched_sha: str) -> float:
        """Bring the patched commit over from skippy's workdir and check it out; seconds."""
        started = time.perf_counter()
        if not self.repo.has_commit(patched_sha):
            self.repo.git("fetch", "--quiet", str(workdir), "HEAD")
            assert self.repo.out("rev-parse", "FETCH_HEAD") == patched_sha, "the workdir is at the new commit"
        self.repo.git("checkout", "--quiet", "--detach", patched_sha)
        return time.perf_counter() - started

    def configure(self, args: Sequence[str]) -> None:
        argv = [self.cmake, "-S", str(self.tree), "-B", str(self.build_dir), "-G", "Ninja", *args]
        proc.run(argv, env=self.env, timeout=3600)

    def build(self) -> tuple[CompileCounter, float]:
        counter = CompileCounter()
        started = time.perf_counter()
        argv = [self.ninja, "-C", str(self.build_dir), *self.targets]
        proc.run(argv, env=self.env, on_line=counter, timeout=3 * 3600)
        return counter, time.perf_counter() - started


def raw_dir(root: Path, built: SkippyBuild, env: Mapping[str, str]) -> tuple[RawDir, list[str]]:
    """The raw side beside skippy's build of the pin (its tool paths and targets); the arguments
    it is configured with (skippy's, the commit strings held at the pin's)."""
    assert built.outcome.build is not None
    stamp = json.loads((built.outcome.build.build_dir / STAMP_NAME).read_text(encoding="utf-8"))
    tree = root / "raw" / "llama.cpp"
    if not (tree / ".git").is_dir():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        Repo(tree, env).git("init", "--quiet")
    raw = RawDir(
        tree=tree,
        build_dir=root / "raw" / "build",
        cmake=stamp["tools"]["cmake"]["path"],
        ninja=stamp["tools"]["ninja"]["path"],
        targets=tuple(built.outcome.build.binaries),
        env=dict(env),
    )
    return raw, raw_configure_args(stamp["configure_args"])


def target_compile_lines(
    ninja: str, build_dir: Path, targets: Sequence[str], env: Mapping[str, str]
) -> list[Mapping[str, Any]]:
    """The compile commands of the objects ``targets`` are made of (``ninja -t compdb`` and
    ``-t inputs``, with the Ninja that built the dir: another version would start its log over)."""
    data = json.loads(proc.run([ninja, "-C", str(build_dir), "-t", "compdb"], env=env).stdout)
    assert isinstance(data, list)
    inputs = proc.run([ninja, "-C", str(build_dir), "-t", "inputs", *targets], env=env).stdout.split()
    return compile_entries(data, frozenset(inputs))


def unpatched_lines(raw: RawDir, base: str, configure_args: Sequence[str]) -> dict[str, Any]:
    """The unpatched pin configured as upstream configures it (git asked for the commit): how
    many of its compile lines carry the commit string (configure only, nothing built; a worktree
    of the raw clone at ``base``, removed after)."""
    tree, build_dir = raw.tree.parent / "unpatched", raw.tree.parent / "unpatched-build"
    shutil.rmtree(build_dir, ignore_errors=True)
    raw.repo.git("worktree", "remove", "--force", str(tree), check=False)
    shutil.rmtree(tree, ignore_errors=True)
    raw.repo.git("worktree", "prune")
    raw.repo.git("worktree", "add", "--quiet", "--detach", str(tree), base)
    try:
        short = Repo(tree, raw.env).out("rev-parse", "--short", "HEAD")
        args = unpatched_configure_args(configure_args)
        proc.run([raw.cmake, "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", *args], env=raw.env, timeout=3600)
        lines = target_compile_lines(raw.ninja, build_dir, raw.targets, raw.env)
    finally:
        raw.repo.git("worktree", "remove", "--force", str(tree), check=False)
        shutil.rmtree(build_dir, ignore_errors=True)
    return {"commit": short, "compile_lines": len(lines), "carrying_commit": carrying(lines, short)}


# --- the section --------------------------------------------------------------------------------


def _skippy_figures(built: SkippyBuild) -> dict[str, Any]:
    report = built.outcome.build
    assert report is not None
    cache = report.cache
    return {
        "compile_steps": report.compiled,
        "cache_hits": cache.hits if cache else None,
        "cache_misses": cache.misses if cache else None,
        "prepare_s": round(built.prepared.seconds, 2),
        "configure_s": round(report.configure_seconds, 2),
        "build_s": round(report.build_seconds, 2),
        "wall_s": round(built.wall_s, 2),
    }


def _measure_move(name: str, commit: str, bench: Settings, raw: RawDir, back: Callable[[], None]) -> dict[str, Any]:
    """One move from built dirs of the pin: skippy's session, then the raw dir's checkout + ninja."""
    ours = skippy_build(bench, commit)
    checkout_s = raw.checkout(bench.workdir, ours.prepared.patched_sha)
    counter, rebuild_s = raw.build()
    tree = raw.repo.out("rev-parse", "HEAD^{tree}")
    assert tree == Repo(bench.workdir, bench.env).out("rev-parse", "HEAD^{tree}"), "raw builds skippy's tree"
    skippy = _skippy_figures(ours)
    back()
    return {
        "upstream_commit": commit,
        "skippy": {**skippy, "objects": sorted(ours.objects)},
        "raw_fixed_commit": {
            "compile_steps": counter.compiled,
            "checkout_s": round(checkout_s, 2),
            "rebuild_s": round(rebuild_s, 2),
            "objects": sorted(counter.lines),
            "cmake_reran": counter.reconfigured,
        },
        "tree": tree,
        "met": move_met(skippy["compile_steps"], counter.compiled, readme_only=name == "readme_only"),
    }


def bench_pin_move(settings: Settings, console: Console) -> dict[str, Any]:
    """The pin-move figures (see the module docstring)."""
    from tooling.testbed import testbed_for

    bed = testbed_for(settings, console)
    version = "0.3.35" if "0.3.35" in bed.versions else bed.versions[0]
    root = settings.cache_dir.parent / "bench" / "pin-move"
    root.mkdir(parents=True, exist_ok=True)
    upstream = make_upstream(
        bed.path, root, bed.commits[version], settings.env, f"skippy bench pin-move {time.time_ns()}"
    )
    bench = bench_settings(settings, root, upstream)
    try:
        result = _measure(bench, root, upstream, console)
    finally:
        _stop_server(bench)
    result["upstream"] = {"version": version, "pin": upstream.pin}
    _say(console, result)
    return result


def _measure(bench: Settings, root: Path, upstream: Upstream, console: Console) -> dict[str, Any]:
    with console.step("bench: skippy's and the raw build dirs at the pin"):
        initial = skippy_build(bench, upstream.pin)
        stamp = wd.read_stamp(bench.workdir / ".git")
        assert stamp is not None and initial.outcome.build is not None
        raw, raw_args = raw_dir(root, initial, bench.env)
        raw.checkout(bench.workdir, stamp.patched_sha)
        raw.configure(raw_args)
        raw_initial, raw_initial_s = raw.build()

    def back() -> None:
        skippy_build(bench, upstream.pin)
        raw.checkout(bench.workdir, stamp.patched_sha)
        raw.build()

    moves: dict[str, Any] = {}
    for name, _path, _subject in MOVES:
        with console.step(f"bench: pin move {name.replace('_', ' ')}, skippy then raw"):
            moves[name] = _measure_move(name, upstream.moves[name], bench, raw, back)
    with console.step("bench: the unpatched pin's compile lines that carry the commit"):
        unpatched = unpatched_lines(raw, stamp.base_commit, raw_args)
    ours = target_compile_lines(raw.ninja, initial.outcome.build.build_dir, raw.targets, bench.env)
    return {
        "target": " ".join(raw.targets),
        "initial": {
            "skippy_s": round(initial.wall_s, 1),
            "skippy_compile_steps": initial.outcome.build.compiled,
            "raw_s": round(raw_initial_s, 1),
            "raw_compile_steps": raw_initial.compiled,
        },
        "moves": moves,
        "commit_on_compile_lines": {
            "skippy": carrying(ours, stamp.upstream_sha[:12]),
            "compile_lines": len(ours),
            "unpatched_upstream": unpatched,
        },
        "target_readme_only_steps": README_ONLY_TARGET,
        "target_extra_steps": EXTRA_TARGET,
        "met": all(m["met"] for m in moves.values()),
    }


def _stop_server(bench: Settings) -> None:
    """Stop the compiler cache server the bench's builds started (its own socket, under its cache dir)."""
    stamp = wd.read_stamp(bench.workdir / ".git")
    if stamp is None:
        return
    plan = plan_build(
        build_request("cpu", bench),
        bench,
        tree=inspect_tree(bench.workdir),
        toolchain=probe_toolchain("cpu", bench),
        patched_sha=stamp.patched_sha,
    )
    stop_cache_server(plan)


def _say(console: Console, result: Mapping[str, Any]) -> None:
    parts = []
    for name, move in result["moves"].items():
        parts.append(
            f"{name.replace('_', ' ')}: skippy {move['skippy']['compile_steps']} compile step(s) in "
            f"{move['skippy']['wall_s']:.1f} s vs raw (commit held fixed) "
            f"{move['raw_fixed_commit']['compile_steps']} in {move['raw_fixed_commit']['rebuild_s']:.1f} s"
        )
    lines = result["commit_on_compile_lines"]
    console.info(
        "pin move: "
        + "; ".join(parts)
        + f"; the commit is on {lines['skippy']} of skippy's {lines['compile_lines']} compile lines, on "
        f"{lines['unpatched_upstream']['carrying_commit']} of the unpatched tree's "
        f"{lines['unpatched_upstream']['compile_lines']} ({'met' if result['met'] else 'MISSED'})"
    )
