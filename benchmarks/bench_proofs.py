"""Bench figures for the proofs that are too long for the test suite.

* ``spot-check``: the whole spot check (chat + fingerprint + RPC) after an up-to-date CPU
  build, beside a raw llama-server start and one chat request in the same run
  (target <= 15 s on 2 cores).
* ``remote-cache``: a CPU build of llama-server with an empty local compiler cache and a
  real Redis as the shared remote (cold: it fills the remote), then the same tree in a
  fresh build directory with the local cache wiped (a new machine); target <= 10 % of cold.
* ``cuda``: the whole ``nox -s build-cuda -- --no-spot-check`` with the toolkit from the
  package index's wheels (time, compile steps, the artifact gate), then a second build
  into a fresh build directory served by the compiler cache.  Long (about 25 minutes of
  compiling on 2 cores): only with ``--only cuda``.
* ``rocm``: the whole ``nox -s build-rocm -- --no-spot-check -DAMDGPU_TARGETS=gfx1100`` with
  ROCm from the Debian root (configured and built inside it with chroot): the root's making
  when it is not cached, configure and build times, compile steps, the artifact gate, and
  an up-to-date re-run, then (like ``cuda``) a second build into a fresh build directory
  served by the compiler cache, which runs inside the root (a server of its own, the
  local directory; skipped when no launcher was found).  Long (about 23 minutes measured on 2 busy cores): only
  with ``--only rocm``.

Each returns a JSON-ready dict; :mod:`benchmarks.bench` writes them with the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from benchmarks.common import Null
from skippy.compile.backends import spec
from skippy.compile.backends.base import SERVER_TARGET
from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.cachestats import stop_cache_server as _stop_sccache
from skippy.compile.plan import plan_build
from skippy.compile.request import build_request
from skippy.compile.rootfs import mounted, remove_tree
from skippy.compile.toolchain import check_tree_needs, inspect_tree, probe_toolchain
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionRequest, run_build_session
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare
from skippy.spot.evidence import artifact_markers_missing
from skippy.spot.models import DEFAULT_MODEL, parse_model_ref, resolve_model
from skippy.spot.spotcheck import spot_check

SPOT_CHECK_TARGET_S: Final = 15.0
#: the project's own CPU build, up to date (``nox -s build-cpu -- --no-spot-check``)
REMOTE_CACHE_TARGET_RATIO: Final = 0.10


def _quiet() -> Console:
    return Console(env={}, stream=Null())


def _prepared(settings: Settings) -> None:
    """The project's workdir prepared at the pin (what a build session does before building)."""
    prepare(settings, Target.pinned(), console=_quiet())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the spot check --------------------------------------------------------------------


def _raw_chat(server: Path, model: Path, env: Mapping[str, str]) -> float:
    """Seconds from starting llama-server to the end of one chat answer, by hand."""
    port = _free_port()
    started = time.perf_counter()
    child = subprocess.Popen(
        [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "1024"],
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{base}/health", timeout=5) as response,  # noqa: S310 - 127.0.0.1
            ):
                if response.status == 200:
                    break
            if child.poll() is not None or time.perf_counter() - started > 300:
                raise RuntimeError("llama-server did not get ready")
            time.sleep(0.05)
        body = {"messages": [{"role": "user", "content": "Say OK"}], "max_tokens": 5, "temperature": 0}
        request = urllib.request.Request(  # noqa: S310 - 127.0.0.1
            f"{base}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - 127.0.0.1
            response.read()
        return time.perf_counter() - started
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def bench_spot_check(settings: Settings, console: Console, *, rounds: int = 3) -> dict[str, Any]:
    """The whole spot check on the project's up-to-date CPU build, ``rounds`` times."""
    outcome = run_build_session(SessionRequest(build_request("cpu", settings), spot_check=False), settings, _quiet())
    assert outcome.build is not None
    server = outcome.build.binaries[SERVER_TARGET]
    rpc = next(p for n, p in outcome.build.binaries.items() if n != SERVER_TARGET)
    model = resolve_model(parse_model_ref(DEFAULT_MODEL), settings, _quiet()).path
    walls: list[float] = []
    parts: dict[str, float | None] = {}
    for _ in range(rounds):
        started = time.perf_counter()
        report = spot_check(settings, server, console=_quiet(), rpc_server=rpc)
        walls.append(time.perf_counter() - started)
        (result,) = report.results
        parts = {
            "load_s": result.load_seconds,
            "first_token_s": result.first_token_seconds,
            "completion_s": result.completion_seconds,
        }
    raw = [_raw_chat(server, model, settings.env) for _ in range(rounds)]
    median = statistics.median(walls)
    console.info(
        f"spot check (chat + fingerprint + RPC): median {median:.1f} s over {rounds} "
        f"(target <= {SPOT_CHECK_TARGET_S:.0f} s); raw server start + one chat {statistics.median(raw):.1f} s"
    )
    return {
        "rounds_s": [round(w, 2) for w in walls],
        "median_s": round(median, 2),
        "last_round": parts,
        "raw_start_and_one_chat_median_s": round(statistics.median(raw), 2),
        "target_s": SPOT_CHECK_TARGET_S,
        "met": median <= SPOT_CHECK_TARGET_S,
    }


# --- the shared (remote) compiler cache --------------------------------------------------


@contextlib.contextmanager
def _redis(directory: Path, env: Mapping[str, str]) -> Iterator[str]:
    """Debian's redis-server on 127.0.0.1 at a free port, no persistence; its URL."""
    directory.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    child = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--save", ""],
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(10)


def _build(backend: str, settings: Settings, *, stop: bool = True) -> tuple[BuildReport, float]:
    """Probe, plan and execute a build of the project's prepared workdir (no prepare, no spot check)."""
    request = build_request(backend, settings)
    toolchain = probe_toolchain(backend, settings, given=request.defines)
    tree = inspect_tree(settings.workdir)
    check_tree_needs(tree, toolchain)
    stamp = wd.read_stamp(settings.workdir / ".git")
    patched = stamp.patched_sha if stamp is not None else "bench"
    plan = plan_build(request, settings, tree=tree, toolchain=toolchain, patched_sha=patched)
    started = time.perf_counter()
    try:
        # a build inside a root file system (ROCm's Debian root) has the work folders mounted there
        with mounted(plan.rootfs, plan.rootfs_binds, env=settings.env):
            report = execute_plan(plan, _quiet())
    finally:
        if stop:
            _stop_sccache(plan)
    return report, time.perf_counter() - started


def machine_settings(settings: Settings, root: Path, name: str, **env: str) -> Settings:
    table = {
        **settings.raw,
        "build_root": str(root / name / "build"),
        "cache_dir": str(root / name / "cache"),
        "workdir": str(settings.workdir),
    }
    base = {k: v for k, v in settings.env.items() if k != "CI"}
    return Settings.from_table(settings.root, table, {**base, **env})


def share_downloads(settings: Settings, into: Settings) -> None:
    """The bench machines share the project's download cache (wheels, toolkits), not its objects."""
    into.cache_dir.mkdir(parents=True, exist_ok=True)
    for name in ("cuda", "vulkan-headers", "rocm-root", "archives"):
        source = settings.cache_dir / name
        if source.exists() and not (into.cache_dir / name).exists():
            (into.cache_dir / name).symlink_to(source.resolve())


def bench_remote_cache(settings: Settings, console: Console) -> dict[str, Any]:
    """Cold CPU build filling a real Redis, then a "new machine" (fresh dir, wiped local cache)."""
    _prepared(settings)
    root = settings.cache_dir.parent / "bench" / "remote-cache"
    shutil.rmtree(root, ignore_errors=True)
    with _redis(root / "redis", settings.env) as url:
        first = machine_settings(settings, root, "machine-a", SKIPPY_COMPILER_CACHE="sccache", SKIPPY_CACHE_STORAGE=url)
        cold, cold_s = _build("cpu", first)
        second = machine_settings(
            settings, root, "machine-b", SKIPPY_COMPILER_CACHE="sccache", SKIPPY_CACHE_STORAGE=url
        )
        warm, warm_s = _build("cpu", second)
    shutil.rmtree(root, ignore_errors=True)
    ratio = warm_s / cold_s
    hits = warm.cache.hits if warm.cache else 0
    misses = warm.cache.misses if warm.cache else 0
    console.info(
        f"remote cache (Redis): cold {cold_s:.0f} s ({cold.compiled} compiles), new machine {warm_s:.0f} s "
        f"({hits} hits / {misses} misses) = {ratio:.2f} of cold (target <= {REMOTE_CACHE_TARGET_RATIO})"
    )
    return {
        "cold_s": round(cold_s, 2),
        "cold_compile_steps": cold.compiled,
        "cold_storage": cold.cache.storage if cold.cache else None,
        "new_machine_s": round(warm_s, 2),
        "new_machine_hits": hits,
        "new_machine_misses": misses,
        "new_machine_storage": warm.cache.storage if warm.cache else None,
        "ratio": round(ratio, 3),
        "target_ratio": REMOTE_CACHE_TARGET_RATIO,
        "met": ratio <= REMOTE_CACHE_TARGET_RATIO,
    }


# --- the whole CUDA build from the wheel toolkit ----------------------------------------


def bench_cuda(settings: Settings, console: Console) -> dict[str, Any]:
    """``build-cuda --no-spot-check`` with the wheel toolkit, cold, then a fresh dir from the cache."""
    _prepared(settings)
    root = settings.cache_dir.parent / "bench" / "cuda"
    shutil.rmtree(root, ignore_errors=True)
    first = machine_settings(settings, root, "a", SKIPPY_CUDA_TOOLKIT="wheels", SKIPPY_COMPILER_CACHE="sccache")
    share_downloads(settings, first)
    cold, cold_s = _build("cuda", first)
    missing = artifact_markers_missing(cold.binaries[SERVER_TARGET], spec("cuda").artifact_markers)
    sizes = {name: path.stat().st_size for name, path in cold.binaries.items()}
    # a second machine directory sharing the first one's compiler cache: a fresh build dir
    second = machine_settings(settings, root, "b", SKIPPY_CUDA_TOOLKIT="wheels", SKIPPY_COMPILER_CACHE="sccache")
    second.cache_dir.mkdir(parents=True, exist_ok=True)
    for entry in first.cache_dir.iterdir():
        if not (second.cache_dir / entry.name).exists() and not entry.name.endswith((".lock", ".sock")):
            (second.cache_dir / entry.name).symlink_to(entry.resolve())
    warm, warm_s = _build("cuda", second)
    languages = dict(warm.cache.languages) if warm.cache else {}
    console.info(
        f"CUDA (wheel toolkit): cold {cold_s / 60:.1f} min ({cold.compiled} compiles), artifact gate "
        f"{'passed' if not missing else 'FAILED: ' + ', '.join(missing)}; fresh dir from the cache {warm_s:.0f} s"
    )
    shutil.rmtree(root / "a" / "build", ignore_errors=True)
    shutil.rmtree(root / "b" / "build", ignore_errors=True)
    return {
        "cold_s": round(cold_s, 2),
        "cold_compile_steps": cold.compiled,
        "binary_bytes": sizes,
        "artifact_gate_missing": missing,
        "fresh_dir_s": round(warm_s, 2),
        "fresh_dir_hits": warm.cache.hits if warm.cache else None,
        "fresh_dir_misses": warm.cache.misses if warm.cache else None,
        "fresh_dir_languages": {k: list(v) for k, v in languages.items()},
        "cpus": os.cpu_count(),
    }


# --- the whole ROCm build inside the Debian root ------------------------------------------

#: one AMD target, as the workflow job builds (and the Debian root's default)
ROCM_BENCH_DEFINES: Final = {"AMDGPU_TARGETS": "gfx1100"}


def bench_rocm(settings: Settings, console: Console) -> dict[str, Any]:
    """``build-rocm --no-spot-check`` with ROCm from the Debian root, as the nox session runs it
    (probe, prepare no-op, configure and build inside the root, the artifact gate: symbols and
    ``--version`` inside the root): cold, then up to date, then a fresh dir from the compiler
    cache (sccache inside the root) when a launcher was found."""
    _prepared(settings)
    started = time.perf_counter()
    # the root made (or found) in the project's own cache, then shared by both bench machines
    project = Settings.from_table(settings.root, settings.raw, {**settings.env, "SKIPPY_ROCM_TOOLKIT": "debian-root"})
    probe_toolchain("rocm", project, given=build_request("rocm", project, defines=ROCM_BENCH_DEFINES).defines)
    root_s = time.perf_counter() - started
    root = settings.cache_dir.parent / "bench" / "rocm"
    remove_tree(root)  # refused, not deleted through, when a killed run left mounts
    first = machine_settings(settings, root, "a", SKIPPY_ROCM_TOOLKIT="debian-root")
    share_downloads(settings, first)
    args = SessionRequest(build_request("rocm", first, defines=ROCM_BENCH_DEFINES), spot_check=False)
    started = time.perf_counter()
    toolchain = probe_toolchain("rocm", first, given=args.build.defines)
    probe_s = time.perf_counter() - started
    started = time.perf_counter()
    cold = run_build_session(args, first, _quiet()).build  # the artifact gates raise when they fail
    cold_s = time.perf_counter() - started
    started = time.perf_counter()
    again = run_build_session(args, first, _quiet()).build
    again_s = time.perf_counter() - started
    assert cold is not None and again is not None
    result: dict[str, Any] = {
        "toolkit": cold.toolkit,
        "root_made_or_found_s": round(root_s, 2),
        "probe_s": round(probe_s, 2),
        "probe_notes": list(toolchain.notes),
        "session_s": round(cold_s, 2),
        "configure_s": round(cold.configure_seconds, 2),
        "build_s": round(cold.build_seconds, 2),
        "compile_steps": cold.compiled,
        "steps": cold.steps,
        "binary_bytes": {name: path.stat().st_size for name, path in cold.binaries.items()},
        "artifact_gate": "passed (symbols, and --version inside the root)",
        "up_to_date_session_s": round(again_s, 2),
        "up_to_date_compile_steps": again.compiled,
        "compiler_cache": None if cold.cache is None else cold.cache.as_dict(),
        "cpus": os.cpu_count(),
    }
    if toolchain.launcher is not None:
        second = machine_settings(settings, root, "b", SKIPPY_ROCM_TOOLKIT="debian-root")
        share_downloads(settings, second)
        for entry in first.cache_dir.iterdir():
            if not (second.cache_dir / entry.name).exists() and not entry.name.endswith((".lock", ".sock")):
                (second.cache_dir / entry.name).symlink_to(entry.resolve())
        # the same session as the cold build (the same flags: its LLAMA_BUILD_* values reach most
        # compile lines, so a build planned another way would miss on them, not on the cache)
        started = time.perf_counter()
        warm = run_build_session(
            SessionRequest(build_request("rocm", second, defines=ROCM_BENCH_DEFINES), spot_check=False),
            second,
            _quiet(),
        ).build
        warm_s = time.perf_counter() - started
        assert warm is not None
        result.update(
            fresh_dir_s=round(warm_s, 2),
            fresh_dir_build_s=round(warm.build_seconds, 2),
            fresh_dir_hits=warm.cache.hits if warm.cache else None,
            fresh_dir_misses=warm.cache.misses if warm.cache else None,
            fresh_dir_cache=None if warm.cache is None else warm.cache.as_dict(),
            same_build_dir_name=warm.build_dir.name == cold.build_dir.name,
        )
    else:
        result["fresh_dir"] = "not built: no compiler cache was found (a fresh dir would recompile everything)"
    console.info(
        f"ROCm (Debian root, {cold.toolkit}): probe {probe_s:.0f} s, configure {cold.configure_seconds:.1f} s, "
        f"build {cold.build_seconds / 60:.1f} min ({cold.compiled} compiles), artifact gate passed; "
        f"up to date {again_s:.1f} s ({again.compiled} compiles)"
    )
    remove_tree(root / "a" / "build")
    remove_tree(root / "b" / "build")
    return result
