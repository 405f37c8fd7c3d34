"""tooling.ci: the checks the workflows run besides nox and invoke."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tooling.ci import CIError, assert_ran, fenced, main, parse_report, publish, ran_problems


def report(*sessions: tuple[str, str]) -> dict[str, Any]:
    """The shape ``nox --report`` writes (nox 2024+): result 1 when every session succeeded."""
    entries: list[dict[str, Any]] = [
        {
            "args": {},
            "name": name,
            "result": result,
            "result_code": {"success": 1, "skipped": 2, "failed": 0, "aborted": -1}[result],
            "reason": None if result == "success" else f"{name} {result} for a reason",
            "signatures": [name],
            "duration": 0.1,
        }
        for name, result in sessions
    ]
    return {"result": int(all(r == "success" for _, r in sessions)), "sessions": entries}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "nox-report.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_session_that_ran_passes(tmp_path: Path) -> None:
    path = write(tmp_path, report(("build-cpu", "success")))
    results = assert_ran(path, ["build-cpu"])
    assert [r.name for r in results] == ["build-cpu"]


def test_a_skipped_session_fails_with_its_reason(tmp_path: Path) -> None:
    path = write(tmp_path, report(("build-metal", "skipped")))
    with pytest.raises(CIError) as caught:
        assert_ran(path, ["build-metal"])
    assert "a skipped session proves nothing" in caught.value.what
    assert caught.value.details == "build-metal: skipped: build-metal skipped for a reason"
    assert caught.value.exit_code == 14


def test_failed_aborted_and_missing_sessions_are_each_named() -> None:
    results = parse_report(report(("lint", "success"), ("tests", "failed"), ("build-cuda", "aborted")))
    problems = ran_problems(results, ["lint", "tests", "build-cuda", "build-rocm"])
    assert problems == [
        "tests: failed: tests failed for a reason",
        "build-cuda: aborted: build-cuda aborted for a reason",
        "build-rocm: not in the report (sessions in it: lint, tests, build-cuda)",
    ]


def test_a_parametrized_session_matches_by_signature() -> None:
    data = report(("tests", "success"))
    data["sessions"][0]["name"] = "tests-3.11"
    data["sessions"][0]["signatures"] = ["tests-3.11", "tests(python='3.11')"]
    assert ran_problems(parse_report(data), ["tests(python='3.11')"]) == []
    assert ran_problems(parse_report(data), ["tests"]) != []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not json", "is not JSON"),
        (json.dumps({"result": 1}), "not a nox report"),
        (json.dumps({"sessions": [{"result": "success"}]}), "without a name"),
    ],
)
def test_unreadable_reports_are_errors(tmp_path: Path, payload: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(payload, encoding="utf-8")
    with pytest.raises(CIError, match=message):
        assert_ran(path, ["lint"])


def test_a_missing_report_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(CIError) as caught:
        assert_ran(tmp_path / "absent.json", ["lint"])
    assert caught.value.next_step is not None
    assert "--report" in caught.value.next_step


def test_main_exit_codes_and_github_annotation(tmp_path: Path) -> None:
    ok = write(tmp_path, report(("build-cpu", "success")))
    out, err = io.StringIO(), io.StringIO()
    assert main(["assert-ran", str(ok), "build-cpu"], {}, out=out, err=err) == 0
    assert out.getvalue() == "ran to success: build-cpu\n"

    skipped = write(tmp_path, report(("build-cpu", "skipped")))
    out, err = io.StringIO(), io.StringIO()
    assert main(["assert-ran", str(skipped), "build-cpu"], {"GITHUB_ACTIONS": "true"}, out=out, err=err) == 14
    assert err.getvalue().startswith("::error::1 nox session(s) did not run to success")
    assert "build-cpu: skipped" in err.getvalue()

    assert main(["assert-ran", str(ok)], {}, out=io.StringIO(), err=io.StringIO()) == 2
    assert main(["frobnicate"], {}, out=io.StringIO(), err=io.StringIO()) == 2
    assert main([], {}, out=io.StringIO(), err=io.StringIO()) == 2


def test_fenced_outgrows_backticks_in_the_text() -> None:
    assert fenced("t", "plain\n") == "### t\n\n```text\nplain\n```\n"
    block = fenced("t", "a ```` b")
    assert block.splitlines()[2] == "`````text"
    assert block.splitlines()[-1] == "`````"
    assert "(no output)" in fenced("t", "")


def test_publish_echoes_and_appends_to_the_step_summary(tmp_path: Path) -> None:
    source = tmp_path / "bisect.txt"
    source.write_text("newest compatible: abc123\n", encoding="utf-8")
    summary = tmp_path / "summary.md"
    summary.write_text("earlier\n", encoding="utf-8")
    out = io.StringIO()
    publish("bisect", source, {"GITHUB_STEP_SUMMARY": str(summary)}, out)
    assert out.getvalue() == "newest compatible: abc123\n"
    assert summary.read_text(encoding="utf-8") == "earlier\n### bisect\n\n```text\nnewest compatible: abc123\n```\n\n"


def test_publish_of_a_missing_file_says_so_without_failing(tmp_path: Path) -> None:
    out = io.StringIO()
    publish("triage", tmp_path / "triage.txt", {}, out)
    assert "triage.txt was not written" in out.getvalue()


def test_publish_appends_the_fenced_text_to_a_pull_request_body(tmp_path: Path) -> None:
    """The canary's pull request to the newest compatible commit: pin-bump's Markdown, then bisect's result."""
    source = tmp_path / "bisect.txt"
    source.write_text("first breaking: 9f8e7d6 (core/0002-y.patch)\n", encoding="utf-8")
    body = tmp_path / "compatible-body.md"
    body.write_text("## Pin bump\n", encoding="utf-8")
    out = io.StringIO()
    code = main(["publish", "bisect", str(source), "--append-to", str(body)], {}, out=out, err=io.StringIO())
    assert code == 0
    assert body.read_text(encoding="utf-8") == (
        "## Pin bump\n### bisect\n\n```text\nfirst breaking: 9f8e7d6 (core/0002-y.patch)\n```\n\n"
    )
    assert main(["publish", "bisect", str(source), "--into", str(body)], {}, out=out, err=io.StringIO()) == 2
