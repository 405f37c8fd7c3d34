"""Conflict triage and resumable conflict sessions, through real conflicts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skippy.core.errors import ConflictError, DirtyWorkdirError
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare, triage_target
from skippy.queue.session import resume
from tests.conftest import MODEL_CPP, Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)

FOREIGN_PATCH = b"""From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: Elsewhere Dev <else@where.invalid>
Date: Thu, 2 May 2024 10:00:00 +0200
Subject: [PATCH] readme: made on another tree

---
 README.md | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/README.md b/README.md
index 1111111..2222222 100644
--- a/README.md
+++ b/README.md
@@ -1 +1 @@
-a line that never was upstream
+a line from another tree
--
2.39.5
"""


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def line_edit(text: str, line: int, new: str) -> str:
    return text.replace(f"// model line {line}\n", new)


@pytest.fixture
def moved(project: Project) -> tuple[Project, dict[str, str]]:
    """Pin at upstream commit 1; a queue with one patch of each triage class; upstream moves on."""
    up = project.upstream
    pin = up.commits[1]
    model = up.read("src/llama-model.cpp", pin)
    arch = up.read("src/llama-arch.cpp", up.commits[2])
    project.add_patch(
        "core", "0001-core-new-header.patch", project.patch(pin, "core: new header", {"src/new.h": "x\n"})
    )
    project.add_patch(
        "core",
        "0002-core-line-30.patch",
        project.patch(pin, "core: edit line 30", {"src/llama-model.cpp": line_edit(model, 30, "// core 30\n")}),
    )
    project.add_patch(
        "core",
        "0003-core-line-5.patch",
        project.patch(pin, "core: edit line 5", {"src/llama-model.cpp": line_edit(model, 5, "// core 5\n")}),
    )
    # upstream commit 2 added "// arch line 21": this patch makes the same change (made on the pin)
    project.add_patch(
        "model_support",
        "0001-arch-line-21.patch",
        project.patch(up.commits[0], "arch: add line 21", {"src/llama-arch.cpp": arch}),
    )
    project.add_patch("generated", "0001-family-foreign.patch", FOREIGN_PATCH)
    later = up.read("src/llama-model.cpp")
    c3 = up.commit("model: touch line 28", {"src/llama-model.cpp": line_edit(later, 28, "// upstream 28\n")})
    later = up.read("src/llama-model.cpp")
    c4 = up.commit("model: rework line 5", {"src/llama-model.cpp": line_edit(later, 5, "// upstream 5\n")})
    return project, {"pin": pin, "c3": c3, "c4": c4}


def test_triage_classifies_every_patch_and_blames_upstream(moved: tuple[Project, dict[str, str]]) -> None:
    project, shas = moved
    # no prepared workdir yet: triage clones a plain upstream checkout to work in
    report = triage_target(project.settings(), Target.latest(), console=QUIET)
    verdicts = {v.patch: v for v in report.verdicts}
    assert [v.patch for v in report.verdicts] == [
        "core/0001-core-new-header.patch",
        "core/0002-core-line-30.patch",
        "core/0003-core-line-5.patch",
        "model_support/0001-arch-line-21.patch",
        "generated/0001-family-foreign.patch",
    ]
    assert {k: v.verdict for k, v in verdicts.items()} == {
        "core/0001-core-new-header.patch": "clean",
        "core/0002-core-line-30.patch": "3way",
        "core/0003-core-line-5.patch": "conflict",
        "model_support/0001-arch-line-21.patch": "already-applied",
        "generated/0001-family-foreign.patch": "preimage-missing",
    }
    conflict = verdicts["core/0003-core-line-5.patch"]
    assert conflict.paths == ("src/llama-model.cpp",)
    # upstream commits between the pin and the target that touched the path, newest first
    assert [(b.sha, b.subject) for b in conflict.blamed] == [
        (shas["c4"][:7], "model: rework line 5"),
        (shas["c3"][:7], "model: touch line 28"),
    ]
    assert report.target == shas["c4"]
    assert report.since == shas["pin"]
    table = report.render()
    assert "upstream " + shas["c4"][:7] + " model: rework line 5" in table
    assert "summary: 1 clean, 1 3way, 1 conflict, 1 preimage-missing, 1 already-applied" in table
    data = report.as_dict()
    assert data["ok"] is False and data["counts"]["conflict"] == 1
    # nothing left half-applied: one worktree, a clean plain checkout, no am
    wdir = project.workdir
    assert run_git(wdir, "worktree", "list").count("\n") == 1
    assert run_git(wdir, "status", "--porcelain") == ""
    assert wd.in_progress(wdir / ".git") is None


def session_queue(project: Project) -> dict[str, str]:
    """p1 clean, p2 conflicts with the upstream commit added here, p3 clean."""
    up = project.upstream
    pin = up.commits[1]
    model = up.read("src/llama-model.cpp", pin)
    project.add_patch("core", "0001-core-a.patch", project.patch(pin, "core: a", {"src/a.h": "a\n"}))
    project.add_patch(
        "core",
        "0002-core-line-5.patch",
        project.patch(pin, "core: edit line 5", {"src/llama-model.cpp": line_edit(model, 5, "// core 5\n")}),
    )
    project.add_patch("generated", "0001-family-b.patch", project.patch(pin, "generated: b", {"src/b.inc": "b\n"}))
    prepare(project.settings(), Target.pinned(), console=QUIET)
    later = up.read("src/llama-model.cpp")
    c3 = up.commit("model: rework line 5", {"src/llama-model.cpp": line_edit(later, 5, "// upstream 5\n")})
    return {"pin": pin, "c3": c3}


def test_ci_aborts_cleanly_with_the_triage_table(project: Project) -> None:
    shas = session_queue(project)
    before = run_git(project.workdir, "rev-parse", "HEAD")
    with pytest.raises(ConflictError) as info:
        prepare(project.settings(CI="true"), Target.latest(), console=QUIET)
    assert "core/0002-core-line-5.patch does not apply" in info.value.what
    assert f"upstream {shas['c3'][:7]} model: rework line 5" in (info.value.details or "")
    triage = info.value.as_dict()["triage"]
    assert isinstance(triage, dict) and triage["counts"]["conflict"] == 1
    assert run_git(project.workdir, "rev-parse", "HEAD") == before
    assert wd.in_progress(project.workdir / ".git") is None


def test_session_continue_finishes_and_stamps(project: Project) -> None:
    shas = session_queue(project)
    settings = project.settings()
    wdir = project.workdir
    with pytest.raises(ConflictError) as info:
        prepare(settings, Target.latest(), console=QUIET)
    assert "the conflict is waiting in .deps/llama.cpp" in info.value.what
    assert "invoke prepare --continue" in (info.value.next_step or "")
    assert wd.in_progress(wdir / ".git") is not None
    assert "<<<<<<<" in (wdir / "src/llama-model.cpp").read_text()
    # the stopped session is not something a plain prepare walks over
    with pytest.raises(ConflictError, match="a conflict session is in progress"):
        prepare(settings, Target.latest(), console=QUIET)
    # continuing before resolving is refused
    with pytest.raises(ConflictError, match=r"still has unresolved conflicts in src/llama-model\.cpp"):
        resume(settings, "continue", console=QUIET)
    resolved = MODEL_CPP.replace("// model line 5\n", "// upstream 5 + core 5\n")
    (wdir / "src/llama-model.cpp").write_text(resolved)
    run_git(wdir, "add", "src/llama-model.cpp")
    report = resume(settings, "continue", console=QUIET)
    assert report.action == "resumed"
    assert any(
        "`invoke regenerate` writes the lanes back" in n and f"invoke pin-bump --sha {shas['c3']}" in n
        for n in report.notes
    )
    assert run_git(wdir, "log", "--format=%s", f"{shas['c3']}..HEAD").splitlines() == [
        "generated: b",
        "core: edit line 5",
        "core: a",
    ]
    assert (wdir / "src/llama-model.cpp").read_text() == resolved
    # committer date = author date for the resolved patch too
    dates = run_git(wdir, "log", "-3", "--format=%ad|%cd", "--date=raw").splitlines()
    assert all(a == c for a, c in (d.split("|") for d in dates))
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.upstream_sha == shas["c3"]
    assert stamp.resolved == ("core/0002-core-line-5.patch (resolved)",)
    assert wd.read_journal(wdir / ".git") is None
    assert run_git(wdir, "status", "--porcelain") == ""


def test_session_skip_leaves_the_patch_out(project: Project) -> None:
    shas = session_queue(project)
    settings = project.settings()
    with pytest.raises(ConflictError):
        prepare(settings, Target.latest(), console=QUIET)
    report = resume(settings, "skip", console=QUIET)
    assert run_git(project.workdir, "log", "--format=%s", f"{shas['c3']}..HEAD").splitlines() == [
        "generated: b",
        "core: a",
    ]
    assert report.notes[0] == "core/0002-core-line-5.patch (skipped)"
    assert "// upstream 5" in (project.workdir / "src/llama-model.cpp").read_text()


def test_session_abort_goes_back_to_the_previous_checkout(project: Project) -> None:
    session_queue(project)
    settings = project.settings()
    before = run_git(project.workdir, "rev-parse", "HEAD").strip()
    with pytest.raises(ConflictError) as info:
        prepare(settings, Target.latest(), console=QUIET)
    assert "`invoke prepare --abort` returns to it" in (info.value.untouched or "")
    report = resume(settings, "abort", console=QUIET)
    assert report.action == "aborted"
    assert run_git(project.workdir, "rev-parse", "HEAD").strip() == before
    assert wd.in_progress(project.workdir / ".git") is None
    assert prepare(settings, Target.pinned(), console=QUIET).action == "noop"


def test_resume_without_session_and_force_over_a_session(project: Project) -> None:
    session_queue(project)
    settings = project.settings()
    with pytest.raises(ConflictError, match="no conflict session is in progress"):
        resume(settings, "continue", console=QUIET)
    with pytest.raises(ConflictError):
        prepare(settings, Target.latest(), console=QUIET)
    (project.workdir / "src/llama-model.cpp").write_text("half resolved\n")
    with pytest.raises(ConflictError, match="a conflict session is in progress"):
        prepare(settings, Target.pinned(), console=QUIET)
    report = prepare(settings, Target.pinned(), console=QUIET, force=True)
    assert report.backup_ref is not None
    assert run_git(project.workdir, "show", f"{report.backup_ref}:src/llama-model.cpp") == "half resolved\n"
    assert wd.read_journal(project.workdir / ".git") is None


def test_local_work_is_refused_before_any_session(project: Project) -> None:
    session_queue(project)
    (project.workdir / "mine.txt").write_text("mine\n")
    with pytest.raises(DirtyWorkdirError):
        prepare(project.settings(), Target.latest(), console=QUIET)
    assert (project.workdir / "mine.txt").read_text() == "mine\n"


def test_cli_triage_and_session_flags(project: Project) -> None:
    import json
    import shutil
    import subprocess
    import sys

    shas = session_queue(project)
    repo_root = Path(__file__).resolve().parents[2]
    shutil.copy(repo_root / "tasks.py", project.root / "tasks.py")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"

    def invoke(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["invoke", *args], cwd=project.root, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    result = invoke("prepare", "--latest", "--triage", "--json")
    assert result.returncode == ConflictError.exit_code, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert [p["verdict"] for p in data["triage"]["patches"]] == ["clean", "conflict", "clean"]
    assert data["triage"]["patches"][1]["blamed"][0]["sha"] == shas["c3"][:7]
    assert invoke("triage", "--latest").returncode == ConflictError.exit_code
    stopped = invoke("prepare", "--latest")
    assert stopped.returncode == ConflictError.exit_code
    assert "invoke prepare --continue" in stopped.stderr
    both = invoke("prepare", "--continue", "--abort")
    assert both.returncode != 0 and "choose one of --continue, --skip, --abort" in both.stderr
    aborted = invoke("prepare", "--abort", "--json")
    assert aborted.returncode == 0, aborted.stderr
    assert json.loads(aborted.stdout)["action"] == "aborted"
    flag = invoke("prepare", "--latest", "--no-interactive")
    assert flag.returncode == ConflictError.exit_code
    assert wd.in_progress(project.workdir / ".git") is None
    assert "invoke prepare --continue" not in flag.stderr
    env["CI"] = "true"  # what every CI runner sets: the same clean abort without the flag
    on_ci = invoke("prepare", "--latest")
    assert on_ci.returncode == ConflictError.exit_code
    assert wd.in_progress(project.workdir / ".git") is None
    assert "invoke prepare --continue" not in on_ci.stderr


def test_in_github_actions_the_conflicting_patch_is_annotated(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    from skippy.cli.entries import prepare_main

    session_queue(project)
    env = {**project.env, "CI": "true", "GITHUB_ACTIONS": "true"}
    assert prepare_main(env, root=project.root, latest=True) == ConflictError.exit_code
    err = capsys.readouterr().err
    (annotation,) = [line for line in err.splitlines() if line.startswith("::error file=")]
    assert annotation.startswith("::error file=queue/patches/0002-core-line-5.patch,line=")
    number = int(annotation.split("line=", 1)[1].split(",", 1)[0])
    patch = (project.patches / "0002-core-line-5.patch").read_text(encoding="utf-8").splitlines()
    assert patch[number - 1] == "diff --git a/src/llama-model.cpp b/src/llama-model.cpp"
    assert "core/0002-core-line-5.patch does not apply" in annotation
