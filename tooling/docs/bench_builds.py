"""The figures table's rows of the builds and the proofs: prepare, the compile steps a change costs,
the builds and the compiler cache, the objects two backends share, a pin move, the spot check, the
remote cache, CUDA, upstream's tests, ROCm, and the build sent to a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tooling.bench_schema import (
    BenchReport,
    Builds,
    CpuDistSent,
    CudaProfile,
    Dist,
    DistLocal,
    DistSent,
    MinimalTouch,
    PinMove,
    Prepare,
    Rocm,
    UpstreamTests,
)
from tooling.docs.bench_cells import Row, seconds, verdict


def _prepare_rows(prepare: Prepare) -> list[Row]:
    cold, noop = prepare.cold_prepare, prepare.noop_prepare
    return [
        (
            "cold `invoke prepare --pinned` vs raw clone + checkout + `git am --3way`",
            f"{cold.ratio}x (median {seconds(cold.skippy.median_s)} vs {seconds(cold.raw_git.median_s)})",
            f"at most {cold.target_ratio}x",
            verdict(cold.met),
        ),
        (
            "no-op `invoke prepare --pinned`, median",
            f"{seconds(noop.median_s)}, {noop.files_with_changed_mtime} file(s) with a changed mtime",
            f"at most {seconds(noop.target_s)}, 0 files",
            verdict(noop.met),
        ),
    ]


def _touch_rows(touch: MinimalTouch) -> list[Row]:
    one = touch.one_patch_changed
    steps = f"{one.compile_steps_skippy_reprepare} / {one.compile_steps_by_hand} / {one.compile_steps_reset_reapply}"
    noop_steps = touch.nothing_changed.after_skippy_noop
    return [
        (
            "compile steps after one patch changes: skippy re-prepare / by hand / reset + re-apply",
            steps,
            "skippy = by hand",
            verdict(one.skippy_equals_minimum),
        ),
        ("compile steps after a re-prepare with nothing changed", str(noop_steps), "0", verdict(not noop_steps)),
    ]


def _build_rows(builds: Builds) -> list[Row]:
    cold, up, cache = builds.cold_build, builds.up_to_date_nox_build_cpu, builds.compiler_cache
    counts = "" if cache.warm_hits is None else f" ({cache.warm_hits} hits, {cache.warm_misses} misses)"
    return [
        (
            "cold CPU build, skippy vs the same cmake + ninja argv raw",
            f"{seconds(cold.skippy_s)} vs {seconds(cold.raw_s)} ({cold.overhead_pct:+} %; "
            f"{seconds(cold.overhead_outside_cmake_ninja_s)} outside cmake and ninja)",
            f"at most {cold.target_pct} %",
            verdict(cold.met),
        ),
        (
            "`nox -s build-cpu` when up to date (before the spot check), median",
            seconds(up.median_s),
            f"under {seconds(up.target_s)}",
            verdict(up.met),
        ),
        (
            "rebuild into a fresh dir, warm compiler cache vs cold",
            f"{seconds(cache.warm_fresh_dir_s)} vs {seconds(cache.cold_s)} = {cache.ratio}{counts}",
            f"at most {cache.target_ratio}",
            verdict(cache.met),
        ),
    ]


def build_rows(report: BenchReport) -> list[Row]:
    """Prepare, the minimal touch, the builds and the objects a CPU and a Vulkan build dir share."""
    rows: list[Row] = []
    if report.prepare:
        rows += _prepare_rows(report.prepare)
    if report.minimal_touch:
        rows += _touch_rows(report.minimal_touch)
    if report.builds:
        rows += _build_rows(report.builds)
    shared = report.shared_objects
    if shared:
        ours, raw = shared.patched, shared.unpatched
        rows.append(
            (
                "compile lines a CPU and a Vulkan build dir of one tree share: with the queue vs the unpatched pin "
                "(lines that differ only in `GGML_USE_*`)",
                f"{ours.shared} of {ours.cpu_lines} ({ours.only_backend_use}) vs {raw.shared} of "
                f"{raw.cpu_lines} ({raw.only_backend_use})",
                "only sources that read a backend differ",
                verdict(shared.met),
            )
        )
    return rows


#: the pin-move section's upstream moves, in the order the row gives them (others after, by name)
_MOVES: Final = {"readme_only": "README only", "one_source": "one source"}


def pin_move_rows(pin: PinMove | None) -> list[Row]:
    """The pin-move section: compile steps of each upstream move, skippy's beside the raw build's."""
    if not pin:
        return []
    lines = pin.commit_on_compile_lines
    order = list(_MOVES)
    moves = sorted(pin.moves.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
    measured = "; ".join(
        f"{_MOVES.get(name, name.replace('_', ' '))}: {m.skippy.compile_steps} in "
        f"{seconds(m.skippy.wall_s)} / {m.raw_fixed_commit.compile_steps} in "
        f"{seconds(m.raw_fixed_commit.rebuild_s)}"
        for name, m in moves
    )
    unpatched = lines.unpatched_upstream
    return [
        (
            "compile steps and seconds of a pin move (README only, one source changed): skippy's prepare + CPU "
            "build / the raw Ninja rebuild of the same tree configured with the commit string held fixed "
            "(`--only pin-move`)",
            f"{measured}; the commit is on {lines.skippy} of skippy's {lines.compile_lines} compile lines "
            f"(unpatched tree: {unpatched.carrying_commit} of {unpatched.compile_lines})",
            f"README only at most {pin.target_readme_only_steps}; at most raw + {pin.target_extra_steps}",
            verdict(pin.met),
        )
    ]


def _spot_and_cache_rows(report: BenchReport) -> list[Row]:
    rows: list[Row] = []
    spot = report.spot_check
    if spot:
        rows.append(
            (
                "whole spot check on the CPU build (chat + fingerprint + RPC), median (`--only spot-check`)",
                f"{seconds(spot.median_s)}; a raw llama-server start + one chat: "
                f"{seconds(spot.raw_start_and_one_chat_median_s)}",
                f"at most {seconds(spot.target_s)}",
                verdict(spot.met),
            )
        )
    remote = report.remote_cache
    if remote:
        rows.append(
            (
                "a new machine on a shared Redis cache vs the cold build that filled it (`--only remote-cache`)",
                f"{seconds(remote.new_machine_s)} ({remote.new_machine_hits} hits / {remote.new_machine_misses} "
                f"misses) vs {seconds(remote.cold_s)} = {remote.ratio}",
                f"at most {remote.target_ratio}",
                verdict(remote.met),
            )
        )
    cuda = report.cuda
    if cuda:
        gate = "passed" if not cuda.artifact_gate_missing else "FAILED"
        rows.append(
            (
                "whole `nox -s build-cuda -- --no-spot-check` from the wheel toolkit: cold / a fresh dir from "
                "the cache (`--only cuda`)",
                f"{seconds(cuda.cold_s)} ({cuda.cold_compile_steps} compiles), artifact gate {gate} / "
                f"{seconds(cuda.fresh_dir_s)} ({cuda.fresh_dir_hits} hits, {cuda.fresh_dir_misses} misses)",
                "-",
                "-",
            )
        )
    return rows


def _cuda_profile_row(profile: CudaProfile) -> Row:
    e = profile.estimate
    fat = e.fatbinary_sum_s
    fatbinary = (
        f"; fatbinary, run again on each hit: {seconds(fat.size)} summed with the tree's size "
        f"compression, {seconds(fat.balance)} with balance"
        if fat
        else ""
    )
    ccache = seconds(e.ccache_depend_wall_s) if e.ccache_depend_wall_s is not None else "ccache not found"
    return (
        f"where a fresh CUDA dir's time goes, sampled (`--only cuda-profile`): its {profile.cu_objects} "
        f".cu objects as sccache hits on {e.cores} cores, vs raw nvcc; as ccache depend-mode hits",
        f"{seconds(e.sccache_wall_s)} ({e.sccache_hit_over_raw} of raw nvcc's {seconds(e.raw_wall_s)}"
        f"{fatbinary}); {ccache}",
        f"at most {seconds(e.target_s)} for the whole fresh dir",
        "-",
    )


def _upstream_tests_row(tests: UpstreamTests) -> Row:
    cold, warm, blame = tests.cold_no_cache, tests.fresh_dir_from_cache, tests.attribution
    return (
        "upstream's tests (`--upstream-tests`, `--only upstream-tests`): the tests' build dir cold (no "
        "compiler cache) / fresh from the cache; `ctest -L main`; one broken test's baseline + attribution",
        (f"{seconds(cold.build_s)} / " if cold else "- / ")
        + f"{seconds(warm.build_s)} ({warm.hits} hits, {warm.misses} misses); "
        f"{seconds(tests.ctest.wall_s)}; {seconds(blame.baseline_s)} + {seconds(blame.attribution_s)} "
        f"({blame.probes} probes)",
        "-",
        "-",
    )


def _rocm_row(rocm: Rocm) -> Row:
    fresh = (
        f"{seconds(rocm.fresh_dir_s)} ({rocm.fresh_dir_hits} hits, {rocm.fresh_dir_misses} misses)"
        if rocm.fresh_dir_s is not None
        else ("?" if rocm.fresh_dir is None else rocm.fresh_dir)
    )
    return (
        "whole `nox -s build-rocm -- --no-spot-check` in the Debian root: cold configure + build / "
        "up to date / a fresh dir from the cache (`--only rocm`)",
        f"{seconds(rocm.configure_s)} + {seconds(rocm.build_s)} ({rocm.compile_steps} compiles), "
        f"artifact gate {rocm.artifact_gate} / {seconds(rocm.up_to_date_session_s)} "
        f"({rocm.up_to_date_compile_steps} compiles) / {fresh}",
        "-",
        "-",
    )


def proof_rows(report: BenchReport) -> list[Row]:
    """The spot check, the remote cache, CUDA (its build and where a fresh dir's time goes),
    upstream's tests and ROCm."""
    rows = _spot_and_cache_rows(report)
    if report.cuda_profile:
        rows.append(_cuda_profile_row(report.cuda_profile))
    if report.upstream_tests:
        rows.append(_upstream_tests_row(report.upstream_tests))
    if report.rocm:
        rows.append(_rocm_row(report.rocm))
    return rows


def _sent(
    local: DistLocal, sent: DistSent | CpuDistSent, overhead: float, per: str, estimate: Mapping[str, float]
) -> str:
    """A dist figure: the local build beside the one sent, where the compiles ran, the overhead
    per compile (``per``: what one is), the estimate for N servers."""
    counts = sent.counts
    by_n = " / ".join(f"{n}: {seconds(s)}" for n, s in sorted(estimate.items(), key=lambda kv: int(kv[0])))

    def count(value: int | None) -> object:
        return "?" if value is None else value

    remote, here, failed = (counts.remote, counts.local, counts.failed_over) if counts else (None, None, None)
    return (
        f"{seconds(local.build_s)} / {seconds(sent.build_s)}: {count(remote)} ran remotely, "
        f"{count(here)} locally, {count(failed)} failed over; overhead "
        f"{overhead:g} core-s per {per}; estimate (an upper bound) {by_n}"
    )


def dist_rows(dist: Dist | None) -> list[Row]:
    """The dist section: the CPU build (and CUDA's sampled objects, when measured) sent to a cluster."""
    if not dist:
        return []
    local, sent, servers, cores = dist.local, dist.dist, dist.servers, dist.cores
    rows: list[Row] = [
        (
            f"the CPU build (llama-server and the RPC server), {local.compiles} compiles: a local build / sent "
            f"to {servers} build servers on the same {cores} cores (`--only dist`); estimate with N real servers",
            _sent(local, sent, sent.overhead_per_compile_s, "compile", dist.estimate_build_s),
            "-",
            "-",
        )
    ]
    cuda = dist.cuda
    if cuda:
        rows.append(
            (
                f"a sample of CUDA's objects ({cuda.sample} of {cuda.objects}, every k-th by name): a local "
                f"build / sent to {servers} build servers on the same {cores} cores (`--only dist`); estimate of "
                "every object with N servers",
                _sent(cuda.local, cuda.dist, cuda.overhead_per_compile_s, "object", cuda.estimate_objects_s),
                "-",
                "-",
            )
        )
    if dist.compile_steps:
        rows.append(
            (
                "compile steps of each backend's build (one remote-cache entry each at least; configure only)",
                ", ".join(f"{name} {n}" for name, n in sorted(dist.compile_steps.items()) if n is not None),
                "-",
                "-",
            )
        )
    return rows
