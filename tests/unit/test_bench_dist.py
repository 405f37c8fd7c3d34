"""The dist bench's pure parts: Ninja's step times, the estimate for N real servers, the overhead
per compile, and the CUDA sample (which objects, how its figures scale to every object)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_dist import (
    ESTIMATE_SERVERS,
    SampleBuild,
    cuda_figures,
    estimate,
    estimates,
    ninja_steps,
    overhead_per_compile,
    sample_objects,
)
from skippy.compile.builder import BuildReport


def test_ninja_steps_keep_the_last_run_of_each_output(tmp_path: Path) -> None:
    (tmp_path / ".ninja_log").write_text(
        "# ninja log v6\n0\t1500\t0\ta.o\tx\n1500\t1700\t0\tbin/llama-server\ty\n0\t900\t0\ta.o\tz\n", "utf-8"
    )
    assert ninja_steps(tmp_path) == {"a.o": 0.9, "bin/llama-server": 0.2}


def test_the_estimate_spreads_compiles_over_every_servers_cores() -> None:
    one = estimate(compile_s=600, other_s=40, compiles=300, overhead_s=0.5, cores=2, servers=1)
    four = estimate(compile_s=600, other_s=40, compiles=300, overhead_s=0.5, cores=2, servers=4)
    assert one == 40 / 2 + 300 * 2.5 / 2
    assert four == 40 / 2 + 300 * 2.5 / 8
    # no overhead, one server of this machine's cores: the local build's own time
    assert estimate(compile_s=600, other_s=40, compiles=300, overhead_s=0, cores=2, servers=1) == 320


def test_the_sample_is_every_kth_cuda_object_by_name() -> None:
    objects = [f"ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/o{i:02}.cu.o" for i in range(10)]
    others = ["ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o", "bin/llama-server", "all"]
    sample = sample_objects([*reversed(objects), *others, objects[3]], 3)
    # 10 objects, 3 wanted: every third from the first, no more than 3
    assert sample == (objects[0], objects[3], objects[6])
    assert sample_objects(objects, 3) == sample  # the order given does not matter
    assert sample_objects(objects[:2], 3) == tuple(objects[:2])  # fewer than wanted: all of them
    assert sample_objects(others, 3) == ()


def test_the_estimates_cover_each_server_count_and_ignore_a_negative_overhead() -> None:
    got = estimates(compile_s=600, other_s=40, compiles=300, overhead_s=-0.2, cores=2)
    assert list(got) == [str(n) for n in ESTIMATE_SERVERS]
    assert got["1"] == 320
    assert got["4"] == round(estimate(compile_s=600, other_s=40, compiles=300, overhead_s=0, cores=2, servers=4), 1)


def test_the_overhead_is_the_difference_in_core_seconds_per_compile_sent() -> None:
    assert overhead_per_compile(local_s=100, dist_s=110, cores=2, compiles=20) == 1.0
    assert overhead_per_compile(local_s=100, dist_s=98, cores=2, compiles=4) == -1.0
    assert overhead_per_compile(local_s=1, dist_s=2, cores=2, compiles=0) == 2.0


def _sample_build(build_dir: Path, seconds: float, sample: tuple[str, ...], total: int) -> SampleBuild:
    report = BuildReport(
        backend="cuda",
        build_dir=build_dir,
        configured=False,
        configure_reason="up to date",
        configure_seconds=0.0,
        build_seconds=seconds,
        compiled=len(sample),
        steps=len(sample),
        binaries={},
        cache=None,
    )
    return SampleBuild(report, seconds + 1, sample, total)


def test_the_cuda_estimate_scales_the_samples_compile_seconds_to_every_object(tmp_path: Path) -> None:
    here_dir, there_dir = tmp_path / "here", tmp_path / "there"
    here_dir.mkdir()
    there_dir.mkdir()
    # two sampled objects (8 s and 12 s of compiling) and a step outside the sample
    (here_dir / ".ninja_log").write_text(
        "# ninja log v6\n0\t8000\t0\ta.cu.o\tx\n0\t12000\t0\tb.cu.o\ty\n0\t5000\t0\tc.c.o\tz\n", "utf-8"
    )
    sample = ("a.cu.o", "b.cu.o")
    figures = cuda_figures(
        _sample_build(here_dir, 10.0, sample, 20), _sample_build(there_dir, 12.0, sample, 20), cores=2, dist_jobs=4
    )
    assert (figures["sample"], figures["objects"], figures["same_sample"]) == (2, 20, True)
    assert figures["local"]["compile_step_s"] == 20.0
    assert figures["overhead_per_compile_s"] == 2.0  # 2 s more on 2 cores over 2 objects
    # 20 s for 2 objects: 200 s for the 20, each paying 2 s more, no other steps
    assert figures["estimate_objects_s"]["1"] == round(
        estimate(compile_s=200, other_s=0, compiles=20, overhead_s=2, cores=2, servers=1), 1
    )
    assert figures["estimate_objects_s"]["1"] == 120.0
    assert (figures["local"]["jobs"], figures["dist"]["jobs"]) == (2, 4)
