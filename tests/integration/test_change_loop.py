"""The change loop through real git: fixup + autosquash, new commits, regenerate with no heads,
prepare taking the workdir as prepared, a finished resolution as local work, and the session
refusals (staged markers, a `git am` ended by hand, an abort that keeps unrelated edits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Literal

import pytest

from skippy.core.errors import ConflictError, DirtyWorkdirError, QueueError
from skippy.core.ui import Console
from skippy.maintain.regenerate import regenerate
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare
from skippy.queue.session import resume
from skippy.queue.status import compute_status
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)


def run_git(path: Path, *args: str, **env: str) -> str:
    return git(path, *args, env={**hermetic_git_env(Path(os.environ["HOME"])), **env})


def queue_bytes(project: Project) -> dict[str, bytes]:
    root = project.patches
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def commit_of(wdir: Path, label: str) -> str:
    found = run_git(wdir, "log", "--format=%H", f"--grep=^Skippy-Patch: {label}$").split()
    assert len(found) == 1, (label, found)
    return found[0]


def autosquash(wdir: Path, base: str) -> None:
    subprocess.run(
        ["git", "-C", str(wdir), "rebase", "--quiet", "-i", "--autosquash", base],
        env={**hermetic_git_env(Path(os.environ["HOME"])), "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
        capture_output=True,
    )


def test_fixup_autosquash_regenerate_then_prepare_takes_the_workdir(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    # the fixture's patches were not written by format-patch: regenerate once to normalize them,
    # (the same trees: the switch to the new patched commit rewrites no file)
    regenerate(settings, console=QUIET)
    normalized = prepare(settings, Target.pinned(), console=QUIET)
    assert (normalized.action, normalized.changed_files) == ("applied", 0)
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None
    before = queue_bytes(queued_project)
    target = commit_of(wdir, "core/0002-core-add-provenance.patch")
    (wdir / "src/provenance.h").write_text("#define SKIPPY 2\n")
    run_git(wdir, "commit", "--quiet", "-a", f"--fixup={target}")
    autosquash(wdir, stamp.base_commit)
    # the squashed commit keeps its trailer: regenerate needs no branch names
    report = regenerate(settings, console=QUIET)
    after = queue_bytes(queued_project)
    assert {k for k in after if after[k] != before.get(k)} == {"0002-core-add-provenance.patch"}
    assert b"#define SKIPPY 2" in after["0002-core-add-provenance.patch"]
    assert b"Skippy-Patch" not in b"".join(after.values())
    assert report.history is not None and not report.history.reordered
    statuses = {e.subject: e.status for e in report.entries}
    assert statuses.pop("core: add provenance") == "changed", statuses
    assert set(statuses.values()) == {"unchanged"}
    # the workdir is what the queue gives now: prepare takes it, rewriting no file
    head_tree = run_git(wdir, "rev-parse", "HEAD^{tree}")
    mtime = (wdir / "src/provenance.h").stat().st_mtime_ns
    assert "when it gives HEAD's tree" in compute_status(settings).would
    taken = prepare(settings, Target.pinned(), console=QUIET)
    assert taken.action == "adopted" and taken.changed_files == 0
    assert any("the workdir is the prepared tree" in n for n in taken.notes)
    assert run_git(wdir, "rev-parse", "HEAD^{tree}") == head_tree
    assert (wdir / "src/provenance.h").stat().st_mtime_ns == mtime
    assert prepare(settings, Target.pinned(), console=QUIET).action == "noop"
    assert compute_status(settings).up_to_date


def test_a_new_commit_after_the_generated_lane_joins_model_support(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    (wdir / "src/qwen.cpp").write_text("// qwen support\n")
    run_git(wdir, "add", "src/qwen.cpp")
    run_git(wdir, "commit", "--quiet", "-m", "qwen: model support")
    # not in the queue yet: refused, with the command that carries it and the as-is build
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.pinned(), console=QUIET)
    assert "1 commit(s) on top of the recorded patched commit" in (info.value.details or "")
    assert "A       src/qwen.cpp" in (info.value.details or "").replace("\t", "       ")
    nxt = info.value.next_step or ""
    assert "`invoke regenerate`" in nxt and "`nox -s build-cpu -- --workdir-as-is`" in nxt
    assert "`invoke prepare --force`" in nxt
    report = regenerate(settings, console=QUIET)
    assert report.history is not None and report.history.reordered
    assert [c.lane.value for c in report.history.new()] == ["model_support"]
    series = (queued_project.patches / "model_support" / "series").read_text().split()
    assert series == ["0001-gemma3-runtime-adaptation.patch", "0002-qwen-model-support.patch"]
    assert prepare(settings, Target.pinned(), console=QUIET).action == "adopted"
    log = run_git(wdir, "log", "--format=%(trailers:key=Skippy-Patch,valueonly)", "-2").split()
    assert log == ["generated/0001-family-llama.patch", "model_support/0002-qwen-model-support.patch"]


def test_regenerate_refuses_an_unmarked_history_and_a_lane_that_depends_on_a_later_one(
    queued_project: Project,
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    before = queue_bytes(queued_project)
    # a commit after the generated one that edits the generated file cannot move before it
    (wdir / "src/generated/llama.inc").write_text("// generated llama, edited\n")
    run_git(wdir, "commit", "--quiet", "-am", "edit a generated file")
    with pytest.raises(QueueError) as info:
        regenerate(settings, console=QUIET)
    assert "of the model_support lane does not apply in lane order" in info.value.what
    assert "edit a generated file" in info.value.what
    assert f"rebase -i {wd.read_stamp(wdir / '.git').base_commit[:12]}" in (info.value.next_step or "")  # type: ignore[union-attr]
    assert queue_bytes(queued_project) == before
    assert run_git(wdir, "worktree", "list").count("\n") == 1, "the aside worktree is gone"


def test_a_workdir_prepared_without_trailers_is_re_marked_without_rewriting_a_file(
    queued_project: Project,
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    stamp_file = wdir / ".git" / "skippy" / "prepare.json"
    data = stamp_file.read_text().replace('"marked": true', '"marked": false')
    stamp_file.write_text(data)
    mtime = (wdir / "src/llama-model.cpp").stat().st_mtime_ns
    again = prepare(settings, Target.pinned(), console=QUIET)
    assert again.action == "applied" and again.changed_files == 0
    assert (wdir / "src/llama-model.cpp").stat().st_mtime_ns == mtime
    assert wd.read_stamp(wdir / ".git").marked  # type: ignore[union-attr]


# ------------------------------------------------------------------ conflict sessions


def two_core_patches_prepared(project: Project) -> str:
    """core/0001 adds a file, core/0002 edits line 5 of the model file; prepared on the pin (returned)."""
    up = project.upstream
    pin = up.commits[1]
    model = up.read("src/llama-model.cpp", pin)
    project.add_patch("core", "0001-core-a.patch", project.patch(pin, "core: a", {"src/a.h": "a\n"}))
    edited = model.replace("// model line 5\n", "// core 5\n")
    project.add_patch(
        "core", "0002-core-line-5.patch", project.patch(pin, "core: line 5", {"src/llama-model.cpp": edited})
    )
    prepare(project.settings(), Target.pinned(), console=QUIET)
    return pin


def conflict_session(project: Project) -> tuple[str, str]:
    """A queue whose core/0002 conflicts with an upstream commit; prepare --sha it (stopped)."""
    up = project.upstream
    pin = two_core_patches_prepared(project)
    later = up.read("src/llama-model.cpp")
    readme = up.read("README.md")
    target = up.commit(
        "upstream: rework line 5 and the readme",
        {"src/llama-model.cpp": later.replace("// model line 5\n", "// upstream 5\n"), "README.md": readme + "more\n"},
    )
    with pytest.raises(ConflictError):
        prepare(project.settings(), Target.at(target), console=QUIET)
    return pin, target


def test_a_finished_resolution_is_local_work_until_it_is_in_the_queue(project: Project) -> None:
    _pin, target = conflict_session(project)
    settings = project.settings()
    wdir = project.workdir
    resolved = (wdir / "src/llama-model.cpp").read_text()
    resolved = (
        resolved.split("<<<<<<<")[0] + "// upstream 5 + core 5\n" + resolved.split(">>>>>>>")[1].split("\n", 1)[1]
    )
    (wdir / "src/llama-model.cpp").write_text(resolved)
    run_git(wdir, "add", "src/llama-model.cpp")
    done = resume(settings, "continue", console=QUIET)
    carry = next(n for n in done.notes if "invoke regenerate" in n)
    assert f"`invoke pin-bump --sha {target}`" in carry and "<commit>" not in carry
    head = run_git(wdir, "rev-parse", "HEAD").strip()
    status = compute_status(settings)
    assert status.work is not None and "core/0002-core-line-5.patch (resolved)" in (status.work.unqueued or "")
    assert "local work:    none" not in status.render()
    # the next plain prepare (every build runs one) must not move the resolution away
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.pinned(), console=QUIET)
    assert "not in the queue" in (info.value.details or "")
    assert run_git(wdir, "rev-parse", "HEAD").strip() == head
    assert (wdir / "src/llama-model.cpp").read_text() == resolved
    assert wd.read_stamp(wdir / ".git").resolved  # type: ignore[union-attr]
    # carried into the queue, the workdir is the prepared tree of the target
    regenerate(settings, console=QUIET)
    assert b"// upstream 5 + core 5" in (project.patches / "0002-core-line-5.patch").read_bytes()
    assert prepare(settings, Target.at(target), console=QUIET).action == "adopted"
    assert compute_status(settings).work.unqueued is None  # type: ignore[union-attr]


def test_continue_refuses_staged_conflict_markers(project: Project) -> None:
    conflict_session(project)
    settings = project.settings()
    wdir = project.workdir
    run_git(wdir, "add", "src/llama-model.cpp")  # markers and all
    before = run_git(wdir, "rev-parse", "HEAD")
    with pytest.raises(ConflictError) as info:
        resume(settings, "continue", console=QUIET)
    assert info.value.what == "core/0002-core-line-5.patch: conflict markers are staged in src/llama-model.cpp"
    assert "leftover conflict marker" in (info.value.details or "")
    assert "nothing was committed" in (info.value.untouched or "")
    assert run_git(wdir, "rev-parse", "HEAD") == before
    assert wd.in_progress(wdir / ".git") is not None


def test_a_session_ended_by_hand_says_so_and_abort_still_works(project: Project) -> None:
    conflict_session(project)
    settings = project.settings()
    wdir = project.workdir
    run_git(wdir, "am", "--abort")
    actions: tuple[Literal["continue", "skip"], ...] = ("continue", "skip")
    for action in actions:
        with pytest.raises(ConflictError) as info:
            resume(settings, action, console=QUIET)
        assert "has no `git am` in progress any more" in info.value.what
        assert "invoke prepare --abort" in (info.value.next_step or "")
    status = compute_status(settings)
    assert "ended outside skippy" in (status.interrupted or "")
    assert "invoke prepare --abort" in status.would
    with pytest.raises(ConflictError) as refused:
        prepare(settings, Target.pinned(), console=QUIET)
    assert "invoke prepare --abort" in (refused.value.next_step or "")
    report = resume(settings, "abort", console=QUIET)
    assert report.action == "aborted"
    assert prepare(settings, Target.pinned(), console=QUIET).action == "noop"


def test_abort_keeps_an_unrelated_edit_in_a_file_the_session_changed(project: Project) -> None:
    conflict_session(project)
    settings = project.settings()
    wdir = project.workdir
    # README.md differs between the target (the session) and the previous checkout
    (wdir / "README.md").write_text("my first line\n" + (wdir / "README.md").read_text().split("\n", 1)[1])
    report = resume(settings, "abort", console=QUIET)
    text = (wdir / "README.md").read_text()
    assert text.startswith("my first line\n"), text
    assert "more\n" not in text, "the previous checkout's version, with the edit carried over"
    assert any("your edits carried over" in n and "README.md" in n for n in report.notes)
    assert report.backup_ref is not None
    assert "<<<<<<<" not in (wdir / "src/llama-model.cpp").read_text()


def test_an_as_is_build_of_a_tree_with_conflict_markers_names_them_before_configuring(project: Project) -> None:
    from skippy.compile.request import build_request
    from skippy.core.errors import BuildError
    from skippy.flows.build_session import SessionRequest, run_build_session

    conflict_session(project)
    settings = project.settings()
    with pytest.raises(BuildError) as info:
        run_build_session(
            SessionRequest(build_request("cpu", settings), workdir_as_is=True, spot_check=False), settings, QUIET
        )
    assert "still hold conflict markers: src/llama-model.cpp" in info.value.what
    nxt = info.value.next_step or ""
    assert "git -C .deps/llama.cpp add src/llama-model.cpp" in nxt
    assert "`nox -s build-cpu -- --workdir-as-is` again" in nxt and "invoke prepare --continue" in nxt
    assert not settings.build_root.exists(), "nothing configured"


def test_prepare_says_each_note_once(queued_project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    from skippy.cli.entries import prepare_main

    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    (wdir / "src/qwen.cpp").write_text("// qwen support\n")
    run_git(wdir, "add", "src/qwen.cpp")
    run_git(wdir, "commit", "--quiet", "-m", "qwen: model support")
    regenerate(settings, console=QUIET)
    capsys.readouterr()
    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    err = capsys.readouterr().err
    assert err.count("the workdir is the prepared tree") == 1, err
    assert "adopted at" in err
