"""What a stopped `git am` is told as: conflicts, or (no markers) the failing hunk; `invoke status`
agreeing with `invoke prepare`; `--force` naming what it reverted.  Real git, local fixtures."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import pytest

from skippy.core.errors import ConflictError
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.am_output import failed_paths, without_am_hints
from skippy.queue.prepare import Target, prepare, triage_target
from skippy.queue.session import resume
from skippy.queue.status import compute_status
from skippy.queue.triage import TriageReport
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)
GGML = "# ggml\nset(A 1)\nset(B 2)\nset(C 3)\nset(D 4)\nset(E 5)\n"
PATCH = "core/0001-build-two-cmake-files.patch"


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


@pytest.fixture
def unmergeable(project: Project) -> Project:
    """A patch of CMakeLists.txt and ggml/CMakeLists.txt whose ggml preimage blob is unknown (made on
    another tree): it applies on the pin, but once upstream moves its context git cannot 3-way merge
    it, so `git am --3way` stops with no conflict markers."""
    up = project.upstream
    pin = up.commit("ggml: its own CMakeLists.txt", {"ggml/CMakeLists.txt": GGML})
    project.pin(pin)
    top = up.read("CMakeLists.txt", pin)
    data = project.patch(
        pin,
        "build: two cmake files",
        {"CMakeLists.txt": top + "# downstream\n", "ggml/CMakeLists.txt": GGML.replace("set(C 3)", "set(C 33)")},
    ).decode()
    forged = re.sub(
        r"(diff --git a/ggml/CMakeLists.txt b/ggml/CMakeLists.txt\n)index [0-9a-f]+\.\.[0-9a-f]+",
        r"\1index 1111111..2222222",
        data,
    )
    assert forged != data
    project.add_patch("core", PATCH.split("/", 1)[1], forged.encode())
    prepare(project.settings(), Target.pinned(), console=QUIET)
    up.commit("ggml: B moves", {"ggml/CMakeLists.txt": GGML.replace("set(B 2)", "set(B 22)")})
    return project


def test_git_errors_are_read_with_their_whole_paths() -> None:
    plain = (
        "error: patch failed: CMakeLists.txt:1\n"
        "error: CMakeLists.txt: patch does not apply\n"
        "error: patch failed: ggml/CMakeLists.txt:3\n"
        "error: ggml/CMakeLists.txt: patch does not apply\n"
        "error: tools/rpc/CMakeLists.txt: does not exist in index\n"
    )
    assert failed_paths(plain) == ("CMakeLists.txt", "ggml/CMakeLists.txt", "tools/rpc/CMakeLists.txt")
    # the 3-way fallback names what it could not merge: that, not what the plain apply missed first
    output = (
        plain + "error: sha1 information is lacking or useless (ggml/CMakeLists.txt).\n"
        "error: could not build fake ancestor\n"
        "hint: Use 'git am --show-current-patch=diff' to see the failed patch\n"
        'When you have resolved this problem, run "git am --continue".\n'
        'If you prefer to skip this patch, run "git am --skip" instead.\n'
        'To restore the original branch and stop patching, run "git am --abort".\n'
    )
    assert failed_paths(output) == ("ggml/CMakeLists.txt",)
    assert failed_paths("error: sha1 information is lacking or useless (src/sub dir/a.c).") == ("src/sub dir/a.c",)
    kept = without_am_hints(output)
    assert "git am --" not in kept and "hint:" not in kept
    assert kept.splitlines()[-1] == "error: could not build fake ancestor"


def test_no_conflict_markers_shows_the_failing_hunk_and_status_agrees_with_prepare(unmergeable: Project) -> None:
    settings = unmergeable.settings()
    with pytest.raises(ConflictError) as info:
        prepare(settings, Target.latest(), console=QUIET, interactive=True)
    err = info.value
    assert err.what.startswith(f"{PATCH} does not apply and git could not merge it: no conflict markers")
    assert err.what.endswith("(failed: ggml/CMakeLists.txt)")
    details = err.details or ""
    assert "the failing hunk(s):\ndiff --git a/ggml/CMakeLists.txt b/ggml/CMakeLists.txt" in details
    assert "-set(C 3)\n+set(C 33)" in details
    assert "diff --git a/CMakeLists.txt b/CMakeLists.txt" not in details  # that file applied
    # skippy's commands only: none of git's own next steps, no "resolve the conflicts" without any
    rendered = err.render()
    assert "git am --continue" not in rendered and "git am --skip" not in rendered
    assert "git am --abort" not in rendered
    assert "resolve the conflicts" not in (err.next_step or "")
    assert "invoke prepare --continue" in (err.next_step or "")
    assert "by hand in ggml/CMakeLists.txt" in (err.next_step or "")
    # triage names the path that failed, whole
    assert isinstance(err.triage, TriageReport)
    (verdict,) = err.triage.verdicts
    assert (verdict.patch, verdict.verdict, verdict.paths) == (PATCH, "preimage-missing", ("ggml/CMakeLists.txt",))
    # the session is stopped with a clean tree
    wdir = unmergeable.workdir
    assert run_git(wdir, "status", "--porcelain", "--untracked-files=no") == ""
    assert wd.in_progress(wdir / ".git") is not None
    # status says so, and names the commands prepare names when it refuses
    status = compute_status(settings)
    assert status.interrupted == (
        f"a conflict session is stopped at {PATCH}: the patch does not apply and git wrote no conflict markers"
    )
    with pytest.raises(ConflictError) as refused:
        prepare(settings, Target.latest(), console=QUIET, interactive=True)
    assert refused.value.what == f"a conflict session is in progress in .deps/llama.cpp (stopped at {PATCH})"
    assert refused.value.next_step == err.next_step
    assert status.would.endswith(f"next: {err.next_step}")
    assert "--force" in status.would
    # and the commands work: apply what fits, make the failing change by hand, stage, continue
    assert "applied none of this patch" in (err.next_step or "")
    assert "am --show-current-patch=diff | git -C .deps/llama.cpp apply --reject" in (err.next_step or "")
    genv = hermetic_git_env(Path(os.environ["HOME"]))
    shown = subprocess.run(
        ["git", "-C", str(wdir), "am", "--show-current-patch=diff"], env=genv, capture_output=True, check=True
    )
    rejected = subprocess.run(
        ["git", "-C", str(wdir), "apply", "--reject"], env=genv, input=shown.stdout, capture_output=True, check=False
    )
    assert rejected.returncode != 0 and (wdir / "ggml" / "CMakeLists.txt.rej").is_file()
    (wdir / "ggml" / "CMakeLists.txt.rej").unlink()
    moved = (wdir / "ggml" / "CMakeLists.txt").read_text(encoding="utf-8")
    (wdir / "ggml" / "CMakeLists.txt").write_text(moved.replace("set(C 3)", "set(C 33)"), encoding="utf-8")
    run_git(wdir, "add", "CMakeLists.txt", "ggml/CMakeLists.txt")
    report = resume(settings, "continue", console=QUIET)
    assert report.action == "resumed"
    assert (wdir / "ggml" / "CMakeLists.txt").read_text(encoding="utf-8") == GGML.replace(
        "set(B 2)", "set(B 22)"
    ).replace("set(C 3)", "set(C 33)")
    assert (wdir / "CMakeLists.txt").read_text(encoding="utf-8").endswith("# downstream\n")


def test_on_ci_the_error_names_the_path_git_could_not_apply_without_gits_hints(unmergeable: Project) -> None:
    with pytest.raises(ConflictError) as info:
        prepare(unmergeable.settings(CI="true"), Target.latest(), console=QUIET)
    assert info.value.what == (
        f"{PATCH} does not apply: build: two cmake files "
        "(git could not apply it to ggml/CMakeLists.txt; no conflict markers)"
    )
    assert "git am --" not in (info.value.details or "")
    assert "sha1 information is lacking or useless (ggml/CMakeLists.txt)" in (info.value.details or "")


def test_status_during_a_session_with_markers_names_the_conflicts(project: Project) -> None:
    up = project.upstream
    pin = up.commits[1]
    readme = up.read("README.md", pin)
    project.add_patch(
        "core", "0001-core-readme.patch", project.patch(pin, "core: readme", {"README.md": readme + "downstream\n"})
    )
    settings = project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    up.commit("readme: upstream too", {"README.md": readme + "upstream\n"})
    with pytest.raises(ConflictError) as info:
        prepare(settings, Target.latest(), console=QUIET, interactive=True)
    assert info.value.what.endswith("the conflict is waiting in .deps/llama.cpp (conflicts in README.md)")
    assert (info.value.next_step or "").startswith("resolve the conflicts in README.md")
    assert "git am --continue" not in info.value.render()
    status = compute_status(settings)
    assert status.interrupted == "a conflict session is stopped at core/0001-core-readme.patch: conflicts in README.md"
    assert status.would.endswith(f"next: {info.value.next_step}")


def test_force_reports_the_files_it_reverted(queued_project: Project) -> None:
    settings = queued_project.settings()
    first = prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    (wdir / "README.md").write_text("my edit\n", encoding="utf-8")
    (wdir / "notes.txt").write_text("mine\n", encoding="utf-8")
    out = io.StringIO()
    report = prepare(settings, Target.pinned(), console=Console(env={}, stream=out), force=True)
    assert report.patched_sha == first.patched_sha
    assert report.reverted == ("README.md", "notes.txt")
    assert report.backup_ref is not None
    note = (
        f"--force reverted 1 file(s): README.md; removed 1 untracked file(s): notes.txt "
        f"(yours are saved under {report.backup_ref})"
    )
    assert note in report.notes
    assert note in out.getvalue()
    assert "0 file(s) differ; --force reverted 2 file(s) before" in out.getvalue()
    assert report.as_dict()["reverted"] == ["README.md", "notes.txt"]
    assert run_git(wdir, "show", f"{report.backup_ref}:README.md") == "my edit\n"


def test_triage_names_the_path_git_could_not_merge_not_the_first_one_that_failed(unmergeable: Project) -> None:
    """Both files miss their context now, but only ggml/CMakeLists.txt cannot be merged: the
    top-level CMakeLists.txt (git's first "patch failed" line) is not the path to blame."""
    up = unmergeable.upstream
    up.commit("cmake: project line", {"CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(llama C CXX)\n"})
    report = triage_target(unmergeable.settings(), Target.latest(), console=QUIET)
    (verdict,) = report.verdicts
    assert (verdict.verdict, verdict.paths) == ("preimage-missing", ("ggml/CMakeLists.txt",))
    assert "paths: ggml/CMakeLists.txt\n" in report.render() + "\n"
