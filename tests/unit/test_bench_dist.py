"""The dist bench's arithmetic: Ninja's step times and the estimate for N real servers."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_dist import estimate, ninja_steps


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
