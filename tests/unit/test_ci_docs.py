"""docs/ci.md says what a repository needs for the canary's pull requests (issue 43, item 7)."""

from __future__ import annotations

from tests.workflowtools import ROOT, WORKFLOWS, steps

SETTING = '"Allow GitHub Actions to create and approve pull requests"'


def test_a_pull_request_opened_with_the_workflow_token_names_the_setting_it_needs() -> None:
    fallback = [
        step.label
        for path in WORKFLOWS
        for step in steps(path)
        if "create-pull-request" in str(step.step.get("uses", ""))
        and "github.token" in str((step.step.get("with") or {}).get("token", ""))
    ]
    assert fallback, "the canary opens its pull requests with GITHUB_TOKEN when CANARY_TOKEN is not set"
    text = " ".join((ROOT / "docs" / "ci.md").read_text(encoding="utf-8").split())
    assert SETTING in text
    assert "Without `CANARY_TOKEN`" in text
