"""Where output goes: progress and errors on stderr, the report a command shows on
stdout, replaced by one JSON document with ``--json`` (as the README says)."""

from __future__ import annotations

import json

import pytest

from skippy.cli.entries import prepare_main, status_main
from tests.conftest import Project

pytestmark = pytest.mark.integration


def test_status_report_on_stdout_progress_on_stderr(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    prepared = capsys.readouterr()
    assert prepared.out == "", "prepare has no report to show: everything it says is progress"
    assert "patched at" in prepared.err or "cloned and patched at" in prepared.err

    assert status_main(queued_project.env, root=queued_project.root) == 0
    human = capsys.readouterr()
    assert human.out.strip(), "the status report goes to stdout"
    assert queued_project.upstream.commits[1][:12] in human.out

    assert status_main(queued_project.env, root=queued_project.root, json=True) == 0
    machine = capsys.readouterr()
    report = json.loads(machine.out)
    assert report["ok"] is True
    assert report["up_to_date"] is True
