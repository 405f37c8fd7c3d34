"""Bench section ``cuda-profile`` (on request): where a cached CUDA build's time goes.

A fresh build directory whose every object is a compiler-cache hit still took minutes for
CUDA (the ``cuda`` section).  This section measures why on a sample of the tree's ``.cu``
objects instead of the whole ~70-minute build: each sample's compile line comes from a CUDA
build directory configured here (CMake's ``compile_commands.json``, with the ``-MD`` depfile
flags the Ninja rule adds), and is run

* raw: the same nvcc line without a launcher (the yardstick), with nvcc's own table of
  phase times (``--time``); then its fatbinary step again with each compression mode
  (``GGML_CUDA_COMPRESSION_MODE``: fatbinary is the step a cache hit runs again);
* through sccache, the project's launcher, with a private server and cache directory: a miss,
  then two hits into fresh output paths, then one hit with sccache's debug log (the keys it
  computes and what it runs), then one with its preprocessor cache mode
  (``SCCACHE_DIRECT=true``);
* through ccache in depend mode (``CCACHE_DEPEND``: the key is the files nvcc's depfile
  names, no preprocessor run): a miss, then a hit; and whether ccache serves a stale object
  after an edit of host-only code, in its default mode and in depend mode (``ccache_soundness``).

``arch_scaling`` runs the small samples again (raw, sccache miss and hit) for one real
architecture, the wheel toolkit's default, and the backend's five-entry default.  The
``estimate`` multiplies each family's mean hit by the number of ``.cu`` objects of that family
in the configured tree and divides by the cores: the wall time of the CUDA objects of a fresh
build dir served by the cache (the ~300 C/C++ objects and the links are the CPU build's
figures).  Figures go to the bench JSON under ``cuda_profile``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks.bench_proofs import machine_settings, share_downloads
from benchmarks.common import Null
from skippy.compile.backends.cuda import DEFAULT_CUDA_ARCHITECTURES, WHEEL_DEFAULT_ARCHITECTURES
from skippy.compile.builder import execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import check_tree_needs, inspect_tree, probe_toolchain
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare

#: the sampled objects, under ggml/src/ggml-cuda/: small, medium and large kernels, and one
#: of each family of generated template instances (121 of the 186 objects)
SAMPLES: Final = (
    "arange.cu",
    "binbcast.cu",
    "mmvq.cu",
    "template-instances/mmq-instance-q4_0.cu",
    "template-instances/mmf-instance-ncols_8.cu",
    "template-instances/fattn-vec-instance-q4_0-q4_0.cu",
    "template-instances/fattn-tile-instance-dkq64-dv64.cu",
    "template-instances/fattn-mma-f16-instance-ncols1_8-ncols2_4.cu",
)
#: the samples compiled again for each architecture list (cheap ones: a miss per list)
SCALING_SAMPLES: Final = ("arange.cu", "binbcast.cu")
ARCH_LISTS: Final = ("86-real", WHEEL_DEFAULT_ARCHITECTURES, DEFAULT_CUDA_ARCHITECTURES)
#: fatbinary's compression modes (the tree's GGML_CUDA_COMPRESSION_MODE; its default is size)
COMPRESSION_MODES: Final = ("size", "balance", "speed", "none")
#: the section's target for a fresh build dir from the cache (issue: <= 180 s on 2 cores)
FRESH_DIR_TARGET_S: Final = 180.0
_CUDA_DIR: Final = "ggml/src/ggml-cuda/"


def family(source: str) -> str:
    """``.../template-instances/fattn-vec-instance-q4_0-q4_0.cu`` -> ``fattn-vec``; other ``.cu`` -> ``kernels``."""
    name = source.rsplit("/", 1)[-1]
    if "/template-instances/" in source and "-instance" in name:
        return name.split("-instance", 1)[0]
    return "kernels"


def generate_code_flags(architectures: str) -> list[str]:
    """CMake's nvcc flags for ``CMAKE_CUDA_ARCHITECTURES``: ``80`` -> PTX and SASS, ``86-real``
    -> SASS only, ``75-virtual`` -> PTX only."""
    flags: list[str] = []
    for entry in filter(None, architectures.split(";")):
        number, _, kind = entry.partition("-")
        codes = {"real": f"sm_{number}", "virtual": f"compute_{number}"}.get(kind, f"compute_{number},sm_{number}")
        flags.append(f"--generate-code=arch=compute_{number},code=[{codes}]")
    return flags


def compile_line(command: str, output: Path, *, architectures: str | None = None) -> list[str]:
    """A ``compile_commands.json`` nvcc command writing ``output`` (with the Ninja rule's
    ``-MD`` depfile beside it), for other architectures when given."""
    argv = shlex.split(command)
    argv[argv.index("-o") + 1] = str(output)
    if architectures is not None:
        at = next(i for i, a in enumerate(argv) if a.startswith("--generate-code="))
        argv = [a for a in argv if not a.startswith("--generate-code=")]
        argv[at:at] = generate_code_flags(architectures)
    c = argv.index("-c")
    argv[c:c] = ["-MD", "-MT", str(output), "-MF", f"{output}.d"]
    return argv


def phase_seconds(table: str) -> dict[str, float]:
    """nvcc ``--time`` CSV -> seconds per phase (``gcc (preprocessing 1)`` summed over architectures)."""
    out: dict[str, float] = {}
    rows = csv.reader(table.splitlines()[1:])
    for row in rows:
        if len(row) < 8 or row[7].strip() != "ms":
            continue
        phase = row[1].strip()
        out[phase] = out.get(phase, 0.0) + float(row[6]) / 1000
    return {k: round(v, 3) for k, v in out.items()}


_KEY = re.compile(r"\[([^\]]+)\]: generate_hash_key took ([\d.]+) s")
_RESULT = re.compile(r"\[([^\]]+)\]: compile result: (.+)$", re.MULTILINE)
_DECOMPOSED = re.compile(r"\[([^\]]+)\]: Compiled in ([\d.]+) s, but not cacheable")


def parse_debug_log(text: str, output_name: str) -> dict[str, Any]:
    """One nvcc compile's lines of sccache's debug log -> its keys and results.

    The outer nvcc call (tagged with the object's name) gets a key it never looks up (sccache
    always decomposes nvcc) and then runs the steps: cudafe++, cicc and ptxas are looked up by
    the hash of their inputs; the host compile of the object again by preprocessing."""
    keys: list[tuple[str, float]] = [(m[1], float(m[2])) for m in _KEY.finditer(text)]
    results = [m[2].strip() for m in _RESULT.finditer(text)]
    decomposed = [float(m[2]) for m in _DECOMPOSED.finditer(text) if m[1] == output_name]
    own = [s for tag, s in keys if tag == output_name]
    return {
        "outer_nvcc_key_s": own[0] if own else None,
        "host_compile_key_s": own[1] if len(own) > 1 else None,
        "step_keys_s": round(sum(s for tag, s in keys if tag != output_name), 3),
        "lookups": len(keys),
        "results": {r: results.count(r) for r in sorted(set(results))},
        "decomposed_steps_s": decomposed[0] if decomposed else None,
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(list(argv), env=dict(env), cwd=cwd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv[:3])} ... failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


@dataclass
class _Sccache:
    """A private sccache server (own port, own cache directory): the project's cache is not touched."""

    binary: str
    directory: Path
    base_env: Mapping[str, str]
    port: int
    log: Path | None = None
    extra: tuple[tuple[str, str], ...] = ()
    #: a tiny .cu file and the nvcc to compile it with after each start
    warmup: tuple[Path, str] | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in self.base_env.items() if not k.startswith("SCCACHE_")}
        env.update(
            SCCACHE_DIR=str(self.directory),
            SCCACHE_SERVER_PORT=str(self.port),
            SCCACHE_IDLE_TIMEOUT="0",
            SCCACHE_DIRECT="false",
        )
        if self.log is not None:
            env.update(SCCACHE_LOG="debug", SCCACHE_ERROR_LOG=str(self.log))
        env.update(dict(self.extra))
        return env

    def start(self) -> None:
        """Start, then compile a tiny kernel once: the first request pays sccache's compiler detection."""
        subprocess.run([self.binary, "--start-server"], env=self.env, capture_output=True, check=True)
        if self.warmup is not None:
            source, nvcc = self.warmup
            argv = [self.binary, nvcc, "-c", str(source), "-o", str(source.with_suffix(".o"))]
            subprocess.run(argv, env=self.env, cwd=source.parent, capture_output=True, check=True)

    def stop(self) -> None:
        subprocess.run([self.binary, "--stop-server"], env=self.env, capture_output=True, check=False)

    @contextlib.contextmanager
    def serving(self, *, log: Path | None = None, extra: tuple[tuple[str, str], ...] = ()) -> Iterator[None]:
        self.log, self.extra = log, extra
        self.start()
        try:
            yield
        finally:
            self.stop()
            self.log, self.extra = None, ()


@dataclass(frozen=True)
class _Sample:
    source: str
    command: str
    directory: Path


def _samples(compile_commands: Path) -> tuple[list[_Sample], dict[str, int]]:
    """The sampled ``.cu`` compile lines, and how many ``.cu`` objects each family has."""
    entries = json.loads(compile_commands.read_text(encoding="utf-8"))
    cu = [e for e in entries if e["file"].endswith(".cu") and _CUDA_DIR in e["file"]]
    counts: dict[str, int] = {}
    for e in cu:
        counts[family(e["file"])] = counts.get(family(e["file"]), 0) + 1
    by_name = {e["file"].split(_CUDA_DIR, 1)[1]: e for e in cu}
    picked = [_Sample(s, by_name[s]["command"], Path(by_name[s]["directory"])) for s in SAMPLES if s in by_name]
    return picked, counts


def _configured(settings: Settings, root: Path) -> tuple[Path, str, str]:
    """A CUDA build dir configured (not built) from the wheel toolkit, as the ``cuda`` section
    builds it: its compile_commands.json, the sccache binary, and the nvcc version line."""
    prepare(settings, Target.pinned(), console=Console(env={}, stream=Null()))
    machine = machine_settings(settings, root, "a", SKIPPY_CUDA_TOOLKIT="wheels", SKIPPY_COMPILER_CACHE="sccache")
    share_downloads(settings, machine)
    request = build_request("cuda", machine)
    toolchain = probe_toolchain("cuda", machine, given=request.defines)
    tree = inspect_tree(machine.workdir)
    check_tree_needs(tree, toolchain)
    stamp = wd.read_stamp(machine.workdir / ".git")
    patched = stamp.patched_sha if stamp is not None else "bench"
    plan = plan_build(request, machine, tree=tree, toolchain=toolchain, patched_sha=patched)
    try:
        execute_plan(plan, Console(env={}, stream=Null()), build=False)
    finally:
        stop_cache_server(plan)
    assert plan.launcher is not None and plan.launcher.name == "sccache"
    nvcc = next(t for t in toolchain.tools if t.name == "nvcc")
    return plan.build_dir / "compile_commands.json", plan.launcher.path, nvcc.version


def _mean(values: Sequence[float]) -> float:
    return round(statistics.fmean(values), 3)


@dataclass
class _Runs:
    """The sampled compiles of one run: where outputs go, the private sccache server, ccache's env."""

    work: Path
    env: dict[str, str]
    sccache: str
    server: _Sccache
    ccache: str | None

    def out(self, kind: str, sample: _Sample) -> Path:
        folder = self.work / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / (sample.source.rsplit("/", 1)[-1] + ".o")

    def cached(self, sample: _Sample, kind: str) -> float:
        """Seconds of ``sccache nvcc ...`` writing a fresh output path."""
        line = compile_line(sample.command, self.out(kind, sample))
        return round(_run([self.sccache, *line], self.server.env, sample.directory), 3)

    def raw(self, sample: _Sample) -> dict[str, Any]:
        target = self.out("raw", sample)
        table = target.with_name(target.name + ".time.csv")
        keep = target.with_name(target.name + ".keep")
        keep.mkdir()
        line = compile_line(sample.command, target)
        extra = ["--time", str(table), "--keep", "--keep-dir", str(keep)]
        took = _run([line[0], *extra, *line[1:]], self.env, sample.directory)
        return {
            "family": family("/" + sample.source),
            "raw_s": round(took, 3),
            "raw_phases_s": phase_seconds(table.read_text(encoding="utf-8")),
            "object_bytes": target.stat().st_size,
            "fatbinary_by_mode": self.fatbinary_modes(line, keep, sample.directory),
        }

    def fatbinary_modes(self, line: list[str], keep: Path, cwd: Path) -> dict[str, dict[str, float]]:
        """The compile's fatbinary step again (from ``nvcc --dryrun``, on the kept PTX and
        cubins) with each compression mode: seconds and bytes of the fatbin."""
        dry = subprocess.run(
            [line[0], "--dryrun", "--keep", "--keep-dir", str(keep), *line[1:]],
            env=self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
        step = next(shlex.split(x[3:]) for x in dry.stderr.splitlines() if x.startswith("#$ fatbinary"))
        step = [a for a in step if not a.startswith(("--create=", "--embedded-fatbin=", "--compress-mode="))]
        out: dict[str, dict[str, float]] = {}
        for mode in COMPRESSION_MODES:
            fatbin = keep / f"mode-{mode}.fatbin"
            took = _run([*step, f"--create={fatbin}", f"--compress-mode={mode}"], self.env, keep)
            out[mode] = {"s": round(took, 3), "bytes": fatbin.stat().st_size}
        return out

    def debug_hit(self, sample: _Sample, log: Path) -> dict[str, Any]:
        seen = log.stat().st_size if log.exists() else 0
        target = self.out("debug", sample)
        took = _run([self.sccache, *compile_line(sample.command, target)], self.server.env, sample.directory)
        text = log.read_text(encoding="utf-8", errors="replace")[seen:]
        return {"wall_s": round(took, 3), **parse_debug_log(text, target.name)}

    def ccache_depend(self, sample: _Sample, kind: str) -> float:
        assert self.ccache is not None
        env = {**self.env, "CCACHE_DIR": str(self.work / "ccache"), "CCACHE_DEPEND": "1", "CCACHE_MAXSIZE": "20G"}
        line = compile_line(sample.command, self.out(kind, sample))
        return round(_run([self.ccache, *line], env, sample.directory), 3)


#: a kernel file whose host-only part is edited between two compiles
_PROBE: Final = """\
#ifndef __CUDA_ARCH__
int host_only() { return VALUE; }
#endif
__global__ void kernel(int *p) { *p = 2; }
"""


def _ccache_soundness(runs: _Runs, nvcc: str) -> dict[str, bool]:
    """Does ccache serve the old object after an edit of host-only code (``#ifndef __CUDA_ARCH__``)?
    In its default modes the key is ``nvcc -E``, which preprocesses device code only; in depend
    mode it is the files of nvcc's depfile (their whole text).  True = a stale object."""
    assert runs.ccache is not None
    out: dict[str, bool] = {}
    for mode, extra in (("default", {}), ("depend", {"CCACHE_DEPEND": "1"})):
        folder = runs.work / f"probe-{mode}"
        folder.mkdir()
        env = {**runs.env, "CCACHE_DIR": str(folder / "cache"), **extra}
        objects = []
        for value in ("1", "7"):
            (folder / "probe.cu").write_text(_PROBE.replace("VALUE", value), encoding="utf-8")
            target = folder / f"probe{value}.o"
            argv = [runs.ccache, nvcc, "--generate-code=arch=compute_80,code=[sm_80]", "-MD", "-MF"]
            _run([*argv, f"{target}.d", "-c", "probe.cu", "-o", str(target)], env, folder)
            objects.append(target.read_bytes())
        out[f"{mode}_mode_stale_after_host_only_edit"] = objects[0] == objects[1]
    return out


def _measure(runs: _Runs, samples: Sequence[_Sample]) -> dict[str, dict[str, Any]]:
    rows = {s.source: runs.raw(s) for s in samples}
    with runs.server.serving():
        for s in samples:
            rows[s.source]["sccache_miss_s"] = runs.cached(s, "miss")
            hits = [runs.cached(s, "hit1"), runs.cached(s, "hit2")]
            rows[s.source].update(sccache_hits_s=hits, sccache_hit_s=_mean(hits))
    log = runs.work / "sccache-debug.log"
    with runs.server.serving(log=log):
        for s in samples:
            rows[s.source]["sccache_debug_hit"] = runs.debug_hit(s, log)
    with runs.server.serving(extra=(("SCCACHE_DIRECT", "true"),)):
        for s in samples:
            rows[s.source]["sccache_direct_hit_s"] = runs.cached(s, "direct")
    if runs.ccache is not None:
        for s in samples:
            rows[s.source]["ccache_depend_miss_s"] = runs.ccache_depend(s, "ccache-miss")
            rows[s.source]["ccache_depend_hit_s"] = runs.ccache_depend(s, "ccache-hit")
    return rows


def bench_cuda_profile(settings: Settings, console: Console) -> dict[str, Any]:
    """The sampled measurement (see the module's docstring); JSON-ready."""
    root = settings.cache_dir.parent / "bench" / "cuda-profile"
    shutil.rmtree(root, ignore_errors=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    compile_commands, sccache_bin, nvcc_version = _configured(settings, root)
    configure_s = time.perf_counter() - started
    samples, counts = _samples(compile_commands)
    work = Path(tempfile.mkdtemp(prefix="cuda-profile-", dir=root))
    env = dict(settings.env)
    runs = _Runs(
        work,
        env,
        sccache_bin,
        _Sccache(sccache_bin, work / "sccache", env, _free_port()),
        shutil.which("ccache", path=env.get("PATH")),
    )
    warmup = work / "warmup" / "warmup.cu"
    warmup.parent.mkdir()
    warmup.write_text("__global__ void warmup(int *p) { *p = 1; }\n", encoding="utf-8")
    runs.server.warmup = (warmup, shlex.split(samples[0].command)[0])
    console.info(f"cuda-profile: {len(samples)} samples of {sum(counts.values())} .cu objects")
    per_sample = _measure(runs, samples)
    scaling = _arch_scaling(samples, runs)
    soundness = _ccache_soundness(runs, shlex.split(samples[0].command)[0]) if runs.ccache else None
    e = estimate(per_sample, counts, cores=os.cpu_count() or 1)
    result: dict[str, Any] = {
        "nvcc": nvcc_version,
        "sccache": _version(sccache_bin, env),
        "ccache": _version(runs.ccache, env) if runs.ccache else None,
        "architectures": WHEEL_DEFAULT_ARCHITECTURES,
        "prepare_probe_configure_s": round(configure_s, 2),
        "cu_objects": sum(counts.values()),
        "cu_objects_by_family": counts,
        "samples": per_sample,
        "arch_scaling": scaling,
        "ccache_soundness": soundness,
        "estimate": e,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    console.info(
        f"cuda-profile: {result['cu_objects']} .cu objects; hit sum {e['sccache_hit_sum_s']:.0f} s "
        f"(raw sum {e['raw_sum_s']:.0f} s) -> {e['sccache_wall_s']:.0f} s on {e['cores']} cores with sccache; "
        f"ccache depend mode {e.get('ccache_depend_wall_s')} s"
    )
    shutil.rmtree(root, ignore_errors=True)
    return result


def _version(binary: str, env: Mapping[str, str]) -> str:
    done = subprocess.run([binary, "--version"], env=dict(env), capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0].strip() if done.stdout else "unknown"


def _arch_scaling(samples: Sequence[_Sample], runs: _Runs) -> dict[str, Any]:
    """Raw, miss and hit of the small samples for each architecture list (a fresh cache each)."""
    out: dict[str, Any] = {}
    small = [s for s in samples if s.source in SCALING_SAMPLES]
    for n, archs in enumerate(ARCH_LISTS):
        folder = runs.work / f"arch{n}"
        folder.mkdir(parents=True, exist_ok=True)
        runs.server.directory = runs.work / f"sccache-arch{n}"
        rows: dict[str, Any] = {}
        with runs.server.serving():
            for s in small:
                stem = s.source.replace("/", "_")
                line = {
                    tag: compile_line(s.command, folder / f"{stem}.{tag}.o", architectures=archs)
                    for tag in ("raw", "miss", "hit")
                }
                rows[s.source] = {
                    "raw_s": round(_run(line["raw"], runs.env, s.directory), 3),
                    "sccache_miss_s": round(_run([runs.sccache, *line["miss"]], runs.server.env, s.directory), 3),
                    "sccache_hit_s": round(_run([runs.sccache, *line["hit"]], runs.server.env, s.directory), 3),
                }
        out[archs] = {"entries": len(generate_code_flags(archs)), "samples": rows}
    return out


def _family_values(per_sample: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """family -> figure -> the samples' values (raw, hits, each fatbinary mode)."""
    by_family: dict[str, dict[str, list[float]]] = {}
    for row in per_sample.values():
        f = by_family.setdefault(row["family"], {})
        for key in ("raw_s", "sccache_hit_s", "ccache_depend_hit_s"):
            if key in row:
                f.setdefault(key, []).append(float(row[key]))
        for mode, fat in row.get("fatbinary_by_mode", {}).items():
            f.setdefault(f"fatbinary_{mode}_s", []).append(float(fat["s"]))
    return by_family


def estimate(per_sample: Mapping[str, Mapping[str, Any]], counts: Mapping[str, int], *, cores: int) -> dict[str, Any]:
    """Each family's mean (raw, hit) times its number of objects, summed; over ``cores``."""
    by_family = _family_values(per_sample)
    fallback = by_family.get("kernels", {})

    def total(key: str) -> float | None:
        sums = 0.0
        for name, n in counts.items():
            values = by_family.get(name, fallback).get(key)
            if not values:
                return None
            sums += n * statistics.fmean(values)
        return sums

    raw, hit, ccache = total("raw_s"), total("sccache_hit_s"), total("ccache_depend_hit_s")
    assert raw is not None and hit is not None
    result: dict[str, Any] = {
        "cores": cores,
        "raw_sum_s": round(raw, 1),
        "raw_wall_s": round(raw / cores, 1),
        "sccache_hit_sum_s": round(hit, 1),
        "sccache_wall_s": round(hit / cores, 1),
        "sccache_hit_over_raw": round(hit / raw, 3),
        "target_s": FRESH_DIR_TARGET_S,
    }
    if ccache is not None:
        result.update(ccache_depend_hit_sum_s=round(ccache, 1), ccache_depend_wall_s=round(ccache / cores, 1))
    fatbinary = {mode: total(f"fatbinary_{mode}_s") for mode in COMPRESSION_MODES}
    if all(v is not None for v in fatbinary.values()):
        result["fatbinary_sum_s"] = {mode: round(v or 0.0, 1) for mode, v in fatbinary.items()}
    return result
