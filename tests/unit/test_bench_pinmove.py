"""The pure pieces of the pin-move bench section (benchmarks/bench_pinmove.py) and its row in the
figures table: the raw dir's flags hold the commit fixed and run no compiler cache, the unpatched
tree is configured as upstream configures it, and the counts count what they say."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import bench, bench_pinmove
from benchmarks.bench_pinmove import (
    CompileCounter,
    carrying,
    compile_entries,
    move_met,
    moved_text,
    raw_configure_args,
    unpatched_configure_args,
)
from tooling.docs.bench import render_bench

STAMP_ARGS = (
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_CXX_COMPILER_LAUNCHER=/opt/bin/sccache",
    "-DCMAKE_C_COMPILER_LAUNCHER=/opt/bin/sccache",
    "-DCMAKE_MAKE_PROGRAM=/opt/bin/ninja",
    "-DGGML_RPC=ON",
    "-DLLAMA_BUILD_COMMIT=dd3cbc70816d",
    "-DLLAMA_BUILD_NUMBER=2",
    "-DSKIPPY_QUEUE_DIGEST=7b5014",
    "-DSKIPPY_UPSTREAM_SHA=dd3cbc70816dd9e2c45e925f794f628dc65a9f29",
    "--log-level=WARNING",
)


def test_the_raw_dir_keeps_skippys_flags_and_commit_but_runs_no_compiler_cache() -> None:
    args = raw_configure_args(STAMP_ARGS)
    assert not [a for a in args if "LAUNCHER" in a]
    assert "-DLLAMA_BUILD_COMMIT=dd3cbc70816d" in args and "-DLLAMA_BUILD_NUMBER=2" in args
    assert "-DSKIPPY_UPSTREAM_SHA=dd3cbc70816dd9e2c45e925f794f628dc65a9f29" in args
    assert "-DGGML_RPC=ON" in args and "-DCMAKE_MAKE_PROGRAM=/opt/bin/ninja" in args
    assert args[-1] == "--log-level=WARNING", "arguments that are not -D values are kept"
    assert len(args) == len(STAMP_ARGS) - 2


def test_the_unpatched_tree_is_configured_without_a_commit_so_upstream_asks_git() -> None:
    args = unpatched_configure_args(STAMP_ARGS)
    assert not [a for a in args if a.startswith(("-DLLAMA_BUILD_", "-DSKIPPY_")) or "LAUNCHER" in a]
    assert args == [
        "-DBUILD_SHARED_LIBS=OFF",
        "-DCMAKE_MAKE_PROGRAM=/opt/bin/ninja",
        "-DGGML_RPC=ON",
        "--log-level=WARNING",
    ]


def test_a_move_adds_a_line_to_the_readme_and_a_line_of_code_on_top_of_a_source() -> None:
    assert moved_text("README.md", "# llama.cpp\n", "m 1") == "# llama.cpp\n\nm 1\n"
    assert moved_text("README.md", "no newline", "m 1") == "no newline\n\nm 1\n"
    source = moved_text("src/llama-batch.cpp", '#include "llama-batch.h"\n', "m 1")
    assert source.splitlines() == [
        '[[maybe_unused]] static const char skippy_bench_pin_move[] = "m 1";',
        '#include "llama-batch.h"',
    ]
    assert (
        moved_text("a.cpp", "", 'q"\\') == '[[maybe_unused]] static const char skippy_bench_pin_move[] = "q\\"\\\\";\n'
    )
    assert moved_text("a.cpp", "", "run 1") != moved_text("a.cpp", "", "run 2"), "each run's object is new"
    paths = [path for _name, path, _subject in bench_pinmove.MOVES]
    assert paths[0] == "README.md" and paths[1].endswith(".cpp"), "one README-only move, one source (no header)"


COMPDB: list[dict[str, Any]] = [
    {
        "output": "ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o",
        "command": 'cc -DGGML_COMMIT=\\"dd3cbc70816d\\" -c ggml.c',
    },
    {"output": "src/CMakeFiles/llama.dir/llama.cpp.o", "command": "c++ -DLLAMA_VERSION=1 -c llama.cpp"},
    {"output": "bin/llama-server", "command": "c++ -o bin/llama-server dd3cbc70816d.o"},
    {"output": "common/build-info.cpp", "command": "cmake -DCOMMIT=dd3cbc70816d -P gen.cmake"},
]


def test_only_compile_lines_are_counted_for_the_commit_string() -> None:
    assert [e["output"] for e in compile_entries(COMPDB)] == [
        "ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o",
        "src/CMakeFiles/llama.dir/llama.cpp.o",
    ]
    wanted = frozenset({"src/CMakeFiles/llama.dir/llama.cpp.o", "bin/llama-server", "elsewhere.o"})
    assert [e["output"] for e in compile_entries(COMPDB, wanted)] == ["src/CMakeFiles/llama.dir/llama.cpp.o"]
    assert carrying(COMPDB, "dd3cbc70816d") == 1, "the link and the generator carry it too, but compile nothing"
    assert carrying(compile_entries(COMPDB, wanted), "dd3cbc70816d") == 0
    assert carrying(COMPDB, "0123456789ab") == 0
    with pytest.raises(ValueError, match="empty"):
        carrying(COMPDB, "")


def test_the_compile_counter_reads_ninjas_compile_steps_only() -> None:
    untouched = CompileCounter()
    untouched("[0/2] Re-checking globbed directories...")
    assert not untouched.reconfigured and untouched.compiled == 0
    counter = CompileCounter()
    for line in (
        "[1/6] Re-running CMake...",
        "[2/6] Building CXX object src/CMakeFiles/llama.dir/llama-batch.cpp.o",
        "[3/6] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o",
        "[4/6] Linking CXX static library src/libllama.a",
        "[5/6] Linking CXX executable bin/llama-server",
        "Building CXX object without a step counter",
    ):
        counter(line)
    assert counter.compiled == 2 and counter.reconfigured
    assert counter.lines == ["src/CMakeFiles/llama.dir/llama-batch.cpp.o", "ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o"]


@pytest.mark.parametrize(
    ("skippy", "raw", "readme_only", "met"),
    [(2, 0, True, True), (3, 0, True, False), (3, 1, False, True), (4, 1, False, False), (5, 3, False, True)],
)
def test_a_move_is_met_within_two_steps_of_raw_and_a_readme_move_within_two(
    skippy: int, raw: int, readme_only: bool, met: bool
) -> None:
    assert move_met(skippy, raw, readme_only=readme_only) is met


def test_the_section_runs_with_the_others() -> None:
    assert "pin-move" in bench.SECTIONS and "pin-move" not in bench.ON_REQUEST


def test_the_figures_table_shows_the_pin_move_row() -> None:
    move = {
        "skippy": {"compile_steps": 2, "wall_s": 21.5},
        "raw_fixed_commit": {"compile_steps": 0, "rebuild_s": 9.1},
        "met": True,
    }
    section = {
        "moves": {"one_source": {**move, "met": False}, "readme_only": move, "later_move": move},
        "commit_on_compile_lines": {
            "skippy": 1,
            "compile_lines": 308,
            "unpatched_upstream": {"commit": "dd3cbc7", "compile_lines": 308, "carrying_commit": 190},
        },
        "target_readme_only_steps": 2,
        "target_extra_steps": 2,
        "met": False,
    }
    table = render_bench({"machine": {"cpus": 2}, "pin_move": section})
    row = next(line for line in table.splitlines() if line.startswith("| compile steps and seconds of a pin move"))
    assert "README only: 2 in 21.5 s / 0 in 9.1 s; one source: 2 in 21.5 s / 0 in 9.1 s; later move: 2 in" in row
    assert "on 1 of skippy's 308 compile lines (unpatched tree: 190 of 308)" in row
    assert row.endswith("| README only at most 2; at most raw + 2 | **missed** |")
    assert "does not show" not in table
