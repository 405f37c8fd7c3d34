"""Small pieces of the bench (benchmarks/), tested on their own: the bench must measure
what it says (its own build and cache dirs, the project's sources, the sections asked for)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench, bench_proofs
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
    (project.cache_dir / "sccache").mkdir()
    machine = bench_proofs.machine_settings(project, tmp_path / "bench", "a")
    bench_proofs.share_downloads(project, machine)
    assert (machine.cache_dir / "cuda").resolve() == (project.cache_dir / "cuda").resolve()
    assert not (machine.cache_dir / "sccache").exists()


def test_the_long_cuda_section_runs_only_when_asked_for() -> None:
    assert "cuda" not in bench.SECTIONS
    assert "cuda" in bench.ON_REQUEST
    with pytest.raises(SystemExit):
        bench.main({}, root=Path("/nonexistent"), args=["--only", "nothing-like-this"])
