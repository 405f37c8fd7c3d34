"""`invoke clean` on real build dirs: real CMake + Ninja builds of tests/integration/cmake_probe
(two sets of CMake settings, a build of the workdir as it stood, a configure whose stamp is gone,
another workdir's build), a real archive cache, and a real process working inside a build dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.cli.entries import clean_main
from skippy.compile.builder import execute_plan
from skippy.compile.localtree import WorkdirState
from skippy.compile.plan import STAMP_NAME, BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.clean import UNSTAMPED_GRACE, clean, plan_clean
from tooling.testbed import LLAMA_CPP_PYTHON, write_manifest

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"
SHA = "1" * 40
MAPPED = "a" * 64
PYPROJECT = f"""[tool.skippy.build]
compiler_cache = "none"

[tool.skippy.archives."{SHA}"]
url = "file:src.tar.gz"
sha256 = "{MAPPED}"
folder = "src"
"""


class Project:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "proj"
        self.root.mkdir()
        (self.root / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
        self.env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path / "home")}
        self.settings = Settings.load(self.root, self.env)
        self.workdir = self.settings.workdir
        shutil.copytree(PROBE, self.workdir)
        self.toolchain = probe_toolchain("cpu", self.settings)

    def build(
        self, *, source: Path | None = None, local: bool = False, build: bool = True, **defines: str
    ) -> BuildPlan:
        plan = plan_build(
            build_request("cpu", self.settings, defines=defines),
            self.settings,
            tree=inspect_tree(source or self.workdir),
            toolchain=self.toolchain,
            patched_sha=SHA,
            local_state=WorkdirState("2" * 40, "3" * 64) if local else None,
        )
        execute_plan(plan, Console(quiet=True), build=build)
        return plan


def age(path: Path, seconds: float) -> None:
    """Date ``path`` and everything in it ``seconds`` back."""
    when = time.time() - seconds
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.utime(Path(folder) / name, (when, when), follow_symlinks=False)
    os.utime(path, (when, when))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Project, dict[str, Path]]]:
    """Real build dirs, made once (each a CMake configure and a Ninja build of the probe)."""
    project = Project(tmp_path_factory.mktemp("clean"))
    older = project.build(GGML_NATIVE="ON")
    age(older.build_dir, 7200)
    newest = project.build()
    # a build dir of upstream's tests alone (a tree beside the workdir, an older --upstream-tests),
    # made after the binaries': it holds test programs, no llama-server
    tests = project.build(LLAMA_BUILD_TESTS="ON", build=False)
    local = project.build(local=True)
    failed = project.build(LLAMA_OPENSSL="ON", build=False)
    (failed.build_dir / STAMP_NAME).unlink()  # as a configure that failed its checks leaves it
    age(failed.build_dir, UNSTAMPED_GRACE + 60)
    fresh = project.build(LLAMA_BUILD_UI="ON", build=False)
    (fresh.build_dir / STAMP_NAME).unlink()  # no stamp yet: as a configure under way
    other_tree = project.root / ".deps" / "other-llama.cpp"
    shutil.copytree(PROBE, other_tree)
    other = project.build(source=other_tree)
    notes = project.settings.build_root / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n", encoding="utf-8")
    archives = project.settings.cache_dir / "archives"
    (archives / "quarantine").mkdir(parents=True)
    # a test-bed built under the cache dir names the sdist it was made from: its archive is kept
    bed = project.settings.cache_dir / "testbed" / "upstream-0123456789abcdef.git"
    bed.mkdir(parents=True)
    write_manifest(
        bed, LLAMA_CPP_PYTHON[:1], {LLAMA_CPP_PYTHON[0].version: "a" * 40}, {LLAMA_CPP_PYTHON[0].version: None}
    )
    for digest in (MAPPED, "b" * 64, LLAMA_CPP_PYTHON[0].sha256):
        (archives / f"{digest}.archive").write_bytes(b"x" * 1000)
        (archives / f"{digest}.lock").write_bytes(b"")
    (archives / "quarantine" / f"{'c' * 64}-src.tar.gz").write_bytes(b"y" * 500)
    yield (
        project,
        {
            "older": older.build_dir,
            "newest": newest.build_dir,
            "tests": tests.build_dir,
            "local": local.build_dir,
            "failed": failed.build_dir,
            "fresh": fresh.build_dir,
            "other": other.build_dir,
            "notes": notes,
        },
    )


def test_dry_run_lists_each_path_with_its_size_and_why_and_removes_nothing(
    built: tuple[Project, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    project, dirs = built
    assert len({d.name for d in dirs.values()}) == len(dirs)
    before = sorted(p.name for p in project.settings.build_root.iterdir())

    assert clean_main(project.env, root=project.root, dry_run=True, json=True) == 0
    report = json.loads(capsys.readouterr().out)
    removed = {Path(e["path"]): e for e in report["remove"]}
    kept = {Path(e["path"]): e for e in report["keep"]}
    archives = project.settings.cache_dir / "archives"
    assert set(removed) == {
        dirs["older"],
        dirs["local"],
        dirs["failed"],
        archives / f"{'b' * 64}.archive",
        archives / f"{'b' * 64}.lock",
        archives / "quarantine" / f"{'c' * 64}-src.tar.gz",
    }
    assert set(kept) == {
        dirs["newest"],
        dirs["tests"],
        dirs["fresh"],
        dirs["other"],
        dirs["notes"],
        archives / f"{MAPPED}.archive",
        archives / f"{LLAMA_CPP_PYTHON[0].sha256}.archive",
    }
    assert "older cpu build of the prepared tree" in removed[dirs["older"]]["why"]
    assert dirs["newest"].name in removed[dirs["older"]]["why"]
    assert "(--workdir-as-is)" in removed[dirs["local"]]["why"]
    assert "no build stamp" in removed[dirs["failed"]]["why"]
    assert "the newest cpu build of the prepared tree" in kept[dirs["newest"]]["why"]
    sdist = kept[archives / f"{LLAMA_CPP_PYTHON[0].sha256}.archive"]["why"]
    assert f"the {LLAMA_CPP_PYTHON[0].version} sdist the test-bed upstream-0123456789abcdef.git" in sdist
    # the tests' build dir is newer, and kept beside the binaries' build, not instead of it
    assert "the newest cpu tests build of the prepared tree" in kept[dirs["tests"]]["why"]
    assert "perhaps a configure under way" in kept[dirs["fresh"]]["why"]
    assert "other-llama.cpp" in kept[dirs["other"]]["why"]
    assert "not a build dir" in kept[dirs["notes"]]["why"]
    # sizes are what is on disk: a real build dir holds its binaries
    server = dirs["older"] / "bin" / "llama-server"
    assert removed[dirs["older"]]["size"] > server.stat().st_size > 0
    assert removed[archives / "quarantine" / f"{'c' * 64}-src.tar.gz"]["size"] == 500
    assert report["size"] == sum(e["size"] for e in report["remove"])
    assert report["dry_run"] is True

    assert clean_main(project.env, root=project.root, dry_run=True) == 0
    text = capsys.readouterr().out
    assert text.startswith("would remove 6 path(s), ")
    assert f"  .deps/llama-build/{dirs['older'].name}  " in text
    assert "next: `invoke clean` removes them" in text
    assert sorted(p.name for p in project.settings.build_root.iterdir()) == before
    assert all(p.exists() for p in removed)


def test_a_build_dir_a_process_works_in_is_kept(built: tuple[Project, dict[str, Path]]) -> None:
    project, dirs = built
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=dirs["local"])
    try:
        plan = plan_clean(project.settings)
        kept = {e.path: e.why for e in plan.keep}
        assert kept[dirs["local"]].startswith(f"in use by process {child.pid} (a cpu build of .deps/llama.cpp as ")
        assert dirs["local"] not in {e.path for e in plan.remove}
    finally:
        child.kill()
        child.wait()


def test_clean_removes_what_the_dry_run_listed_and_keeps_the_rest(built: tuple[Project, dict[str, Path]]) -> None:
    project, dirs = built
    listed = plan_clean(project.settings)
    done = clean(project.settings, Console(quiet=True), dry_run=False)
    assert [e.path for e in done.remove] == [e.path for e in listed.remove]
    assert not any(e.path.exists() for e in listed.remove)
    assert all(e.path.exists() for e in listed.keep)
    assert (dirs["newest"] / "bin" / "llama-server").is_file()
    assert project.workdir.joinpath("CMakeLists.txt").is_file()
    # the kept build still builds without configuring again
    again = project.build()
    assert again.build_dir == dirs["newest"]
    assert plan_clean(project.settings).remove == ()

    # the other workdir goes: its build is one of a tree that no longer exists
    shutil.rmtree(project.root / ".deps" / "other-llama.cpp")
    plan = plan_clean(project.settings)
    assert [(e.path, e.why) for e in plan.remove] == [
        (dirs["other"], "a cpu build of .deps/other-llama.cpp, which no longer exists")
    ]


def test_only_dirs_a_build_made_go_never_the_workdir_even_with_a_cmake_cache(tmp_path: Path) -> None:
    """A build root that holds the workdir and the cache (build_root = ".deps"): an in-tree CMake
    build in the workdir and someone's own CMake dir stay; a stampless dir named as a build names
    its dir goes."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[tool.skippy]\nbuild_root = ".deps"\n', encoding="utf-8")
    settings = Settings.load(root, {"PATH": os.defpath})
    assert settings.build_root == settings.workdir.parent == settings.cache_dir.parent
    made = {}
    for name in ("llama.cpp", "mine", "cpu-0123456789", "cache"):
        made[name] = settings.build_root / name
        made[name].mkdir(parents=True)
        (made[name] / "CMakeCache.txt").write_text("CMAKE_GENERATOR:INTERNAL=Ninja\n", encoding="utf-8")
        age(made[name], UNSTAMPED_GRACE + 60)
    # a workdir named as a build names its dir is still the workdir
    as_workdir = Settings.load(root, {"PATH": os.defpath, "LLAMA_WORKDIR": str(made["cpu-0123456789"])})
    plan = plan_clean(as_workdir, in_use={})
    assert plan.remove == ()
    assert {e.path.name: e.why for e in plan.keep}["cpu-0123456789"] == "the workdir, never removed"

    plan = plan_clean(settings, in_use={})
    assert [e.path for e in plan.remove] == [made["cpu-0123456789"]]
    kept = {e.path.name: e.why for e in plan.keep}
    assert kept["llama.cpp"] == "the workdir, never removed"
    assert kept["cache"] == "the cache, never removed"
    assert kept["mine"] == "a CMake build dir no build made (a build names its dir <backend>-<digest>)"
    clean(settings, Console(quiet=True), dry_run=False)
    assert sorted(p.name for p in settings.build_root.iterdir()) == ["cache", "llama.cpp", "mine"]


def test_the_shared_store_of_archive_imports_is_listed_kept_with_its_size_and_how_to_delete_it(
    tmp_path: Path,
) -> None:
    from skippy.queue.archives import shared_store

    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text("[tool.skippy]\n", encoding="utf-8")
    settings = Settings.load(root, {"PATH": os.defpath})
    assert all(e.path != shared_store(settings) for e in plan_clean(settings, in_use={}).keep)
    store = shared_store(settings)
    (store / "objects").mkdir(parents=True)
    (store / "objects" / "pack").write_bytes(b"x" * 4096)
    plan = plan_clean(settings, in_use={})
    kept = {e.path: e for e in plan.keep}
    assert store in kept and kept[store].size >= 4096
    assert f"rm -rf {settings.relative(store)}" in kept[store].why
    clean(settings, Console(quiet=True), dry_run=False)
    assert (store / "objects" / "pack").is_file(), "listed, never removed"
