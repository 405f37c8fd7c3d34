"""``nox -s bench``: skippy's speed targets, measured beside the raw tools in the same run.

Prepare figures use the real llama.cpp test-bed (three vendored upstream trees
in a local bare repository) as the upstream and a small real queue written
against the pinned tree.  Figures go to one JSON file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import Null, Timing, timed
from skippy.cli.run import guarded, load
from skippy.compile.builder import COMPILE_LINE
from skippy.core import proc
from skippy.core.git import Repo, hermetic_env
from skippy.core.settings import Settings
from skippy.core.ui import Console

if TYPE_CHECKING:
    pass

#: targets from the issues; the report says whether each was met
NOOP_TARGET_S = 0.3
COLD_RATIO_TARGET = 1.15

BENCH_PYPROJECT = """\
[project]
name = "skippy-bench"
version = "0"

[tool.skippy]
upstream_url = "{url}"
pin_file = "upstream.txt"
patch_dir = "patches"
workdir = "work/llama.cpp"
compat_link = false
"""

#: (lane, file, path in the tree, line put at its top): a small real queue, all lanes
BENCH_EDITS: tuple[tuple[str, str, str, str], ...] = (
    ("core", "0001-core-provenance-comment.patch", "src/llama.cpp", "// skippy bench: core 1\n"),
    ("core", "0002-core-model-comment.patch", "src/llama-model.cpp", "// skippy bench: core 2\n"),
    ("core", "0003-core-new-file.patch", "src/skippy-bench.h", "#pragma once\n"),
    ("model_support", "0001-gemma3-comment.patch", "src/llama-arch.cpp", "// skippy bench: model support\n"),
    ("generated", "0001-family-llama.patch", "src/skippy-generated-llama.inc", "// generated llama\n"),
)


def mtimes(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                out[str(path.relative_to(root))] = path.stat().st_mtime_ns
    return out


def write_bench_queue(
    upstream_url: str,
    pin: str,
    into: Path,
    env: Mapping[str, str],
    scratch: Path,
    *,
    edits: Sequence[tuple[str, str, str, str]] = BENCH_EDITS,
) -> list[Path]:
    """Write BENCH_EDITS as format-patch mailboxes against ``pin`` (one commit per patch, each on the pin)."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    genv = hermetic_env(env, scratch.parent)
    proc.run(["git", "clone", "--quiet", "--no-checkout", upstream_url, str(scratch)], env=genv)
    repo = Repo(scratch, env)
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    written: list[Path] = []
    for lane, name, rel, line in edits:
        repo.git("checkout", "--quiet", "--force", "--detach", pin)
        target = scratch / rel
        before = target.read_text(encoding="utf-8") if target.exists() else ""
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(line + before, encoding="utf-8")
        repo.git("add", "--", rel)
        subject = name.split("-", 1)[1].removesuffix(".patch").replace("-", " ")
        repo.git(
            "commit",
            "--quiet",
            "-m",
            f"bench: {subject}",
            env={"GIT_AUTHOR_DATE": "2024-06-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-06-01T00:00:00+0000"},
        )
        mbox = repo.git("format-patch", "--stdout", "--zero-commit", "--no-signature", "-1", "HEAD").stdout
        folder = into if lane == "core" else into / lane
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(mbox, encoding="utf-8")
        if lane != "core":
            with (folder / "series").open("a", encoding="utf-8") as fh:
                fh.write(name + "\n")
        written.append(path)
    shutil.rmtree(scratch)
    return written


def with_shipped(shipped: Path, bench: Path) -> list[Path]:
    """Put the shipped queue's lanes before the bench patches in ``bench`` (renumbering them)."""
    from skippy.queue.model import LANES, Lane, load_queue

    ship = load_queue(shipped)
    ordered: list[Path] = []
    for lane in LANES:
        folder = bench if lane is Lane.CORE else bench / str(lane.folder)
        own = sorted(folder.glob("*.patch")) if folder.is_dir() else []
        theirs = ship.lane(lane)
        folder.mkdir(parents=True, exist_ok=True)
        renamed: list[Path] = []
        for path in reversed(own):  # highest first, so no rename overwrites another
            number, rest = path.name.split("-", 1)
            target = folder / f"{int(number) + len(theirs):04d}-{rest}"
            path.rename(target)
            renamed.insert(0, target)
        copied = []
        for patch in theirs:
            target = folder / patch.name
            target.write_bytes(patch.data)
            copied.append(target)
        names = [p.name for p in (*copied, *renamed)]
        if lane is not Lane.CORE:
            (folder / "series").write_text("".join(n + "\n" for n in names), encoding="utf-8")
        ordered += [folder / n for n in names]
    return ordered


def alternating(
    rounds: int,
    first: Callable[[], object],
    second: Callable[[], object],
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], list[float]]:
    """Seconds of ``rounds`` runs of each action, the order swapped every round (so neither always
    runs on the caches the other warmed)."""
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            started = clock()
            (first, second)[which]()
            samples[which].append(clock() - started)
    return samples


def _bench_project(settings: Settings, url: str, pin: str) -> tuple[Path, list[Path]]:
    """A fresh bench project on the test-bed at ``pin``; the patch files of its queue, in order."""
    base = settings.cache_dir.parent / "bench"
    project = base / "project"
    if project.exists():
        shutil.rmtree(project)
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(BENCH_PYPROJECT.format(url=url), encoding="utf-8")
    (project / "upstream.txt").write_text(pin + "\n", encoding="utf-8")
    shutil.copy(settings.root / "tasks.py", project / "tasks.py")
    write_bench_queue(url, pin, project / "patches", settings.env, base / "scratch")
    # the shipped queue first (it applies to this tree: the test-bed's 0.3.35 commit has the pin's
    # tree), then the bench's own patches: the figures are those of the product's queue
    return project, with_shipped(settings.patch_dir, project / "patches")


def bench_prepare(
    settings: Settings,
    console: Console,
    *,
    rounds: int,
    noop_rounds: int,
    python: str = sys.executable,
) -> dict[str, Any]:
    from tooling.testbed import testbed_for

    bed = testbed_for(settings, console)
    version = "0.3.35" if "0.3.35" in bed.versions else bed.versions[0]
    pin = bed.commits[version]
    project, patches = _bench_project(settings, bed.url, pin)
    invoke = str(Path(python).parent / "invoke")
    env = dict(settings.env)
    env.pop("CI", None)  # measure the interactive path
    for var in ("LLAMA_UPSTREAM_URL", "LLAMA_WORKDIR", "LLAMA_PIN_FILE", "LLAMA_PATCH_DIR"):
        env.pop(var, None)
    workdir = project / "work" / "llama.cpp"
    raw_dir = project / "raw" / "llama.cpp"
    raw_env = hermetic_env(settings.env, raw_dir.parent)

    def skippy_cold() -> None:
        shutil.rmtree(project / "work", ignore_errors=True)
        proc.run([invoke, "prepare", "--pinned"], env=env, cwd=project)

    def raw_cold() -> None:
        shutil.rmtree(raw_dir.parent, ignore_errors=True)
        raw_dir.parent.mkdir(parents=True)
        proc.run(["git", "clone", "--quiet", bed.url, str(raw_dir)], env=raw_env)
        proc.run(["git", "-C", str(raw_dir), "checkout", "--quiet", "--detach", pin], env=raw_env)
        proc.run(
            ["git", "-C", str(raw_dir), "am", "--3way", "--quiet", *map(str, patches)],
            env=raw_env,
        )

    console.info(f"bench: cold prepare vs raw git, {rounds} round(s) each, alternating")
    skippy_cold()  # warm the page cache and the archive-free path once
    raw_cold()
    skippy_samples, raw_samples = alternating(rounds, skippy_cold, raw_cold)
    raw_head = proc.run(["git", "-C", str(raw_dir), "rev-parse", "HEAD^{tree}"], env=raw_env).stdout.strip()
    ours_head = proc.run(["git", "-C", str(workdir), "rev-parse", "HEAD^{tree}"], env=raw_env).stdout.strip()
    cold_skippy, cold_raw = Timing(tuple(skippy_samples)), Timing(tuple(raw_samples))
    ratio = cold_skippy.median / cold_raw.median

    console.info(f"bench: no-op `invoke prepare --pinned`, {noop_rounds} round(s)")
    before = mtimes(workdir)
    noop_samples = [
        timed(lambda: proc.run([invoke, "prepare", "--pinned"], env=env, cwd=project)) for _ in range(noop_rounds)
    ]
    after = mtimes(workdir)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    noop = Timing(tuple(noop_samples))
    files = sum(1 for k in before if not k.startswith(".git/"))
    return {
        "upstream": {"testbed": str(bed.path), "version": version, "pin": pin, "files": files},
        "queue": {"patches": len(patches)},
        "cold_prepare": {
            "skippy": cold_skippy.as_dict(),
            "raw_git": cold_raw.as_dict(),
            "ratio": round(ratio, 3),
            "target_ratio": COLD_RATIO_TARGET,
            "met": ratio <= COLD_RATIO_TARGET,
            "same_tree_as_raw": raw_head == ours_head,
        },
        "noop_prepare": {
            **noop.as_dict(),
            "target_s": NOOP_TARGET_S,
            "met": noop.median <= NOOP_TARGET_S,
            "files_with_changed_mtime": len(changed),
            "changed": changed[:20],
        },
    }


def bed_url(workdir: Path, env: Mapping[str, str]) -> str:
    """The upstream URL the bench workdir was cloned from."""
    return proc.run(["git", "-C", str(workdir), "remote", "get-url", "origin"], env=env).stdout.strip()


def compile_step_set(build_dir: Path, env: Mapping[str, str], target: str) -> frozenset[str]:
    """The compile steps Ninja would run for ``target`` (``ninja -n``), by object file.

    The manifest is brought up to date for real first: a dry run whose build.ninja is stale
    (CMake re-runs when the checkout's git index changes) lists only the CMake step.
    """
    proc.run(["ninja", "-C", str(build_dir), "build.ninja"], env=env, timeout=3600)
    out = proc.run(["ninja", "-C", str(build_dir), "-n", target], env=env).stdout
    return frozenset(line.split(" object ", 1)[1].strip() for line in out.splitlines() if COMPILE_LINE.match(line))


class StepCounter:
    """Counts ``ninja -n`` compile steps beyond the ones a fresh, complete build still lists.

    llama.cpp's UI-assets step always runs and, in a dry run, drags the objects below it along
    (a real run prunes them with restat); those are measured once, right after the build, and
    not counted.
    """

    def __init__(self, build_dir: Path, env: Mapping[str, str], target: str) -> None:
        self.build_dir, self.env, self.target = build_dir, env, target
        self.always = compile_step_set(build_dir, env, target)

    def __call__(self) -> int:
        return len(self.objects())

    def objects(self) -> list[str]:
        return sorted(compile_step_set(self.build_dir, self.env, self.target) - self.always)


def _snapshot(root: Path, paths: Sequence[str]) -> dict[str, tuple[bytes, int]]:
    return {p: ((root / p).read_bytes(), (root / p).stat().st_mtime_ns) for p in paths if (root / p).exists()}


def _restore(root: Path, saved: Mapping[str, tuple[bytes, int]]) -> None:
    """Put content and modification times back, so Ninja sees the tree it built."""
    for rel, (data, mtime) in saved.items():
        path = root / rel
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        os.utime(path, ns=(mtime, mtime))


def bench_minimal_touch(settings: Settings, console: Console, *, python: str = sys.executable) -> dict[str, Any]:
    """Compile steps after one patch changes: skippy's re-prepare vs editing by hand vs reset + re-apply.

    Runs in the bench project that :func:`bench_prepare` left (real llama.cpp tree, five-patch queue):
    builds ``llama-server`` once (compiler cache under the cache dir), then measures with ``ninja -n``.
    """
    from skippy.queue import workdir as wd

    project = settings.cache_dir.parent / "bench" / "project"
    workdir = project / "work" / "llama.cpp"
    invoke = str(Path(python).parent / "invoke")
    env = dict(settings.env)
    env.pop("CI", None)
    genv = hermetic_env(settings.env, workdir.parent)
    if not (workdir / ".git").is_dir():
        proc.run([invoke, "prepare", "--pinned"], env=env, cwd=project)
    target = "llama-server"
    build_dir, build_env, build_seconds = _build_once(settings, console, project, workdir, env)
    results: dict[str, Any] = {"target": target, "initial_build_s": round(build_seconds, 1)}
    compile_steps = StepCounter(build_dir, build_env, target)
    results["dry_run_always_listed"] = sorted(compile_steps.always)
    proc.run([invoke, "prepare", "--pinned"], env=env, cwd=project)
    results["nothing_changed"] = {"after_skippy_noop": compile_steps()}
    # one patch changes: the model-support patch now adds a second line
    stamp = wd.read_stamp(workdir / ".git")
    assert stamp is not None
    base, old_head = stamp.base_commit, stamp.patched_sha
    (patch,) = (project / "patches" / "model_support").glob("*-gemma3-comment.patch")
    old_patch = patch.read_bytes()
    new_patch = _variant_patch(project, workdir, genv, env, base)
    # the new patched commit, computed aside (nothing in the workdir moves)
    patch.write_bytes(new_patch)
    new_head, queue_paths = _patched_aside(project, workdir, env, base, console)
    patch.write_bytes(old_patch)
    changed = _git_lines(workdir, genv, "diff", "--name-only", old_head, new_head)
    all_patched = _git_lines(workdir, genv, "diff", "--name-only", base, old_head)
    saved = _snapshot(workdir, sorted(set(changed) | set(all_patched)))
    # (a) the physical minimum: write the new content of the changed files by hand
    for rel in changed:
        (workdir / rel).write_bytes(
            proc.run(["git", "-C", str(workdir), "show", f"{new_head}:{rel}"], env=genv).stdout.encode()
        )
    by_hand = compile_steps()
    _restore(workdir, saved)
    assert compile_steps() == 0
    # (b) what the old scripts did: reset to upstream and re-apply the whole (new) queue
    patch.write_bytes(new_patch)
    proc.run(["git", "-C", str(workdir), "checkout", "--quiet", "--force", "--detach", base], env=genv)
    proc.run(["git", "-C", str(workdir), "am", "--3way", "--quiet", *queue_paths], env=genv)
    reset_reapply = compile_steps()
    proc.run(["git", "-C", str(workdir), "checkout", "--quiet", "--force", "--detach", old_head], env=genv)
    _restore(workdir, saved)
    assert compile_steps() == 0
    # (c) skippy's re-prepare with the changed patch
    re_prepare = timed(lambda: proc.run([invoke, "prepare", "--pinned"], env=env, cwd=project))
    skippy_objects = compile_steps.objects()
    skippy_steps = len(skippy_objects)
    patch.write_bytes(old_patch)
    results["one_patch_changed"] = {
        "files_changed": changed,
        "compile_steps_skippy_reprepare": skippy_steps,
        "compile_steps_by_hand": by_hand,
        "compile_steps_reset_reapply": reset_reapply,
        "skippy_equals_minimum": skippy_steps == by_hand,
        "objects_after_skippy_reprepare": skippy_objects,
        "reprepare_s": round(re_prepare, 3),
    }
    # leave the project as the queue says (the next bench starts from here)
    proc.run([invoke, "prepare", "--pinned"], env=env, cwd=project)
    proc.run(["ninja", "-C", str(build_dir), target], env=build_env, timeout=3 * 3600)
    return results


def _build_once(
    settings: Settings, console: Console, project: Path, workdir: Path, env: Mapping[str, str]
) -> tuple[Path, dict[str, str], float]:
    """Configure and build the bench tree exactly as ``nox -s build-cpu`` plans it (flags, launcher,
    provenance, build info); ``(build dir, its environment, seconds)``."""
    from skippy.compile.builder import execute_plan
    from skippy.compile.plan import plan_build
    from skippy.compile.request import build_request
    from skippy.compile.toolchain import inspect_tree, probe_toolchain
    from skippy.queue import workdir as wd

    first = wd.read_stamp(workdir / ".git")
    assert first is not None
    build_settings = Settings.from_table(
        project, {"build_root": str(project / "build"), "cache_dir": str(settings.cache_dir / "bench")}, env
    )
    plan = plan_build(
        build_request("cpu", build_settings),
        build_settings,
        tree=inspect_tree(workdir),
        toolchain=probe_toolchain("cpu", build_settings),
        patched_sha=first.patched_sha,
        upstream_sha=first.upstream_sha,
        queue_digest=first.queue_digest,
        build_number=0,
    )
    with console.step("bench: configure and build llama-server once (compile counts need a built tree)"):
        started = time.perf_counter()
        execute_plan(plan, Console(env={}, stream=Null()))
        seconds = time.perf_counter() - started
    return plan.build_dir, {**env, **plan.env_overrides}, seconds


def _variant_patch(project: Path, workdir: Path, genv: Mapping[str, str], env: Mapping[str, str], base: str) -> bytes:
    """The model-support patch of the bench queue with one more line (exported like the others)."""
    variant = tuple(
        (lane, name, rel, line + "// and one more line\n" if lane == "model_support" else line)
        for lane, name, rel, line in BENCH_EDITS
    )
    scratch_queue = project.parent / "variant-queue"
    write_bench_queue(bed_url(workdir, genv), base, scratch_queue, env, project.parent / "scratch", edits=variant)
    new_patch = (scratch_queue / "model_support" / "0001-gemma3-comment.patch").read_bytes()
    shutil.rmtree(scratch_queue)
    return new_patch


def _patched_aside(
    project: Path, workdir: Path, env: Mapping[str, str], base: str, console: Console
) -> tuple[str, list[str]]:
    """The patched commit of the project's queue on ``base``, built aside; and the queue's patch files."""
    from skippy.queue.model import load_queue
    from skippy.queue.prepare import apply_queue_aside

    bench_settings = Settings.load(project, env)
    queue = load_queue(bench_settings.patch_dir)
    new_head = apply_queue_aside(bench_settings, Repo(workdir, env), base, queue, console=console)
    return new_head, [str(p.path) for p in queue.patches]


def _git_lines(workdir: Path, genv: Mapping[str, str], *args: str) -> list[str]:
    return [p for p in proc.run(["git", "-C", str(workdir), *args], env=genv).stdout.splitlines() if p]


SECTIONS = (
    "prepare",
    "minimal-touch",
    "builds",
    "shared-objects",
    "spot-check",
    "remote-cache",
    "pin-move",
    "graph-parse",
    "parse",
    "generate-all",
    "scale",
)
#: sections run only when asked for with --only (long: the whole CUDA and ROCm builds)
ON_REQUEST = ("cuda", "cuda-profile", "rocm", "upstream-tests", "dist")


def _bench_tests(settings: Settings, console: Console) -> dict[str, Any]:
    from benchmarks.bench_tests import bench_upstream_tests

    return bench_upstream_tests(settings, console)


def _bench_cuda_profile(settings: Settings, console: Console) -> dict[str, Any]:
    from benchmarks.bench_cuda_profile import bench_cuda_profile

    return bench_cuda_profile(settings, console)


def _bench_graph_parse(settings: Settings, console: Console) -> dict[str, Any]:
    from benchmarks.bench_graphparse import bench_graph_parse

    return bench_graph_parse(settings, console)


def _bench_parse(settings: Settings, console: Console) -> dict[str, Any]:
    from benchmarks.bench_parse import bench_parse

    return bench_parse(settings, console)


def _bench_dist(settings: Settings, console: Console) -> dict[str, Any]:
    from benchmarks.bench_dist import bench_dist

    return bench_dist(settings, console)


def _run_proofs(settings: Settings, console: Console, wanted: set[str], report: dict[str, Any]) -> None:
    """The sections of :mod:`benchmarks.bench_proofs` (spot check, remote cache, CUDA), pin moves,
    the C++ parsers on the family files, and the parity audit's C++ reading."""
    from benchmarks import bench_pinmove, bench_proofs

    sections = {
        "spot-check": ("spot_check", "the spot check after an up-to-date CPU build", bench_proofs.bench_spot_check),
        "remote-cache": ("remote_cache", "a new machine served by a Redis cache", bench_proofs.bench_remote_cache),
        "cuda": ("cuda", "the whole CUDA build from the wheel toolkit", bench_proofs.bench_cuda),
        "cuda-profile": ("cuda_profile", "where a cached CUDA build's time goes (sampled)", _bench_cuda_profile),
        "rocm": ("rocm", "the whole ROCm build inside the Debian root", bench_proofs.bench_rocm),
        "upstream-tests": ("upstream_tests", "upstream's tests: build, ctest, one attribution", _bench_tests),
        "pin-move": ("pin_move", "pin moves: skippy's build vs raw, commit held fixed", bench_pinmove.bench_pin_move),
        "graph-parse": ("graph_parse", "C++ parsers on the family files: tree-sitter vs libclang", _bench_graph_parse),
        "parse": ("parse", "the parity audit's C++ reading: tree-sitter vs the old text scanner", _bench_parse),
        "dist": (
            "dist",
            "the CPU build and a sample of CUDA's objects sent to a local sccache-dist cluster, beside local builds",
            _bench_dist,
        ),
    }
    for name, (key, title, bench) in sections.items():
        if name in wanted:
            with console.step(f"bench: {title}"):
                report[key] = bench(settings, console)


def _run_generate_all(
    settings: Settings, console: Console, wanted: set[str], report: dict[str, Any], *, rounds: int, builds: bool
) -> None:
    """The generate-all section (:mod:`benchmarks.bench_generate`); ``builds=False`` (``--no-builds``)
    keeps it and leaves out its build figures.  Its summary line ends the section."""
    if "generate-all" not in wanted:
        return
    from benchmarks.bench_generate import bench_generate_all

    with console.step("bench: the built-in generator over every family of the pinned tree"):
        report["generate_all"] = bench_generate_all(settings, console, rounds=rounds, build=builds)


def _run_scale(
    settings: Settings, console: Console, wanted: set[str], report: dict[str, Any], *, output: Path, scale: ScaleOptions
) -> None:
    """The scale section (:mod:`benchmarks.bench_scale`): the queue commands at several queue sizes,
    the plot beside ``output``."""
    if "scale" not in wanted:
        return
    from benchmarks.bench_scale import bench_scale

    with console.step(f"bench: the queue commands at N = {', '.join(map(str, scale.sizes))} patches"):
        report["scale"] = bench_scale(
            settings, console, sizes=scale.sizes, rounds=scale.rounds, plot_to=output.parent / "scale.png"
        )


@dataclass(frozen=True)
class ScaleOptions:
    """The scale section's queue sizes and rounds (``--scale-sizes``, ``--scale-rounds``)."""

    sizes: tuple[int, ...] = (9, 40, 130, 400)
    rounds: int = 2


def run(
    settings: Settings,
    console: Console,
    *,
    output: Path,
    rounds: int = 5,
    noop_rounds: int = 15,
    builds: bool = True,
    only: Sequence[str] = (),
    scale: ScaleOptions = ScaleOptions(),
) -> int:
    """Run the bench sections (``only`` limits them; figures already in ``output`` are kept)."""
    wanted = set(only) or set(SECTIONS)
    if not builds:
        # the sections that build (all but prepare)
        wanted -= {"minimal-touch", "builds", "shared-objects", "spot-check", "remote-cache", "pin-move", *ON_REQUEST}
    report: dict[str, Any] = {}
    if output.is_file() and only:
        report = json.loads(output.read_text(encoding="utf-8"))
    report.update({"schema": 1, "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}})
    # the bench checkout is made by the prepare section; the build sections on it need it first
    needs_project = bool(wanted & {"minimal-touch", "builds"})
    if "prepare" in wanted or (needs_project and not (settings.cache_dir.parent / "bench" / "project").is_dir()):
        report["prepare"] = bench_prepare(settings, console, rounds=rounds, noop_rounds=noop_rounds)
    if "minimal-touch" in wanted:
        report["minimal_touch"] = bench_minimal_touch(settings, console)
    if "builds" in wanted:
        with console.step("bench: build figures (cold vs raw, up to date, compiler cache)"):
            from benchmarks.bench_builds import bench_builds

            report["builds"] = bench_builds(settings, console)
    if "shared-objects" in wanted:
        with console.step("bench: compile lines the CPU and the Vulkan build of one tree share"):
            from benchmarks.bench_shared import bench_shared_objects

            report["shared_objects"] = bench_shared_objects(settings, console)
    _run_proofs(settings, console, wanted, report)
    _run_generate_all(settings, console, wanted, report, rounds=rounds, builds=builds)
    _run_scale(settings, console, wanted, report, output=output, scale=scale)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    p = report.get("prepare")
    if p:
        console.info(
            f"cold prepare: skippy {p['cold_prepare']['skippy']['median_s']:.3f} s vs raw git "
            f"{p['cold_prepare']['raw_git']['median_s']:.3f} s = {p['cold_prepare']['ratio']:.3f}x "
            f"(target <= {COLD_RATIO_TARGET}x: {'met' if p['cold_prepare']['met'] else 'MISSED'})"
        )
        console.info(
            f"no-op prepare: median {p['noop_prepare']['median_s']:.3f} s "
            f"(target <= {NOOP_TARGET_S} s: {'met' if p['noop_prepare']['met'] else 'MISSED'}), "
            f"{p['noop_prepare']['files_with_changed_mtime']} file(s) with a changed mtime"
        )
    if "minimal_touch" in report:
        m = report["minimal_touch"]["one_patch_changed"]
        console.info(
            f"one patch changed: {m['compile_steps_skippy_reprepare']} compile step(s) after skippy's re-prepare, "
            f"{m['compile_steps_by_hand']} after editing by hand, {m['compile_steps_reset_reapply']} after "
            f"reset + re-apply; nothing changed: {report['minimal_touch']['nothing_changed']['after_skippy_noop']}"
        )
    if "builds" in report:
        b = report["builds"]
        console.info(
            f"cold CPU build: skippy {b['cold_build']['skippy_s']:.1f} s vs raw {b['cold_build']['raw_s']:.1f} s "
            f"({b['cold_build']['overhead_pct']:+.2f}%, target <= 2%); up-to-date nox -s build-cpu median "
            f"{b['up_to_date_nox_build_cpu']['median_s']:.2f} s (target < 5 s); warm-cache fresh dir "
            f"{b['compiler_cache']['warm_fresh_dir_s']:.1f} s vs cold {b['compiler_cache']['cold_s']:.1f} s "
            f"= {b['compiler_cache']['ratio']:.2f} (target <= 0.25)"
        )
    console.info(f"figures written to {output}")
    return 0


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(env: Mapping[str, str], *, root: Path | None = None, args: Sequence[str] = ()) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="nox -s bench --")
    parser.add_argument("--output", type=Path, default=None, help="JSON figures (default .bench/bench.json)")
    parser.add_argument("--rounds", type=int, default=5, help="cold prepare rounds per side")
    parser.add_argument("--noop-rounds", type=int, default=15, help="no-op prepare rounds")
    parser.add_argument("--no-builds", action="store_true", help="skip the figures that need a llama.cpp build")
    parser.add_argument(
        "--scale-sizes",
        type=_sizes,
        default=ScaleOptions().sizes,
        help="the scale section's queue sizes, comma-separated (default 9,40,130,400)",
    )
    parser.add_argument("--scale-rounds", type=int, default=ScaleOptions().rounds, help="scale rounds per side")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=[*SECTIONS, *ON_REQUEST],
        help="run only this section (repeatable); the other figures in --output are kept",
    )
    opts = parser.parse_args(list(args))
    console = Console(env=env)

    def action() -> dict[str, Any]:
        settings = load(root, env)
        output = opts.output or settings.root / ".bench" / "bench.json"
        run(
            settings,
            console,
            output=output,
            rounds=opts.rounds,
            noop_rounds=opts.noop_rounds,
            builds=not opts.no_builds,
            only=tuple(opts.only),
            scale=ScaleOptions(opts.scale_sizes, opts.scale_rounds),
        )
        return {"output": str(output)}

    return guarded(action, console=console, as_json=False).code
