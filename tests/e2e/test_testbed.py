"""The real llama.cpp test-bed: three linear upstream commits with real movement."""

from __future__ import annotations

import itertools
import os
import tarfile
from pathlib import Path

import pytest

from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import archives
from tooling.testbed import LLAMA_CPP_PYTHON, LlamaTestbed, cache_key

pytestmark = pytest.mark.e2e

VERSIONS = ("0.3.34", "0.3.35", "0.3.36")


def repo_of(testbed: LlamaTestbed) -> Repo:
    return Repo(testbed.path, env={"PATH": os.environ.get("PATH", os.defpath)})


def test_three_linear_commits_on_master(testbed: LlamaTestbed) -> None:
    repo = repo_of(testbed)
    assert testbed.versions == VERSIONS
    assert repo.out("rev-parse", "--is-bare-repository") == "true"
    first, second, third = (testbed.commits[v] for v in VERSIONS)
    assert repo.rev_parse(f"refs/heads/{testbed.branch}") == third
    assert repo.out("rev-list", "--reverse", "--parents", testbed.branch).splitlines() == [
        first,
        f"{second} {first}",
        f"{third} {second}",
    ]
    for version in VERSIONS:
        assert repo.rev_parse(f"refs/tags/{testbed.tag(version)}") == testbed.commits[version]


def test_messages_name_the_real_upstream_commits(testbed: LlamaTestbed) -> None:
    repo = repo_of(testbed)
    assert testbed.upstream["0.3.34"] == "e3546c7948e3af463d0b401e6421d5a4c2faf565"
    assert testbed.upstream["0.3.35"] == "4df29be4f4c3673f428170fda944a5b19f743bb8"
    later = testbed.upstream["0.3.36"]
    assert later is not None and later not in (testbed.upstream["0.3.34"], testbed.upstream["0.3.35"])
    for source in LLAMA_CPP_PYTHON:
        message = repo.out("log", "-1", "--format=%B", testbed.commits[source.version])
        trailers = archives.parse_trailers(message)
        assert trailers["Upstream-Commit"] == testbed.upstream[source.version]
        assert trailers["Archive-SHA256"] == source.sha256
        assert f"llama-cpp-python {source.version}" in message.splitlines()[0]


def test_trees_differ_with_real_upstream_movement(testbed: LlamaTestbed) -> None:
    repo = repo_of(testbed)
    trees = [repo.out("rev-parse", f"{testbed.commits[v]}^{{tree}}") for v in VERSIONS]
    assert len(set(trees)) == 3
    for version in VERSIONS:
        listing = repo.out("ls-tree", "--name-only", testbed.commits[version], "--", "src/llama-model.cpp")
        assert listing == "src/llama-model.cpp"
        model = repo.out("cat-file", "-p", f"{testbed.commits[version]}:src/llama-model.cpp")
        assert "llm_build" in model or "LLM_ARCH" in model
    for older, newer in itertools.pairwise(VERSIONS):
        stat = repo.out("diff", "--shortstat", testbed.commits[older], testbed.commits[newer])
        assert "files changed" in stat
        changed = repo.out("diff", "--name-only", testbed.commits[older], testbed.commits[newer]).splitlines()
        assert any(name.startswith(("src/", "ggml/")) for name in changed)
    # the file the brief names moves across the three versions
    blobs = {repo.out("rev-parse", f"{testbed.commits[v]}:src/llama-model.cpp") for v in VERSIONS}
    assert len(blobs) >= 2


def test_commits_are_deterministic_and_cached_by_digest(testbed: LlamaTestbed) -> None:
    assert testbed.key == cache_key(LLAMA_CPP_PYTHON)
    assert testbed.path.name == f"upstream-{testbed.key}.git"
    dates = repo_of(testbed).out("log", "--format=%an <%ae> %ad", "--date=raw", testbed.branch).splitlines()
    assert dates == [
        "skippy archive import <skippy@localhost> 1704240000 +0000",
        "skippy archive import <skippy@localhost> 1704153600 +0000",
        "skippy archive import <skippy@localhost> 1704067200 +0000",
    ]
    assert not [p for p in testbed.path.parent.iterdir() if p.name.startswith(".build-")]


def test_the_archive_tree_is_the_real_upstream_tree(testbed: LlamaTestbed, pinned_sdist: Path, tmp_path: Path) -> None:
    """The 0.3.35 sdist ships the vendored commit's own git objects: our tree must equal its tree."""
    source = LLAMA_CPP_PYTHON[1]
    archive = pinned_sdist
    prefix = f"{source.top}/.git/modules/vendor/llama.cpp/objects/"
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    real = Repo(tmp_path / "real.git", env=env)
    Repo(tmp_path, env=env).git("init", "--quiet", "--bare", real.path)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix) and member.isreg():
                member.name = "objects/" + member.name.removeprefix(prefix)
                members.append(member)
        # only the object store: the sdist's own git config is not ours to read
        tar.extractall(real.path, members=members, filter="data")
    assert members
    ours = repo_of(testbed).out("rev-parse", f"{testbed.commits[source.version]}^{{tree}}")
    assert real.out("rev-parse", f"{source.upstream_sha}^{{tree}}") == ours


#: the import of llama-cpp-python 0.3.35 for the pin: the same SHA on every machine
PINNED_IMPORT = "f4a8dff8289e4dd3d0aa174d04c32e18bb69656c"
#: the tree of upstream 4df29be4f4c3 itself
PINNED_TREE = "5664c498dbf10292801ec319c7d677ec73c562d9"


def test_pinned_archive_import_is_deterministic_and_real(testbed: LlamaTestbed, tmp_path: Path) -> None:
    """The project's own mapping (pypi-sdist 0.3.35) imported into a fresh repo."""
    root = Path(__file__).resolve().parents[2]
    settings = Settings.load(root, dict(os.environ))
    pin = settings.pin_file.read_text(encoding="utf-8").strip()
    repo = Repo(tmp_path / "fresh", env={"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path)})
    repo.path.mkdir()
    repo.git("init", "--quiet")
    sha = archives.import_archive(settings, repo, pin, Console(quiet=True))
    assert sha == PINNED_IMPORT
    assert repo.out("rev-parse", f"{sha}^{{tree}}") == PINNED_TREE
    # the test-bed's 0.3.35 commit holds the very same tree
    assert repo_of(testbed).out("rev-parse", f"{testbed.commits['0.3.35']}^{{tree}}") == PINNED_TREE
