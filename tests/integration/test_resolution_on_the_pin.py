"""A conflict session finished against the pin itself is local work, like one against any other
target: the next plain prepare and the build refuse it (naming the commit and the commands), as
`invoke status` predicts, and neither moves or rewrites anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skippy.cli.entries import build_main, prepare_main, regenerate_main, status_main
from skippy.core.errors import ConflictError, DirtyWorkdirError
from skippy.queue import workdir as wd
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def report_of(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def resolved_on_the_pin(project: Project, capsys: pytest.CaptureFixture[str]) -> str:
    """Two patches of the queue edit the same line of the pin: `invoke prepare --sha <pin>` stops on
    the second, the user resolves it and runs `invoke prepare --continue`."""
    pin = project.upstream.commits[1]
    model = project.upstream.read("src/llama-model.cpp", pin)
    for subject, line in (("line 5", "// core 5\n"), ("line 5 again", "// other 5\n")):
        data = project.patch(pin, f"core: {subject}", {"src/llama-model.cpp": model.replace("// model line 5\n", line)})
        project.add_patch("core", f"000{len(files(project.patches)) + 1}-core-{subject.replace(' ', '-')}.patch", data)
    assert prepare_main(project.env, root=project.root, sha=pin, json=True) == ConflictError.exit_code
    stopped, _ = report_of(capsys)
    assert stopped["ok"] is False and "core/0002-core-line-5-again.patch does not apply" in str(stopped["what"])
    source = project.workdir / "src/llama-model.cpp"
    text = source.read_text()
    source.write_text(text.split("<<<<<<<")[0] + "// both 5\n" + text.split(">>>>>>>")[1].split("\n", 1)[1])
    run_git(project.workdir, "add", "src/llama-model.cpp")
    assert prepare_main(project.env, root=project.root, continue_=True, json=True) == 0
    done, _ = report_of(capsys)
    assert done["ok"] is True
    return pin


def snapshot(project: Project) -> tuple[str, dict[str, bytes], dict[str, bytes], bytes, str]:
    """HEAD, the queue, the tree, the stamp and the work tree's status: what a refusal must not change."""
    wdir = project.workdir
    return (
        run_git(wdir, "rev-parse", "HEAD").strip(),
        files(project.patches),
        files(wdir / "src"),
        (wdir / ".git" / "skippy" / wd.STAMP_NAME).read_bytes(),
        run_git(wdir, "status", "--porcelain"),
    )


def assert_refused(report: dict[str, object], resolution: str) -> None:
    assert (report["ok"], report["error"]) == (False, "DirtyWorkdirError")
    assert report["what"] == ".deps/llama.cpp holds work that `prepare` would lose"
    details = str(report["details"])
    assert "core/0002-core-line-5-again.patch (resolved) on upstream" in details
    assert f"(commit {resolution[:12]}) but not in the queue" in details
    assert "the queue does not apply on " in details
    nxt = str(report["next"])
    assert "`invoke regenerate`" in nxt and "`nox -s build-cpu -- --workdir-as-is`" in nxt
    assert "--force`" in nxt


def test_a_resolution_against_the_pin_is_refused_by_prepare_and_the_build(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    pin = resolved_on_the_pin(project, capsys)
    wdir = project.workdir
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.upstream_sha == pin and stamp.resolved
    resolution = run_git(wdir, "log", "--format=%H", "--grep=^Skippy-Patch: core/0002-core-line-5-again.patch$")
    resolution = resolution.strip()
    before = snapshot(project)
    assert resolution == before[0]

    # status predicts the refusal
    assert status_main(project.env, root=project.root, json=True) == 0
    status, _ = report_of(capsys)
    assert status["up_to_date"] is False
    assert str(status["would"]).startswith("refuse: the conflict session's resolution is local work")
    local = status["local_work"]
    assert isinstance(local, dict)
    assert f"(commit {resolution[:12]})" in str(local["unqueued_resolution"])

    # a plain prepare, or one at the pin, refuses it (it used to say "up to date" and exit 0)
    for target, rerun in (({}, "invoke prepare"), ({"sha": pin}, f"invoke prepare --sha {pin}")):
        assert prepare_main(project.env, root=project.root, json=True, **target) == DirtyWorkdirError.exit_code
        refused, err = report_of(capsys)
        assert_refused(refused, resolution)
        assert f"`{rerun} --force`" in str(refused["next"])
        assert "up to date" not in err and "holds work that `prepare` would lose" in err

    # and so does the build, before configuring anything
    code, skipped = build_main("cpu", project.env, root=project.root, args=["--json", "--no-spot-check"])
    built, _ = report_of(capsys)
    assert (code, skipped) == (DirtyWorkdirError.exit_code, None)
    assert_refused(built, resolution)
    assert not project.settings().build_root.exists(), "nothing was configured or built"
    assert snapshot(project) == before, "nothing moved or was rewritten"

    # carried into the queue, the workdir is the prepared tree (no file rewritten)
    assert regenerate_main(project.env, root=project.root, json=True) == 0
    capsys.readouterr()
    assert b"// both 5" in (project.patches / "0002-core-line-5-again.patch").read_bytes()
    assert prepare_main(project.env, root=project.root, json=True) == 0
    assert report_of(capsys)[0]["action"] == "adopted"
    assert files(wdir / "src") == before[2]
    assert prepare_main(project.env, root=project.root, json=True) == 0
    assert report_of(capsys)[0]["action"] == "noop"
