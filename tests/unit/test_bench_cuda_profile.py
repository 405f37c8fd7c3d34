"""The pure pieces of the ``cuda-profile`` bench section: the compile lines it runs, what it
reads from nvcc's phase table and sccache's debug log, and how it extrapolates."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench
from benchmarks.bench_cuda_profile import (
    compile_line,
    estimate,
    family,
    generate_code_flags,
    parse_debug_log,
    phase_seconds,
)
from tooling.docs.bench import render_bench

COMMAND = (
    "/kit/bin/nvcc -forward-unknown-to-host-compiler -DX -I/src/ggml/src -O3 "
    '"--generate-code=arch=compute_80,code=[compute_80,sm_80]" -use_fast_math '
    '-Xcompiler "-Wall -Wextra" -x cu -c /src/ggml/src/ggml-cuda/arange.cu -o ggml/src/arange.cu.o'
)


def test_the_section_runs_only_when_asked_for() -> None:
    assert "cuda-profile" in bench.ON_REQUEST
    assert "cuda-profile" not in bench.SECTIONS


def test_objects_fall_into_the_template_instance_families_or_the_hand_written_kernels() -> None:
    base = "/src/ggml/src/ggml-cuda/"
    assert family(base + "template-instances/fattn-vec-instance-q4_0-q4_0.cu") == "fattn-vec"
    assert family(base + "template-instances/fattn-mma-f16-instance-ncols1_8-ncols2_4.cu") == "fattn-mma-f16"
    assert family(base + "template-instances/mmq-instance-q4_0.cu") == "mmq"
    assert family(base + "mmvq.cu") == "kernels"
    assert family(base + "fattn-vec-instance-not-generated.cu") == "kernels"


def test_architectures_become_cmakes_generate_code_flags() -> None:
    assert generate_code_flags("75-virtual;80;86-real") == [
        "--generate-code=arch=compute_75,code=[compute_75]",
        "--generate-code=arch=compute_80,code=[compute_80,sm_80]",
        "--generate-code=arch=compute_86,code=[sm_86]",
    ]
    assert len(generate_code_flags("75-virtual;80-virtual;86-real;89-real;90-virtual")) == 5


def test_a_compile_line_writes_the_given_object_with_the_ninja_rules_depfile() -> None:
    argv = compile_line(COMMAND, Path("/out/raw/arange.cu.o"))
    assert argv[0] == "/kit/bin/nvcc"
    assert argv[-2:] == ["-o", "/out/raw/arange.cu.o"]
    c = argv.index("-c")
    assert argv[c - 5 : c] == ["-MD", "-MT", "/out/raw/arange.cu.o", "-MF", "/out/raw/arange.cu.o.d"]
    assert "-Wall -Wextra" in argv, "a quoted host-compiler option stays one argument"
    assert "ggml/src/arange.cu.o" not in argv


def test_a_compile_line_for_other_architectures_replaces_the_generate_code_flags_in_place() -> None:
    path = Path("/o.o")
    argv = compile_line(COMMAND, path, architectures="86-real;90-virtual")
    flags = [a for a in argv if a.startswith("--generate-code=")]
    assert flags == [
        "--generate-code=arch=compute_86,code=[sm_86]",
        "--generate-code=arch=compute_90,code=[compute_90]",
    ]
    assert argv.index(flags[0]) == compile_line(COMMAND, path).index(
        "--generate-code=arch=compute_80,code=[compute_80,sm_80]"
    )


def test_nvccs_phase_table_is_summed_per_phase_over_architectures() -> None:
    table = "\n".join(
        [
            "source file name , phase name , phase input files , phase output file , arch , tool, metric , unit",
            "a.cu , gcc (preprocessing 4) , a.cu  , a.cpp4.ii ,  , nvcc , 174.5110 , ms",
            "a.cu , gcc (preprocessing 1) , a.cu  , a.cpp1.ii , compute_80 , nvcc , 182.3880 , ms",
            "a.cu , gcc (preprocessing 1) , a.cu  , b.cpp1.ii , compute_86 , nvcc , 100.0000 , ms",
            "a.cu , cicc ,  a.cpp1.ii  , a.ptx , compute_80 , nvcc , 745.5620 , ms",
            "a.cu , broken row",
        ]
    )
    assert phase_seconds(table) == {"gcc (preprocessing 4)": 0.175, "gcc (preprocessing 1)": 0.282, "cicc": 0.746}


LOG = """\
[T DEBUG sccache::compiler::compiler] [arange.cu.o]: generate_hash_key took 0.985 s
[T DEBUG sccache::compiler::compiler] [arange.cu.o]: Cache miss in 0.000 s
[T DEBUG sccache::compiler::compiler] [arange.module_id]: generate_hash_key took 0.002 s
[T DEBUG sccache::server] [arange.module_id]: compile result: cache hit
[T DEBUG sccache::compiler::compiler] [arange.ptx]: generate_hash_key took 0.003 s
[T DEBUG sccache::server] [arange.ptx]: compile result: cache hit
[T DEBUG sccache::compiler::compiler] [arange.cu.o]: generate_hash_key took 0.088 s
[T DEBUG sccache::server] [arange.cu.o]: compile result: cache hit
[T DEBUG sccache::compiler::compiler] [arange.cu.o]: Compiled in 0.962 s, but not cacheable
[T DEBUG sccache::server] [arange.cu.o]: compile result: not cacheable
"""


def test_sccaches_debug_log_gives_the_outer_key_the_host_compile_key_and_the_steps() -> None:
    parsed = parse_debug_log(LOG, "arange.cu.o")
    assert parsed == {
        "outer_nvcc_key_s": 0.985,
        "host_compile_key_s": 0.088,
        "step_keys_s": 0.005,
        "lookups": 4,
        "results": {"cache hit": 3, "not cacheable": 1},
        "decomposed_steps_s": 0.962,
    }
    assert parse_debug_log("", "x.o")["outer_nvcc_key_s"] is None


def test_the_estimate_weights_each_familys_mean_by_its_objects_and_divides_by_the_cores() -> None:
    rows = {
        "a.cu": {"family": "kernels", "raw_s": 4.0, "sccache_hit_s": 1.0, "ccache_depend_hit_s": 0.02},
        "b.cu": {"family": "kernels", "raw_s": 6.0, "sccache_hit_s": 2.0, "ccache_depend_hit_s": 0.04},
        "t/mmq-instance-q4_0.cu": {"family": "mmq", "raw_s": 60.0, "sccache_hit_s": 3.0, "ccache_depend_hit_s": 0.1},
    }
    e = estimate(rows, {"kernels": 10, "mmq": 4, "mmf": 2}, cores=2)
    # kernels 10 x 5.0 + mmq 4 x 60 + mmf (no sample: the kernels' mean) 2 x 5.0
    assert e["raw_sum_s"] == 300.0
    assert e["sccache_hit_sum_s"] == pytest.approx(10 * 1.5 + 4 * 3.0 + 2 * 1.5)
    assert e["sccache_wall_s"] == pytest.approx(e["sccache_hit_sum_s"] / 2, abs=0.1)
    assert e["ccache_depend_wall_s"] == pytest.approx((10 * 0.03 + 4 * 0.1 + 2 * 0.03) / 2, abs=0.1)
    assert "fatbinary_sum_s" not in e, "no fatbinary figures, no sum"
    modes = {"size": {"s": 8.0, "bytes": 1}, "balance": {"s": 0.2, "bytes": 3}, "speed": {"s": 0.1, "bytes": 4}}
    with_fat = {k: {**r, "fatbinary_by_mode": {**modes, "none": {"s": 0.1, "bytes": 9}}} for k, r in rows.items()}
    fat = estimate(with_fat, {"kernels": 10, "mmq": 4}, cores=2)["fatbinary_sum_s"]
    assert fat == {"size": 112.0, "balance": 2.8, "speed": 1.4, "none": 1.4}
    without_ccache = {k: {n: v for n, v in r.items() if n != "ccache_depend_hit_s"} for k, r in rows.items()}
    assert "ccache_depend_wall_s" not in estimate(without_ccache, {"kernels": 1}, cores=2)


def test_the_bench_table_shows_the_cuda_profile() -> None:
    figures = {
        "cores": 2,
        "sccache_wall_s": 150.5,
        "sccache_hit_over_raw": 0.12,
        "raw_wall_s": 1250.0,
        "ccache_depend_wall_s": 2.5,
        "target_s": 180.0,
    }
    section = {"cu_objects": 186, "estimate": figures}
    table = render_bench({"machine": {"cpus": 2}, "cuda_profile": section})
    row = next(line for line in table.splitlines() if line.startswith("| where a fresh CUDA dir's time goes"))
    assert "| 150.5 s (0.12 of raw nvcc's 1250.0 s); 2.5 s | at most 180.0 s for the whole fresh dir |" in row
    assert "does not show" not in table
    fat = {**section, "estimate": {**figures, "fatbinary_sum_s": {"size": 370.0, "balance": 8.8}}}
    row = render_bench({"machine": {"cpus": 2}, "cuda_profile": fat}).splitlines()[2]
    assert "(0.12 of raw nvcc's 1250.0 s; fatbinary, run again on each hit: 370.0 s summed with the tree's" in row
    assert "size compression, 8.8 s with balance); 2.5 s |" in row
