"""Steps of prepare read and tested alone, on real git: apply, recognize, resolve, the workdir's shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skippy.core.errors import ConflictError, SettingsError, WorkdirError
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.apply import apply_lanes
from skippy.queue.checkout import check_is_our_repo
from skippy.queue.model import load_queue
from skippy.queue.prepare import Target, prepare
from skippy.queue.recover import recognize
from skippy.queue.run import Run
from skippy.queue.upstream import resolve_commit
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def test_apply_lanes_names_the_failing_patch_and_leaves_head_as_it_was(project: Project) -> None:
    up = project.upstream
    pin = up.commits[1]
    project.add_patch("core", "0001-core-a.patch", project.patch(pin, "core: a", {"src/a.h": "a\n"}))
    readme = up.read("README.md", pin)
    project.add_patch(
        "core",
        "0002-core-readme.patch",
        project.patch(pin, "core: readme", {"README.md": readme.replace("fixture", "fork")}),
    )
    prepare(project.settings(), Target.pinned(), console=QUIET)
    repo = Run(project.settings(), QUIET).repo()
    head = repo.head()
    # upstream rewrites the line the second patch changes
    up.commit("readme: rewrite", {"README.md": "# another title\n"})
    run_git(project.workdir, "fetch", "--quiet", str(up.path), "master")
    run_git(project.workdir, "checkout", "--quiet", "--detach", "FETCH_HEAD")
    base = repo.head()
    queue = load_queue(project.settings().patch_dir)
    with pytest.raises(ConflictError) as info:
        apply_lanes(Run(project.settings(), QUIET), queue, repo, project.workdir / ".git", "the workdir")
    assert "core/0002-core-readme.patch does not apply: core: readme" in info.value.what
    assert "README.md" in info.value.what
    # the am was aborted: HEAD is where it was, nothing in progress, no file changed
    assert repo.head() == base != head
    assert wd.in_progress(project.workdir / ".git") is None
    assert run_git(project.workdir, "status", "--porcelain") == ""


def test_recognize_tells_this_queue_on_its_base_from_local_commits(queued_project: Project) -> None:
    settings = queued_project.settings()
    report = prepare(settings, Target.pinned(), console=QUIET)
    run = Run(settings, QUIET)
    repo = run.repo()
    git_dir = queued_project.workdir / ".git"
    queue = load_queue(settings.patch_dir)
    found = recognize(run, queue, repo, git_dir)
    assert found is not None
    assert (found.upstream_sha, found.patched_sha, found.queue_digest) == (
        report.upstream_sha,
        report.patched_sha,
        report.queue_digest,
    )
    assert run.notes == [
        f"no stamp: recognized HEAD {report.patched_sha[:12]} as this queue on {report.upstream_sha[:12]}"
    ]
    # one commit more on top: not this queue's patched commit
    (queued_project.workdir / "mine.txt").write_text("x\n", encoding="utf-8")
    run_git(queued_project.workdir, "add", "mine.txt")
    run_git(queued_project.workdir, "commit", "--quiet", "-m", "mine")
    assert recognize(Run(settings, QUIET), queue, repo, git_dir) is None


def test_resolve_commit_offline_without_an_archive_says_so(project: Project) -> None:
    settings = project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    run = Run(settings, QUIET, offline=True)
    missing_sha = "0" * 40
    with pytest.raises(SettingsError) as info:
        resolve_commit(run, run.repo(), missing_sha)
    assert info.value.what == (
        f"commit {missing_sha} is not in the upstream {settings.upstream_url} "
        "(offline: no archive is configured for it)"
    )
    # a commit the checkout has resolves offline, to itself
    pin = project.upstream.commits[1]
    assert resolve_commit(run, run.repo(), pin) == (pin, pin, "git")
    assert resolve_commit(run, run.repo(), pin[:10]) == (pin, pin, "git")


def test_check_is_our_repo_refuses_a_folder_of_an_enclosing_repository(project: Project) -> None:
    run_git(project.root, "init", "--quiet")
    project.workdir.mkdir(parents=True)
    run = Run(project.settings(), QUIET)
    with pytest.raises(WorkdirError, match=r"workdir \.deps/llama\.cpp exists but is not a git checkout of its own"):
        check_is_our_repo(run, run.repo())
