"""Shared fixtures: a hermetic seal around every test, fixture upstreams and projects."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from skippy.core.settings import Settings

# every tier: with CI set, a test that cannot run (a skip of any kind) fails instead of passing
# silently; .ci/setup installs what the tests need, so on CI nothing has a reason to skip
from tests.e2e.needs import pytest_runtest_makereport  # noqa: F401 - a hook, found by name
from tests.gitfixtures import Upstream, hermetic_git_env, make_patch, pyproject

MODEL_CPP = "".join(f"// model line {i}\n" for i in range(1, 41))
ARCH_CPP = "".join(f"// arch line {i}\n" for i in range(1, 21))


@pytest.fixture(autouse=True)
def hermetic_seal(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary HOME with no git config, UTC, and no CI variables leaking in."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setenv("TZ", "UTC")
    # CI runners set CI/GITHUB_ACTIONS; a test that wants the CI behaviour sets them itself.
    for var in (
        *("LLAMA_UPSTREAM_URL", "LLAMA_WORKDIR", "LLAMA_PIN_FILE", "LLAMA_PATCH_DIR"),
        *("CI", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "SKIPPY_SKIP_UNAVAILABLE"),
    ):
        monkeypatch.delenv(var, raising=False)
    yield home


@dataclass
class Project:
    """A downstream project: pyproject.toml with [tool.skippy], a pin and a queue."""

    root: Path
    upstream: Upstream
    scratch: Path
    env: dict[str, str]

    @property
    def patches(self) -> Path:
        return self.root / "queue" / "patches"

    @property
    def workdir(self) -> Path:
        return self.root / ".deps" / "llama.cpp"

    def settings(self, **env: str) -> Settings:
        merged = dict(self.env)
        merged.update(env)
        return Settings.load(self.root, merged)

    def pin(self, sha: str) -> None:
        (self.root / "queue" / "upstream.txt").write_text(sha + "\n", encoding="utf-8")

    def add_patch(self, lane: str, name: str, data: bytes) -> Path:
        folder = self.patches if lane == "core" else self.patches / lane
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(data)
        if lane != "core":
            series = folder / "series"
            entries = series.read_text(encoding="utf-8").split() if series.exists() else []
            if name not in entries:
                entries.append(name)
            series.write_text("".join(e + "\n" for e in entries), encoding="utf-8")
        return path

    def patch(self, base: str, subject: str, files: dict[str, str | None]) -> bytes:
        return make_patch(self.upstream, self.scratch, base, subject, files)


def build_upstream(path: Path, env: dict[str, str]) -> Upstream:
    up = Upstream.create(path, env)
    up.commit(
        "initial tree",
        {
            "CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(llama)\n",
            "README.md": "# llama.cpp fixture\n",
            "src/llama-model.cpp": MODEL_CPP,
            "src/llama-arch.cpp": ARCH_CPP,
            ".gitignore": "/build*/\n*.o\n",
        },
    )
    up.commit("readme: mention the fixture", {"README.md": "# llama.cpp fixture\n\nupstream moves\n"})
    up.commit("arch: add a line", {"src/llama-arch.cpp": ARCH_CPP + "// arch line 21\n"})
    return up


@pytest.fixture
def git_env(hermetic_seal: Path) -> dict[str, str]:
    return hermetic_git_env(hermetic_seal)


@pytest.fixture
def upstream(tmp_path: Path, git_env: dict[str, str]) -> Upstream:
    return build_upstream(tmp_path / "upstream", git_env)


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream, hermetic_seal: Path) -> Project:
    root = tmp_path / "project"
    (root / "queue" / "patches").mkdir(parents=True)
    (root / "pyproject.toml").write_text(pyproject(str(upstream.path)), encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(hermetic_seal)}
    proj = Project(root=root, upstream=upstream, scratch=tmp_path / "scratch", env=env)
    proj.pin(upstream.commits[1])
    return proj


@pytest.fixture
def queued_project(project: Project) -> Project:
    """A project whose queue has patches in all three lanes, pinned to the second upstream commit."""
    base = project.upstream.commits[1]
    model = project.upstream.read("src/llama-model.cpp", base)
    p1 = project.patch(
        base, "core: add a hook point", {"src/llama-model.cpp": model.replace("line 5\n", "line 5\nHOOK\n")}
    )
    project.add_patch("core", "0001-core-add-a-hook-point.patch", p1)
    p2 = project.patch(base, "core: add provenance", {"src/provenance.h": "#define SKIPPY 1\n"})
    project.add_patch("core", "0002-core-add-provenance.patch", p2)
    p3 = project.patch(
        base, "gemma3: runtime adaptation", {"src/llama-model.cpp": model.replace("line 30\n", "line 30\nGEMMA\n")}
    )
    project.add_patch("model_support", "0001-gemma3-runtime-adaptation.patch", p3)
    p4 = project.patch(base, "generated: family llama", {"src/generated/llama.inc": "// generated llama\n"})
    project.add_patch("generated", "0001-family-llama.patch", p4)
    return project
