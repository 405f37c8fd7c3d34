"""The tree upstream's tests move between the queue's commits: real git, no build."""

from __future__ import annotations

import shutil
from pathlib import Path

from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.flows.upstream_tests.aside import AsideTree, queue_commits
from tests.gitfixtures import Upstream, hermetic_git_env


def _workdir(tmp_path: Path) -> tuple[Upstream, list[str]]:
    env = hermetic_git_env(tmp_path / "home")
    work = Upstream.create(tmp_path / "proj" / ".deps" / "llama.cpp", env)
    base = work.commit("Import upstream", {"src/a.c": "int a;\n"})
    one = work.commit("core: one\n\nwhy\n\nSkippy-Patch: core/0001-one.patch", {"src/b.c": "int b;\n"})
    # a commit without a trailer (a maintainer's own) is named by its SHA
    two = work.commit("mine", {"src/a.c": "int a2;\n"})
    three = work.commit(
        "gemma3: x\n\nSkippy-Patch: model_support/0001-x.patch", {"src/b.c": None, "tests/test-x.cpp": "int main;\n"}
    )
    return work, [base, one, two, three]


def test_commits_are_named_by_their_trailer_oldest_first(tmp_path: Path) -> None:
    work, (base, one, two, three) = _workdir(tmp_path)
    commits = queue_commits(Repo(work.path, work.env), base, three)
    assert [c.sha for c in commits] == [one, two, three]
    assert [c.label for c in commits] == ["core/0001-one.patch", f"commit {two[:12]}", "model_support/0001-x.patch"]


def test_the_tree_moves_between_commits_and_leaves_the_workdir_alone(tmp_path: Path) -> None:
    work, (base, one, _two, three) = _workdir(tmp_path)
    (tmp_path / "proj" / "pyproject.toml").write_text("[tool.skippy]\n", encoding="utf-8")
    settings = Settings.load(tmp_path / "proj", work.env)
    head = (work.path / ".git" / "HEAD").read_text()
    aside = AsideTree(settings, work.path)
    tree = aside.at(three)
    assert (tree / "tests" / "test-x.cpp").is_file() and not (tree / "src" / "b.c").exists()
    assert tree.is_relative_to(settings.cache_dir)
    # back to an older commit: files the later one added are gone (git clean), changed ones restored
    aside.at(one)
    assert not (tree / "tests" / "test-x.cpp").exists()
    assert (tree / "src" / "b.c").read_text() == "int b;\n"
    assert (tree / "src" / "a.c").read_text() == "int a;\n"
    # no object was copied: the clone borrows the workdir's
    assert (tree / ".git" / "objects" / "info" / "alternates").is_file()
    # the workdir is where it was
    assert (work.path / ".git" / "HEAD").read_text() == head
    assert Repo(work.path, work.env).out("status", "--porcelain") == ""
    # a tree whose borrowed objects are gone (the workdir was made again) is made again
    (tree / ".git" / "objects" / "info" / "alternates").write_text(str(tmp_path / "gone") + "\n")
    shutil.rmtree(tree / "src")
    assert (aside.at(base) / "src" / "a.c").read_text() == "int a;\n"
    # another workdir gets a tree of its own
    assert AsideTree(settings, tmp_path / "other").path != aside.path


def test_a_tree_that_is_its_base_has_nothing_to_bisect(tmp_path: Path) -> None:
    """An empty queue (or one whose commits were all dropped): a test that failed only there cannot be
    blamed on a patch; the blame says why instead of guessing."""
    from typing import Any, cast

    from skippy.flows.upstream_tests.bisect import _attribute

    work, (base, *_rest) = _workdir(tmp_path)
    nothing = cast(Any, None)  # neither the tree nor the aside is reached
    blames = _attribute(
        nothing,
        nothing,
        Repo(work.path, work.env),
        span=(base, base),
        broken=["test-x"],
        own=(),
        tip={},
        budget=60.0,
    )
    assert blames["test-x"].patch is None
    assert "nothing to bisect" in str(blames["test-x"].gave_up)
