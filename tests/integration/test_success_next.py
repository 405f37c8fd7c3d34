"""A success that leaves something to do says what comes next, as every error does (issue 43,
item 4): after a `--workdir-as-is` build, regenerate; after regenerate, prepare and check; after
`--continue` on another upstream X, regenerate then pin-bump.  And a build refused after that
resolution points to the pin-bump, not to a prepare of the old pin that refuses again."""

from __future__ import annotations

import json

import pytest

from skippy.cli.command import Report
from skippy.cli.commands import command
from skippy.cli.entries import build_main
from skippy.cli.run import run
from skippy.compile.backends import parse_backend
from skippy.core.errors import DirtyWorkdirError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import prepare_pinned
from skippy.maintain.regenerate import regenerate
from skippy.queue.prepare import Target, prepare
from skippy.queue.session import resume
from tests.conftest import Project
from tests.integration.test_change_loop import QUIET, conflict_session, run_git

pytestmark = pytest.mark.integration


def resolve(project: Project) -> None:
    """The conflict of :func:`conflict_session`, resolved and staged."""
    path = project.workdir / "src/llama-model.cpp"
    text = path.read_text()
    path.write_text(text.split("<<<<<<<")[0] + "// upstream 5 + core 5\n" + text.split(">>>>>>>")[1].split("\n", 1)[1])
    run_git(project.workdir, "add", "src/llama-model.cpp")


def last_line(err: str) -> str:
    return err.rstrip("\n").splitlines()[-1]


def test_continue_on_another_upstream_ends_with_regenerate_then_pin_bump(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    _pin, target = conflict_session(project)
    resolve(project)
    capsys.readouterr()
    ran = run(command("prepare"), {"continue_": True}, project.env, root=project.root, prog="invoke prepare")
    assert ran.code == 0
    err = capsys.readouterr().err
    expected = f"`invoke regenerate`, then `invoke pin-bump --sha {target}`"
    assert last_line(err) == f"next: {expected}"
    assert ran.report["next"] == expected

    # the build that --continue warned about refuses, and points to the same pin-bump
    code, _ = build_main("cpu", project.env, root=project.root)
    err = capsys.readouterr().err
    assert code != 0
    step = next(line for line in err.splitlines() if line.startswith("next: "))
    assert f"`invoke pin-bump --sha {target}`" in step, err
    assert "then `invoke prepare`" not in step
    assert "nox -s build-cpu -- --workdir-as-is" in step, step

    # regenerate's success then names that pin-bump too
    report = regenerate(project.settings(), console=QUIET)
    assert report.next_step is not None and report.next_step.startswith(f"`invoke pin-bump --sha {target}`")


def test_prepare_refusing_the_resolution_names_pin_bump(project: Project) -> None:
    _pin, target = conflict_session(project)
    resolve(project)
    resume(project.settings(), "continue", console=QUIET)
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(project.settings(), Target.pinned(), console=QUIET)
    assert f"then `invoke pin-bump --sha {target}` (moves the pin here" in (info.value.next_step or "")


def test_plain_local_work_still_names_prepare(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    (queued_project.workdir / "notes.txt").write_text("mine\n")
    run_git(queued_project.workdir, "add", "notes.txt")
    run_git(queued_project.workdir, "commit", "-q", "-m", "mine")
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.pinned(), console=QUIET)
    assert "then `invoke prepare` (accepts the workdir" in (info.value.next_step or "")
    assert "pin-bump" not in (info.value.next_step or "")
    assert "build it as it stands: `nox -s build-cpu -- --workdir-as-is`" in (info.value.next_step or "")

    # a build session's own prepare names that backend's build, in the refusal as it is made
    with pytest.raises(DirtyWorkdirError) as vulkan:
        prepare_pinned(settings, QUIET, parse_backend("vulkan"))
    assert "build it as it stands: `nox -s build-vulkan -- --workdir-as-is`" in (vulkan.value.next_step or "")
    assert "build-cpu" not in (vulkan.value.next_step or "")


def test_regenerate_at_the_pin_ends_with_prepare_and_check(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    (wdir / "src" / "provenance.h").write_text("#define SKIPPY 2\n")
    run_git(wdir, "commit", "-q", "-a", "-m", "core: provenance 2")
    capsys.readouterr()
    ran = run(command("regenerate"), {"json": True}, queued_project.env, root=queued_project.root, prog="r")
    out, err = capsys.readouterr()
    assert ran.code == 0
    expected = "`invoke prepare` (it takes this tree as prepared: no file rewritten), then `invoke check`"
    assert json.loads(out)["next"] == expected
    assert last_line(err) == f"next: {expected}"


def _built(options: object, settings: Settings, console: Console) -> Report:
    """The build action, replaced: the next step depends on the workdir, not on the build."""
    return Report({"mode": "local"})


def test_a_workdir_as_is_build_ends_with_regenerate(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    values = {"backend": "cpu", "workdir_as_is": True}
    build = command("build")
    # the workdir as prepared: nothing to carry, no next step
    ran = run(build, values, queued_project.env, root=queued_project.root, prog="nox -s build-cpu", action=_built)
    assert ran.code == 0 and "next" not in ran.report
    assert "next:" not in capsys.readouterr().err
    # a commit the queue lacks: regenerate, then prepare and check
    wdir = queued_project.workdir
    (wdir / "src" / "provenance.h").write_text("#define SKIPPY 2\n")
    run_git(wdir, "commit", "-q", "-a", "-m", "core: provenance 2")
    ran = run(build, values, queued_project.env, root=queued_project.root, prog="nox -s build-cpu", action=_built)
    expected = "`invoke regenerate`, then `invoke prepare` and `invoke check`"
    assert ran.report["next"] == expected
    assert last_line(capsys.readouterr().err) == f"next: {expected}"
    # an edit not committed yet: commit it first
    (wdir / "src" / "provenance.h").write_text("#define SKIPPY 3\n")
    ran = run(build, values, queued_project.env, root=queued_project.root, prog="nox -s build-cpu", action=_built)
    assert str(ran.report["next"]).startswith("commit your edits (`git -C .deps/llama.cpp add -A && git -C ")
    assert str(ran.report["next"]).endswith(f", then {expected}")
