"""Every failure of every command under --json prints one JSON report on stdout: invoke's own
argument errors, the nox sessions', a bad value, a SkippyError, Ctrl-C and an exception
skippy did not foresee; all on the one path (skippy.cli.run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.command import Command, Report
from skippy.cli.commands import COMMANDS
from skippy.cli.entries import nox_main
from skippy.cli.run import run
from skippy.core.errors import QueueError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from tests.conftest import Project

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def one_json(out: str) -> dict[str, Any]:
    report = json.loads(out)  # one document: json.loads refuses anything after it
    assert isinstance(report, dict)
    return report


def positionals(c: Command) -> dict[str, object]:
    return {o.name: "HEAD" for o in c.all_options if o.kind == "positional"}


@pytest.mark.parametrize("c", COMMANDS, ids=lambda c: c.name)
def test_invoke_argument_errors_print_one_json_report(c: Command) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "invoke", c.task, *map(str, positionals(c).values()), "--no-such-option", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    report = one_json(result.stdout)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "SettingsError", 2)
    assert report["what"] == f"invoke {c.task}: No idea what '--no-such-option' is!"
    assert "--json" in str(report["details"]), "the valid options are listed"
    assert "error: invoke" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("c", [c for c in COMMANDS if c.nox], ids=lambda c: c.name)
def test_nox_argument_errors_print_one_json_report(
    c: Command, project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = nox_main(c.name, ["--no-such-option", "--json"], project.env, root=project.root, backend="cpu")
    assert ran.code == 2
    report = one_json(capsys.readouterr().out)
    assert report["error"] == "SettingsError" and "unknown option --no-such-option" in str(report["what"])
    assert not project.workdir.exists(), "nothing may be prepared before the options are checked"


def _fails(options: object, settings: Settings, console: Console) -> Report:
    raise QueueError("the queue is broken", untouched="everything", next_step="fix it")


def _interrupted(options: object, settings: Settings, console: Console) -> Report:
    raise KeyboardInterrupt


def _bug(options: object, settings: Settings, console: Console) -> Report:
    raise RuntimeError("a bug")


@pytest.mark.parametrize("c", COMMANDS, ids=lambda c: c.name)
def test_every_failure_of_every_command_prints_one_json_report(
    c: Command, project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    for action, code, error in (
        (_fails, 3, "QueueError"),
        (_interrupted, 130, "Interrupted"),
        (_bug, 70, "InternalError"),
    ):
        values = {"json": True, **positionals(c)}
        ran = run(c, values, project.env, root=project.root, prog=f"invoke {c.task}", action=action)
        out, err = capsys.readouterr()
        report = one_json(out)
        assert (ran.code, report["ok"], report["error"], report["exit_code"]) == (code, False, error, code)
        if error == "Interrupted":
            assert report["untouched"] == c.interrupted
            assert report["next"] == f"rerun invoke {c.task}"
        if error == "InternalError":
            assert "Traceback" in err and "RuntimeError: a bug" in err


def test_a_value_the_table_refuses_prints_one_json_report(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    from skippy.cli.commands import command

    ran = run(command("build"), {"json": True, "jobs": "0"}, project.env, root=project.root, prog="invoke build")
    assert ran.code == 2
    assert "-j/--jobs: wants a positive number" in str(one_json(capsys.readouterr().out)["what"])
    assert not project.workdir.exists(), "nothing may be prepared before the options are checked"


def test_verbose_shows_the_commands_run(queued_project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    from skippy.cli.entries import prepare_main, status_main

    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    assert "$ git" not in capsys.readouterr().err
    assert status_main(queued_project.env, root=queued_project.root) == 0
    assert "$ git" not in capsys.readouterr().err
    assert status_main(queued_project.env, root=queued_project.root, verbose=True) == 0
    assert "  $ git " in capsys.readouterr().err
    assert prepare_main(queued_project.env, root=queued_project.root, verbose=True) == 0
    err = capsys.readouterr().err
    assert "  $ git " in err and " s\n" in err, "the commands and the steps' times"


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["build", "--backend", "metal", "--json", "-D"], "invoke build: -D needs a value"),
        (
            ["build", "--backend", "metal", "--json", "--jobs"],
            "invoke build: Flag <Argument: jobs (j)> needed value and was not given one!",
        ),
        (["no-such-task", "--json"], "invoke: No idea what 'no-such-task' is!"),
    ],
)
def test_invoke_value_errors_are_refused_before_any_work(argv: list[str], what: str) -> None:
    # `-D` last on the line: invoke itself would drop it silently and build (metal: never builds here)
    result = subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert one_json(result.stdout)["what"] == what
