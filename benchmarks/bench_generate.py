"""Bench section ``generate-all``: the built-in generator over every family of the pinned tree.

A copy of the project (its pyproject, tasks and queue, in a folder of its own: the
project's own patch dir is never written) whose upstream is the real llama.cpp
test-bed, pinned to the tree llama-cpp-python 0.3.35 vendors, gets the at-scale
spec: one family per graph-builder file of ``src/models/`` of the prepared tree
(:func:`all_families`).  Then, in one run:

* ``invoke generate`` with every family: the families the rewrite cannot place
  are refused, each named with its file and the reason, and the lane is left
  as it was;
* ``invoke generate`` without them, timed (twice: the second run must write
  the same bytes); the shard count, the families covered against the builder
  files, the archs of ``llama_model_mapping`` covered, the second pass (checked
  inside generate: a change fails the run) and ``invoke generate --check``;
* the whole queue applied: a cold ``invoke prepare --pinned`` against a raw
  ``git clone`` + ``git checkout`` + ``git am --3way`` of the same patch files
  (rounds alternating, the trees compared), and the hooks counted in the
  prepared tree's family files;
* with builds: the patched tree's target ``llama`` (libllama, every family file)
  configured and built by skippy's CPU plan with the project's compiler cache,
  against the same cmake + ninja command lines with no compiler cache.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import Null, Timing
from skippy.core import proc
from skippy.core.errors import GraphEditError
from skippy.core.git import hermetic_env
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppscan, genfacts, genfiles, genspec, graphcode, graphedit

#: the families the rewrite refuses on the pinned tree (eagle3: no layer loop; wavtokenizer-dec:
#: two layer loops and no anchor); the bench reports whether the refusal named exactly these
EXPECTED_REFUSED = frozenset({"eagle3", "wavtokenizer-dec"})
#: the test-bed version whose tree is the pin's
PINNED_VERSION = "0.3.35"
#: the build target holding every family file
LIBRARY_TARGET = "llama"
#: the keys of [tool.skippy] a project copy rewrites (the rest of pyproject.toml is kept)
_COPY_KEYS = ("upstream_url", "pin_file", "patch_dir", "workdir", "compat_link", "cache_dir")
#: a family of the generator's refusal: ``family NAME: src/models/FILE.cpp: reason``
_REFUSED_LINE = re.compile(r"^family (?P<name>[a-z0-9][a-z0-9_-]*): (?P<file>src/models/[^:]+\.cpp): (?P<why>.+)$")


# --------------------------------------------------------------------------- the at-scale spec


def family_name(gguf_name: str) -> str:
    """A GGUF arch name as a spec family name (``[a-z0-9][a-z0-9_-]*``, at most 63 characters):
    lower case, any other character run as ``-``, leading separators dropped."""
    name = re.sub(r"[^a-z0-9_-]+", "-", gguf_name.lower()).lstrip("-_")[:63].rstrip("-_")
    return name or "family"


@dataclass(frozen=True)
class AtScaleFamily:
    name: str
    arch: str
    #: the file of the family's graph builder (``src/models/<file>.cpp``)
    file: str


@dataclass(frozen=True)
class AtScale:
    """The families of a tree, one per graph-builder file of ``src/models/``."""

    families: tuple[AtScaleFamily, ...]
    #: every file of src/models/ holding a family graph builder
    builder_files: tuple[str, ...]
    #: arch -> the builder file it uses, another family's (``models.h``: an alias or a base class)
    sharing: Mapping[str, str]
    #: archs of llama_model_mapping whose class has no graph builder (clip: a quantize stub)
    no_builder: tuple[str, ...]
    #: builder files no arch of llama_model_mapping creates the class of (no family declared)
    no_arch: tuple[str, ...]
    #: the archs llama_model_mapping creates a class for, in its order
    mapped: tuple[str, ...]

    def spec(self, *, leave_out: Collection[str] = ()) -> str:
        """The spec (``generated/families.toml``) declaring every family but ``leave_out`` (names)."""
        unknown = sorted(set(leave_out) - {f.name for f in self.families})
        if unknown:
            raise ValueError(f"no family named {', '.join(unknown)}")
        lines = [
            "# every family with a graph builder in src/models/ (benchmarks.bench_generate.all_families)",
            f"schema = {genspec.SCHEMA}",
        ]
        for family in self.families:
            if family.name not in leave_out:
                lines += ["", f"# {family.file}", "[[family]]", f'name = "{family.name}"', f'arch = "{family.arch}"']
        return "\n".join(lines) + "\n"

    def covered_archs(self, *, leave_out: Collection[str] = ()) -> list[str]:
        """The mapped archs whose graph builder the declared families' patches edit."""
        files = {f.file for f in self.families if f.name not in leave_out}
        own = {f.arch for f in self.families if f.name not in leave_out}
        return [a for a in self.mapped if a in own or self.sharing.get(a) in files]


def all_families(tree: Path) -> AtScale:
    """One family per graph-builder file of ``tree``'s ``src/models/``: the arch whose model class
    is that builder's own class, the first in ``llama_model_mapping`` order; its name is the arch's
    GGUF name (``LLM_ARCH_NAMES``, :func:`family_name`).  Read with the generated lane's own
    readers (:func:`skippy.maintain.genfacts.builder_files`, :func:`graphcode.arch_classes`)."""
    names = cppscan.arch_names((tree / genfacts.ARCH_CPP).read_text(encoding="utf-8", errors="replace"))
    classes = graphcode.arch_classes((tree / genfacts.MODEL_CPP).read_bytes())
    builders = genfacts.builder_files(tree)
    own_files = {cls: file for cls, (file, builder) in builders.items() if cls == builder}
    chosen: dict[str, AtScaleFamily] = {}  # file -> family
    taken: set[str] = set()
    sharing: dict[str, str] = {}
    no_builder: list[str] = []
    for arch, cls in classes.items():
        if cls not in builders:
            no_builder.append(arch)
            continue
        file, builder = builders[cls]
        if builder != cls or file in chosen:
            sharing[arch] = file
            continue
        name = family_name(names.get(arch, arch.removeprefix("LLM_ARCH_")))
        while name in taken:  # GGUF names are unique; two that normalise alike get a suffix
            name = f"{name[:60]}-{len(taken)}"
        taken.add(name)
        chosen[file] = AtScaleFamily(name, arch, file)
    files = sorted(set(own_files.values()))
    return AtScale(
        families=tuple(chosen[f] for f in files if f in chosen),
        builder_files=tuple(files),
        sharing=sharing,
        no_builder=tuple(no_builder),
        no_arch=tuple(f for f in files if f not in chosen),
        mapped=tuple(classes),
    )


def all_families_spec(tree: Path, *, leave_out: Collection[str] = ()) -> str:
    """The at-scale spec of ``tree`` (:func:`all_families`), without the families ``leave_out``."""
    return all_families(tree).spec(leave_out=leave_out)


def refused_families(details: str) -> dict[str, tuple[str, str]]:
    """The families of the built-in generator's refusal: name -> (file, reason)."""
    found: dict[str, tuple[str, str]] = {}
    for line in details.splitlines():
        match = _REFUSED_LINE.match(line.strip())
        if match:
            found[match["name"]] = (match["file"], match["why"])
    return found


# --------------------------------------------------------------------------- a copy of the project


def project_copy(
    settings: Settings,
    dest: Path,
    *,
    upstream_url: str | None = None,
    pin: str | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """A copy of the project in ``dest`` (replaced): its pyproject.toml with the queue in ``queue/``
    (the pin in ``queue/upstream.txt``, the patches in ``queue/patches``), the workdir in
    ``work/llama.cpp``, no compat link; its tasks.py; a copy of the patch dir.  ``upstream_url``,
    ``pin`` and ``cache_dir`` replace the project's when given.  (A folder named ``skippy`` beside
    the copy's tasks would shadow the installed package: hence ``queue``.)"""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    text = (settings.root / "pyproject.toml").read_text(encoding="utf-8")
    values: dict[str, str | bool] = {
        "pin_file": "queue/upstream.txt",
        "patch_dir": "queue/patches",
        "workdir": "work/llama.cpp",
        "compat_link": False,
    }
    if upstream_url is not None:
        values["upstream_url"] = upstream_url
    if cache_dir is not None:
        values["cache_dir"] = str(cache_dir)
    (dest / "pyproject.toml").write_text(_rewrite_skippy_table(text, values), encoding="utf-8")
    shutil.copy2(settings.root / "tasks.py", dest / "tasks.py")
    shutil.copytree(settings.patch_dir, dest / "queue" / "patches", symlinks=True)
    pin_text = pin + "\n" if pin is not None else settings.pin_file.read_text(encoding="utf-8")
    (dest / "queue" / "upstream.txt").write_text(pin_text, encoding="utf-8")
    return dest


def _rewrite_skippy_table(text: str, values: Mapping[str, str | bool]) -> str:
    """``text`` (a pyproject.toml) with ``values`` for keys of its [tool.skippy] table: a key's line
    replaced where the table has it, added at the table's head otherwise."""
    head = re.search(r"^\[tool\.skippy\]\n", text, flags=re.MULTILINE)
    if head is None:
        raise ValueError("pyproject.toml has no [tool.skippy] table")
    end = re.search(r"^\[", text[head.end() :], flags=re.MULTILINE)
    stop = head.end() + (end.start() if end else len(text) - head.end())
    table = text[head.end() : stop]
    added: list[str] = []
    for key in _COPY_KEYS:
        if key not in values:
            continue
        line = f"{key} = {json.dumps(values[key])}"
        table, count = re.subn(rf"^{key} *=.*$", line, table, count=1, flags=re.MULTILINE)
        if not count:
            added.append(line)
    out = text[: head.end()] + "".join(a + "\n" for a in added) + table + text[stop:]
    got = tomllib.loads(out)["tool"]["skippy"]
    assert all(got[k] == v for k, v in values.items()), got
    return out


def copy_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a command run in a project copy: not CI (the interactive path), and no
    ``LLAMA_*`` override of its workdir, pin or queue."""
    return {k: v for k, v in env.items() if not k.startswith(("LLAMA_", "HF_")) and k != "CI"}


# --------------------------------------------------------------------------- the section


@dataclass(frozen=True)
class _Copy:
    """The bench's project copy and how commands run in it."""

    root: Path
    env: Mapping[str, str]
    invoke: str

    @property
    def workdir(self) -> Path:
        return self.root / "work" / "llama.cpp"

    @property
    def lane(self) -> Path:
        return self.root / "queue" / "patches" / "generated"

    def run(self, *args: str, ok: bool = True) -> tuple[proc.Result, float]:
        started = time.perf_counter()
        result = proc.run([self.invoke, *args], env=self.env, cwd=self.root, check=ok, timeout=3600)
        return result, time.perf_counter() - started

    def lane_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.lane.iterdir()) if p.is_file()}


def bench_generate_all(
    settings: Settings, console: Console, *, rounds: int = 3, build: bool = True, python: str = sys.executable
) -> dict[str, Any]:
    """The section's figures (see the module's docstring)."""
    from tooling.testbed import testbed_for

    bed = testbed_for(settings, console)
    version = PINNED_VERSION if PINNED_VERSION in bed.versions else bed.versions[-1]
    pin = bed.commits[version]
    base = settings.cache_dir.parent / "bench" / "generate-all"
    root = project_copy(settings, base / "project", upstream_url=bed.url, pin=pin)
    copy = _Copy(root, copy_env(settings.env), str(Path(python).parent / "invoke"))
    console.info("bench: the project copy prepared with the shipped queue (its tree gives the families)")
    copy.run("prepare", "--pinned")
    scale = all_families(copy.workdir)
    spec_path = copy.lane / genspec.SPEC_NAME
    spec_path.write_text(scale.spec(), encoding="utf-8")
    report: dict[str, Any] = {
        "upstream": {"testbed_version": version, "pin": pin},
        "builder_files": len(scale.builder_files),
        "families_declared": len(scale.families),
        "archs_mapped": len(scale.mapped),
        "archs_sharing_a_builder": len(scale.sharing),
        "archs_without_a_builder": list(scale.no_builder),
        "builder_files_without_an_arch": list(scale.no_arch),
    }
    console.info(f"bench: `invoke generate` with all {len(scale.families)} families (a refusal expected)")
    report["refusal"] = _refusal(copy)
    refused = set(report["refusal"]["families"])
    spec_path.write_text(scale.spec(leave_out=refused), encoding="utf-8")
    console.info(f"bench: `invoke generate` with {len(scale.families) - len(refused)} families, twice, then --check")
    report["generate"] = _generate(copy, scale, refused)
    console.info(f"bench: the whole queue applied: cold `invoke prepare --pinned` vs raw git am, {rounds} round(s)")
    report["apply"] = _apply(copy, bed.url, pin, rounds)
    report["build"] = (
        _build(settings, copy, base, console) if build else {"skipped": "--no-builds: the build figures were not run"}
    )
    console.info(summary(report))
    return report


def _refusal(copy: _Copy) -> dict[str, Any]:
    """``invoke generate`` with every family: it must fail naming each refused family's file and
    reason, and leave the lane as it was."""
    before = copy.lane_files()
    result, seconds = copy.run("generate", "--json", ok=False)
    data = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
    families = refused_families(str(data.get("details") or ""))
    return {
        "exit_code": result.returncode,
        "seconds": round(seconds, 2),
        "what": data.get("what"),
        "families": {name: {"file": file, "reason": why} for name, (file, why) in sorted(families.items())},
        "expected": sorted(EXPECTED_REFUSED),
        "met": set(families) == EXPECTED_REFUSED,
        "lane_untouched": copy.lane_files() == before,
    }


def _generate(copy: _Copy, scale: AtScale, refused: Collection[str]) -> dict[str, Any]:
    """``invoke generate`` twice (the second must write the same bytes), then ``--check``."""
    first, first_s = copy.run("generate", "--json")
    made = copy.lane_files()
    _second, second_s = copy.run("generate", "--json")
    same = copy.lane_files() == made
    check, check_s = copy.run("generate", "--check", "--json", ok=False)
    drift = json.loads(check.stdout).get("drift", {}) if check.returncode == 0 else {}
    series = [n for n in made.get(genfiles.SERIES_NAME, b"").decode().splitlines() if n]
    patches = json.loads(first.stdout).get("patches", [])
    declared = len(scale.families) - len(refused)
    shard_bytes = sum(len(made[n]) for n in series)
    return {
        "seconds": round(first_s, 2),
        "rerun_seconds": round(second_s, 2),
        "check_seconds": round(check_s, 2),
        "shards": len(series),
        "patches_reported": len(patches),
        "shard_bytes": shard_bytes,
        "families_covered": declared,
        "families_with_builders": len(scale.builder_files),
        "archs_covered": len(scale.covered_archs(leave_out=refused)),
        "archs_mapped": len(scale.mapped),
        # generate makes a second pass over its own result and fails on any change: a run that
        # succeeded had a second pass that changed nothing
        "second_pass": "no change",
        "rerun_same_bytes": same,
        "check_clean": check.returncode == 0 and bool(drift.get("ok")),
        "check_exit_code": check.returncode,
    }


def _apply(copy: _Copy, url: str, pin: str, rounds: int) -> dict[str, Any]:
    """Cold ``invoke prepare --pinned`` vs raw clone + checkout + ``git am --3way`` of the same files."""
    from benchmarks.bench import alternating
    from skippy.queue.model import load_queue

    queue = load_queue(copy.root / "queue" / "patches")
    patches = [str(p.path) for p in queue.patches]
    raw_dir = copy.root.parent / "raw" / "llama.cpp"
    raw_env = hermetic_env(copy.env, raw_dir.parent)
    am_seconds: list[float] = []

    def skippy_cold() -> None:
        shutil.rmtree(copy.root / "work", ignore_errors=True)
        copy.run("prepare", "--pinned")

    def raw_cold() -> None:
        shutil.rmtree(raw_dir.parent, ignore_errors=True)
        raw_dir.parent.mkdir(parents=True)
        proc.run(["git", "clone", "--quiet", url, str(raw_dir)], env=raw_env)
        proc.run(["git", "-C", str(raw_dir), "checkout", "--quiet", "--detach", pin], env=raw_env)
        started = time.perf_counter()
        proc.run(["git", "-C", str(raw_dir), "am", "--3way", "--quiet", *patches], env=raw_env, timeout=3600)
        am_seconds.append(time.perf_counter() - started)

    ours, raw = alternating(rounds, skippy_cold, raw_cold)
    tree = ["rev-parse", "HEAD^{tree}"]
    same = proc.run(["git", "-C", str(copy.workdir), *tree], env=raw_env).stdout == (
        proc.run(["git", "-C", str(raw_dir), *tree], env=raw_env).stdout
    )
    shutil.rmtree(raw_dir.parent, ignore_errors=True)
    skippy_t, raw_t = Timing(tuple(ours)), Timing(tuple(raw))
    return {
        "patches": len(patches),
        "skippy_cold_prepare": skippy_t.as_dict(),
        "raw_clone_checkout_am": raw_t.as_dict(),
        "raw_am_only": Timing(tuple(am_seconds)).as_dict(),
        "ratio": round(skippy_t.median / raw_t.median, 3),
        "same_tree_as_raw": same,
        **hooks_in_tree(copy.workdir, copy.lane),
    }


def hooks_in_tree(workdir: Path, lane: Path) -> dict[str, Any]:
    """Each shard's file in the prepared tree against its patch: the hook calls the patch adds and
    the ones the file holds (they must agree, at least one each); and the rewrite run once more over
    the applied file (a second pass outside generate: it must change nothing)."""
    call = (graphedit.HOOK + "(").encode()
    added_total = found_total = 0
    off: list[str] = []
    changed: list[str] = []
    for name in (lane / genfiles.SERIES_NAME).read_text(encoding="utf-8").split():
        files = [f for f in _patched_files(lane / name) if (workdir / f).is_file()]
        added = sum(1 for line in (lane / name).read_bytes().splitlines() if line.startswith(b"+") and call in line)
        found = sum((workdir / f).read_bytes().count(call) for f in files)
        added_total, found_total = added_total + added, found_total + found
        if added < 1 or found != added:
            off.append(f"{name}: adds {added}, the tree holds {found}")
        for file in files:
            try:
                again = graphedit.place_layer_hooks((workdir / file).read_bytes(), path=file)
            except GraphEditError as exc:
                changed.append(f"{file}: {exc.reason}")
                continue
            if again.changed:
                changed.append(file)
    return {
        "hooks_added": added_total,
        "hooks_in_tree": found_total,
        "shards_off": off,
        "second_pass_on_applied_tree_changed": changed,
    }


def _patched_files(patch: Path) -> list[str]:
    text = patch.read_text(encoding="utf-8", errors="replace")
    return re.findall(r"^diff --git a/(\S+) b/", text, flags=re.MULTILINE)


def _build(settings: Settings, copy: _Copy, base: Path, console: Console) -> dict[str, Any]:
    """Target ``llama`` of the patched tree in fresh build dirs: skippy's CPU plan with the project's
    compiler cache, then the same cmake + ninja command lines with no compiler cache."""
    from skippy.compile.builder import COMPILE_LINE, execute_plan
    from skippy.compile.cachestats import CacheProbe
    from skippy.compile.plan import plan_build
    from skippy.compile.request import build_request
    from skippy.compile.toolchain import inspect_tree, probe_toolchain
    from skippy.queue import workdir as wd

    stamp = wd.read_stamp(copy.workdir / ".git")
    assert stamp is not None, "the apply step leaves the copy prepared"
    quiet = Console(env={}, stream=Null())
    figures: dict[str, Any] = {"target": LIBRARY_TARGET}
    for side, cache in (("skippy", None), ("raw", "none")):
        build_root = base / f"build-{side}"
        shutil.rmtree(build_root, ignore_errors=True)
        env = dict(copy.env) | ({"SKIPPY_COMPILER_CACHE": cache} if cache else {})
        table = {"build_root": str(build_root), "cache_dir": str(settings.cache_dir)}
        build_settings = Settings.from_table(copy.root, table, env)
        plan = plan_build(
            build_request("cpu", build_settings),
            build_settings,
            tree=inspect_tree(copy.workdir),
            toolchain=probe_toolchain("cpu", build_settings),
            patched_sha=stamp.patched_sha,
            upstream_sha=stamp.upstream_sha,
            queue_digest=stamp.queue_digest,
        )
        ninja = [a for a in plan.build_argv if a not in plan.targets] + [LIBRARY_TARGET]
        compiled = [0]

        def count(line: str, box: list[int] = compiled) -> None:
            box[0] += bool(COMPILE_LINE.match(line))

        with console.step(f"bench: target {LIBRARY_TARGET} of the patched tree, {side}"):
            started = time.perf_counter()
            if side == "skippy":
                execute_plan(plan, quiet, build=False)  # configure as `nox -s build-cpu` does
                probe = CacheProbe(plan, quiet)
                proc.run(ninja, env=probe.before(), on_line=count, timeout=3 * 3600)
                stats = probe.after()
            else:
                proc.run(plan.configure_argv, env=plan.env, timeout=3600)
                proc.run(ninja, env=plan.env, on_line=count, timeout=3 * 3600)
                stats = None
            seconds = time.perf_counter() - started
        figures[side] = {
            "seconds": round(seconds, 1),
            "compiled": compiled[0],
            "launcher": plan.launcher.name if plan.launcher else None,
            **({"cache_hits": stats.hits, "cache_misses": stats.misses} if stats else {}),
        }
        shutil.rmtree(build_root, ignore_errors=True)
    figures["ratio"] = round(figures["skippy"]["seconds"] / figures["raw"]["seconds"], 3)
    return figures


def summary(report: Mapping[str, Any]) -> str:
    g, a, r, b = report["generate"], report["apply"], report["refusal"], report["build"]
    refused = ", ".join(f"{n} ({f['file']}: {f['reason']})" for n, f in r["families"].items()) or "none"
    build = (
        b["skipped"]
        if "skipped" in b
        else f"target {b['target']}: skippy {b['skippy']['seconds']:.1f} s vs raw {b['raw']['seconds']:.1f} s"
    )
    return (
        f"generate-all: {g['shards']} shards for {g['families_covered']} of {g['families_with_builders']} builder "
        f"files ({g['archs_covered']} of {g['archs_mapped']} archs) in {g['seconds']:.1f} s; second pass "
        f"{g['second_pass']}; rerun same bytes: {g['rerun_same_bytes']}; --check clean: {g['check_clean']}; "
        f"refused: {refused}; apply {a['patches']} patches: skippy {a['skippy_cold_prepare']['median_s']:.1f} s vs "
        f"raw {a['raw_clone_checkout_am']['median_s']:.1f} s (git am alone {a['raw_am_only']['median_s']:.1f} s); "
        f"{build}"
    )
