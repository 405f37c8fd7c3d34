"""The scale bench section's pure pieces (benchmarks/bench_scale.py): the queue's split into lanes,
where the synthesized patches go, the ratios and the targets, the git counter, the alternation of
the measured runs, the plot, and the section's rows in the figures table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_scale as bs
from skippy.core import proc
from tooling.docs.bench import render_bench

SHIPPED = bs.LaneSplit(core=5, model_support=1, generated=3)


@pytest.mark.parametrize(
    ("n", "split"),
    [
        (9, bs.LaneSplit(5, 1, 3)),  # the shipped queue itself
        (40, bs.LaneSplit(13, 2, 25)),
        (130, bs.LaneSplit(41, 6, 83)),  # a real downstream's lanes
        # past the generator's 124 families, the rest of the generated share goes to model_support
        (400, bs.LaneSplit(126, 150, 124, moved=132)),
    ],
)
def test_the_queue_is_split_as_a_real_downstreams(n: int, split: bs.LaneSplit) -> None:
    got = bs.lane_split(n, shipped=SHIPPED, families=124)
    assert got == split
    assert got.total == n
    assert got.as_dict()["generated_moved_to_model_support"] == split.moved


def test_every_size_keeps_the_shipped_lanes_and_adds_up() -> None:
    for n in range(9, 501):
        got = bs.lane_split(n, shipped=SHIPPED, families=124)
        assert got.total == n, n
        assert got.core >= 5 and got.model_support >= 1 and 3 <= got.generated <= 124, (n, got)
    assert bs.lane_split(12, shipped=SHIPPED, families=124).generated > 3
    with pytest.raises(ValueError, match="cannot hold the shipped 9"):
        bs.lane_split(8, shipped=SHIPPED, families=124)
    with pytest.raises(ValueError, match="2 families cannot hold the shipped 3"):
        bs.lane_split(40, shipped=SHIPPED, families=2)


def test_a_cost_per_patch_that_falls_is_flat_enough() -> None:
    # a fixed 4 s and 10 ms per patch: the cost per patch falls from 110 to 20 ms
    fixed = rows()
    for row in fixed:
        row["commands"]["parity"] = command(4.0 + 0.01 * row["n"], 1.0)
    got = bs.verdicts(fixed)["parity"]
    assert got["growth"] == 1.0 and got["met"] is True
    assert got["spread"] == pytest.approx(5.5, abs=0.01)


def test_ratios_and_spreads() -> None:
    assert bs.ratio(3.0, 2.0) == 1.5
    assert bs.ratio(1.0, 3.0) == 0.333
    assert bs.ratio(1.0, 0.0) is None
    assert bs.spread([0.2, 0.3, 0.25]) == 1.5
    assert bs.spread([]) is None
    assert bs.spread([0.0, 1.0]) is None
    assert bs.growth({40: 0.2, 130: 0.1, 400: 0.25}) == 1.25
    assert bs.growth({40: 0.2}) is None
    assert bs.growth({40: 0.0, 400: 1.0}) is None


CPP = """\
#include "x.h"

static int helper(int a) {
    return a;
}

void llama_thing::impl::load(llama_model_loader & ml, const LLM_KV & kv) {
    int x = 0;
}
struct not_a_function {
    int a;
};
namespace {
int close_to_the_last(void) {
    return 1;
}
}
bool llama_thing::is_ok(llama_token id) const {
    return true;
}
llm_build_toy::llm_build_toy(const llama_model & model, const llm_graph_params & params) : llm_graph_context(params) {
    x();
}
"""


def test_function_heads_are_definitions_at_column_zero_kept_apart() -> None:
    heads = bs.function_heads(CPP, gap=1)
    assert heads == [
        (2, "helper"),
        (6, "llama_thing::impl::load"),
        (13, "close_to_the_last"),
        (17, "llama_thing::is_ok"),
        (20, "llm_build_toy::llm_build_toy"),
    ]
    # two heads closer than the gap: the later one is left out (no shared context between patches)
    assert [name for _line, name in bs.function_heads(CPP, gap=5)] == [
        "helper",
        "close_to_the_last",
        "llm_build_toy::llm_build_toy",
    ]


def test_sites_spread_over_the_files_first() -> None:
    files = [("src/b.cpp", CPP), ("src/a.cpp", CPP)]
    sites = bs.pick_sites(files, 3, gap=1)
    assert [(s.path, s.function) for s in sites] == [
        ("src/a.cpp", "helper"),
        ("src/b.cpp", "helper"),
        ("src/a.cpp", "llama_thing::impl::load"),
    ]
    assert bs.pick_sites(files, 0) == []
    with pytest.raises(ValueError, match="only 10 functions to edit in 2 files, 11 wanted"):
        bs.pick_sites(files, 11, gap=1)


def test_a_line_goes_into_the_body_and_later_sites_move_down() -> None:
    sites = bs.pick_sites([("src/a.cpp", CPP)], 2, gap=1)
    text = CPP
    done: list[bs.Site] = []
    for number, site in enumerate(reversed(sites)):  # the later function first: the earlier does not move
        text = bs.insert_after(text, bs.shifted(site, done), f"    // line {number}")
        done.append(site)
    lines = text.splitlines()
    assert lines[3] == "    // line 1" and lines[2].startswith("static int helper")
    assert lines[8] == "    // line 0" and lines[7].startswith("void llama_thing::impl::load")
    # in apply order the second site sits one line lower once the first is in
    assert bs.shifted(sites[1], sites[:1]) == sites[1].line + 1
    assert bs.shifted(sites[1], [bs.Site("src/other.cpp", 0, "f")]) == sites[1].line
    with pytest.raises(ValueError, match="no line 100 in a 23-line file"):
        bs.insert_after(CPP, 99, "x")


def test_the_changed_patch_gets_its_line_after_the_first_added_block() -> None:
    diff = (
        "diff --git a/src/x.cpp b/src/x.cpp\n--- a/src/x.cpp\n+++ b/src/x.cpp\n"
        "@@ -10,0 +11,2 @@ void f() {\n+    a();\n+    b();\n@@ -40 +42 @@ void g() {\n-x\n+y\n"
    )
    assert bs.first_added_block_end(diff) == 12
    assert bs.first_added_block_end("@@ -3 +2,0 @@\n-gone\n@@ -9 +8 @@\n-a\n+b\n") == 8
    assert bs.first_added_block_end("@@ -3 +2,0 @@\n-gone\n") is None
    assert bs.comment_start("src/llama.cpp") == "//"
    assert bs.comment_start("common/build-info.cpp.in") == "//"
    assert bs.comment_start("tools/rpc/CMakeLists.txt") == "#"
    assert bs.comment_start("cmake/x.cmake") == "#"
    assert bs.comment_start("README.md") is None
    assert bs.comment_start("Makefile") is None


def command(ours: float, raw: float, git: int = 5) -> dict[str, Any]:
    return {
        "skippy": {"median_s": ours, "samples_s": [ours]},
        "raw": {"median_s": raw, "samples_s": [raw]},
        "ratio": bs.ratio(ours, raw),
        "git": {"skippy": git, "raw": 2},
    }


def rows(parity_400: float = 40.0, noop_git: int = 1) -> list[dict[str, Any]]:
    out = []
    for n, raw in ((9, 0.5), (40, 1.0), (130, 3.0), (400, 9.0)):
        out.append(
            {
                "n": n,
                "lanes": {"core": 1, "model_support": 1, "generated": 1, "generated_moved_to_model_support": 0},
                "commands": {
                    "cold_prepare": command(raw * 1.1, raw),
                    "reprepare": command(raw, raw),
                    "noop_prepare": command(0.3 if n < 400 else 0.4, 0.25, git=noop_git),
                    "check": command(raw * 2.5, raw),
                    "regenerate": command(raw * 1.9, raw),
                    "parity": command(parity_400 if n == 400 else n * 0.1, raw),
                },
            }
        )
    return out


def test_the_targets_are_read_off_the_figures() -> None:
    got = bs.verdicts(rows())
    assert {k: v["met"] for k, v in got.items()} == {
        "cold_prepare": True,
        "reprepare": True,
        "check": True,
        "regenerate": True,
        "parity": True,
        "noop_prepare": True,
    }
    assert list(got["check"]["ratios"]) == [130, 400]  # only the large queues count for check
    assert got["parity"]["per_patch_s"] == {40: 0.1, 130: 0.1, 400: 0.1}
    assert got["noop_prepare"]["spread"] == pytest.approx(1.333, abs=1e-3)
    # parity's cost per patch growing 1.6x from 40 to 400, a no-op prepare running two gits
    worse = bs.verdicts(rows(parity_400=64.0, noop_git=2))
    assert worse["parity"]["met"] is False and worse["parity"]["growth"] == 1.6
    assert worse["noop_prepare"]["met"] is False
    # a target with nothing to judge is neither met nor missed
    small = bs.verdicts([r for r in rows() if r["n"] < 130])
    assert small["check"]["met"] is None
    assert bs.verdicts([r for r in rows() if r["n"] == 9])["parity"]["met"] is None


def test_the_shim_counts_each_git_run_and_passes_the_arguments_on(tmp_path: Path) -> None:
    fake = tmp_path / "fake-git"
    fake.write_text('#!/bin/sh\necho "ran $*"\n', encoding="utf-8")
    fake.chmod(0o755)
    shim = bs.GitShim.make(tmp_path / "shim", str(fake))
    said: list[str] = []

    def twice(env: Mapping[str, str]) -> None:
        for arg in ("one", "two words"):
            said.append(proc.run(["git", "status", arg], env=env).stdout.strip())

    assert shim.count(twice, {"PATH": "/usr/bin:/bin"}) == 2
    assert said == ["ran status one", "ran status two words"]
    assert shim.count(lambda _env: None, {"PATH": "/usr/bin:/bin"}) == 0  # the log starts over


def test_the_sides_alternate_after_an_untimed_counted_run_each(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "git"  # the only git on PATH, counted or not
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n", encoding="utf-8")
    fake.chmod(0o755)
    shim = bs.GitShim.make(tmp_path / "shim", str(fake))
    order: list[str] = []
    ticks = iter(range(100))

    def side(name: str, gits: int) -> bs.Action:
        def run(env: Mapping[str, str]) -> None:
            order.append(name)
            for _ in range(gits):
                proc.run(["git"], env=env)

        return run

    pair = bs.Pair(
        "x", side("ours", 3), side("raw", 1), lambda: order.append("before ours"), lambda: order.append("before raw")
    )
    got = bs.measure(pair, rounds=2, env={"PATH": str(fake.parent)}, shim=shim, clock=lambda: float(next(ticks)))
    assert order == [
        *("before ours", "ours", "before raw", "raw"),  # counted, untimed
        *("before ours", "ours", "before raw", "raw"),  # round 1
        *("before raw", "raw", "before ours", "ours"),  # round 2, swapped
    ]
    assert got["git"] == {"skippy": 3, "raw": 1}
    assert got["skippy"]["samples_s"] == [1.0, 1.0] and got["ratio"] == 1.0


def section() -> dict[str, Any]:
    got = rows()
    got[-1]["lanes"] = {"core": 126, "model_support": 150, "generated": 124, "generated_moved_to_model_support": 132}
    return {"rounds": 1, "sizes": got, "targets": bs.verdicts(got)}


def test_the_plot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "figures" / "scale.png"
    bs.plot(section(), path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_figures_table_shows_each_command_and_its_target() -> None:
    table = render_bench({"machine": {"cpus": 2}, "scale": section()})
    assert "400: 126 / 150 / 124 (132 of the generated share in model_support)" in table
    cold = next(line for line in table.splitlines() if line.startswith("| cold `invoke prepare --pinned` at N"))
    assert "0.55 s (1.1x; 5 / 2 git) / 1.10 s (1.1x; 5 / 2 git)" in cold
    assert cold.endswith("| at most 1.2x raw | met |")
    parity = next(line for line in table.splitlines() if line.startswith("| `invoke parity`"))
    assert "ms per patch from N = 40: 100.0 / 100.0 / 100.0 (at most 1x the first)" in parity
    assert "does not show yet" not in table and "**missed**" not in table
    # as read back from the JSON: string keys, sorted as strings
    parsed = json.loads(json.dumps({"scale": section()}, sort_keys=True))
    parsed["scale"]["targets"]["parity"]["per_patch_s"] = {"130": 0.07, "40": 0.1, "400": 0.05}
    assert "ms per patch from N = 40: 100.0 / 70.0 / 50.0" in render_bench(parsed)
    slow = section()
    slow["sizes"][2]["commands"]["check"] = command(9.5, 3.0)
    slow["targets"] = bs.verdicts(slow["sizes"])
    check = next(line for line in render_bench({"scale": slow}).splitlines() if "`invoke check` at N" in line)
    assert check.endswith("| at most 3 raw applies at N = 130, 400 | **missed** |")
    assert "| `invoke status`" not in table  # not measured: no row


def test_the_section_is_registered_with_its_options() -> None:
    from benchmarks import bench

    assert "scale" in bench.SECTIONS and "scale" not in bench.ON_REQUEST
    assert bench._sizes("9, 40,130,") == (9, 40, 130)
    assert bench.ScaleOptions().sizes == bs.DEFAULT_SIZES
