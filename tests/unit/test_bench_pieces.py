"""Small pieces of the bench (benchmarks/), tested on their own: the bench must measure
what it says (its own build and cache dirs, the project's sources, the sections asked for)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench, bench_proofs
from benchmarks.bench import alternating
from skippy.core.settings import Settings


def test_a_bench_machine_has_its_own_build_and_cache_dirs_but_the_projects_sources(tmp_path: Path) -> None:
    project = Settings.from_table(tmp_path, {"build": {"jobs": 2}}, {"PATH": "/usr/bin", "CI": "true"})
    machine = bench_proofs.machine_settings(project, tmp_path / "bench", "a", SKIPPY_CACHE_STORAGE="redis://h:1")
    assert machine.build_root == tmp_path / "bench" / "a" / "build"
    assert machine.cache_dir == tmp_path / "bench" / "a" / "cache"
    assert machine.workdir == project.workdir
    assert machine.raw["build"] == {"jobs": 2}
    assert machine.env["SKIPPY_CACHE_STORAGE"] == "redis://h:1"
    assert "CI" not in machine.env, "a bench run is not a CI run (no CI-only behaviour in the figures)"


def test_downloads_are_shared_with_the_bench_machine_but_objects_are_not(tmp_path: Path) -> None:
    project = Settings.from_table(tmp_path, {}, {"PATH": "/usr/bin"})
    (project.cache_dir / "cuda").mkdir(parents=True)
    (project.cache_dir / "rocm-root").mkdir()
    (project.cache_dir / "sccache").mkdir()
    machine = bench_proofs.machine_settings(project, tmp_path / "bench", "a")
    bench_proofs.share_downloads(project, machine)
    assert (machine.cache_dir / "cuda").resolve() == (project.cache_dir / "cuda").resolve()
    assert (machine.cache_dir / "rocm-root").resolve() == (project.cache_dir / "rocm-root").resolve()
    assert not (machine.cache_dir / "sccache").exists()


def test_the_long_cuda_and_rocm_sections_run_only_when_asked_for() -> None:
    for name in ("cuda", "rocm"):
        assert name not in bench.SECTIONS
        assert name in bench.ON_REQUEST
    with pytest.raises(SystemExit):
        bench.main({}, root=Path("/nonexistent"), args=["--only", "nothing-like-this"])


def test_alternating_swaps_the_order_every_round_and_times_each_action() -> None:
    calls: list[str] = []
    ticks = iter(range(100))

    def clock() -> float:
        return float(next(ticks))

    first, second = alternating(3, lambda: calls.append("a"), lambda: calls.append("b"), clock=clock)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert first == [1.0, 1.0, 1.0] and second == [1.0, 1.0, 1.0]
    assert alternating(0, lambda: None, lambda: None) == ([], [])


def test_compile_lines_of_two_backends_compared(tmp_path: Path) -> None:
    from benchmarks.bench_shared import compare_lines, compile_lines

    src = tmp_path / "tree"
    for name in ("cpu", "vulkan"):
        build = tmp_path / name
        build.mkdir()
        use = " -DGGML_USE_VULKAN" if name == "vulkan" else ""
        entries: list[dict[str, Any]] = [
            {"file": str(src / "src/llama.cpp"), "command": f"c++ -DGGML_USE_CPU{use} -I{build}/gen -c x"},
            {"file": str(src / "common/common.cpp"), "command": f"c++ -I{build}/gen -o common.o -c y"},
            {"file": str(src / "ggml/src/ggml.c"), "command": "cc -O3" + (" -DX=1" if name == "vulkan" else "")},
        ]
        if name == "vulkan":
            entries.append({"file": str(build / "shader.comp.cpp"), "arguments": ["c++", "-c", "z"]})
        (build / "compile_commands.json").write_text(json.dumps(entries))
    cpu, vulkan = compile_lines(tmp_path / "cpu", src), compile_lines(tmp_path / "vulkan", src)
    assert cpu["common/common.cpp"] == vulkan["common/common.cpp"], "the build dir's own path does not count"
    assert "<build>/shader.comp.cpp" in vulkan
    assert compare_lines(cpu, vulkan) == {
        "shared": 1,
        "only_backend_use": 1,
        "other": 1,
        "backend_own": 1,
        "cpu_lines": 3,
        "only_backend_use_files": ["src/llama.cpp"],
    }
