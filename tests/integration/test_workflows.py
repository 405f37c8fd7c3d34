"""Every workflow validated offline with the real tools: the GitHub workflow schema
(check-jsonschema's bundled copy), zizmor's security audits (offline, pedantic
persona, the repository's .github/zizmor.yml), and every nox session and invoke
task (with its --options) a workflow calls checked against the real menus; and the
canary's alert script run by node against a fake GitHub API."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from skippy.core import proc
from tests.workflowtools import ROOT, WORKFLOWS, calls, load, tool

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ZIZMOR_CONFIG = ROOT / ".github" / "zizmor.yml"
ZIZMOR_PERSONA = "pedantic"


def run(*argv: str, cwd: Path = ROOT) -> proc.Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "ZIZMOR_"))}
    return proc.run(list(argv), env=env, cwd=cwd, check=False, timeout=300)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_schema(path: Path) -> None:
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dependabot_config_matches_its_schema() -> None:
    path = ROOT / ".github" / "dependabot.yml"
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.dependabot", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    stepz: []\n", encoding="utf-8")
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(broken))
    assert result.returncode != 0


def zizmor(target: Path) -> tuple[int, list[dict[str, object]]]:
    result = run(
        tool("zizmor"),
        "--offline",
        f"--persona={ZIZMOR_PERSONA}",
        "--config",
        str(ZIZMOR_CONFIG),
        "--format=json",
        "--no-progress",
        str(target),
    )
    findings = json.loads(result.stdout or "[]")
    assert isinstance(findings, list), result.stderr
    return result.returncode, findings


def test_zizmor_finds_nothing_in_the_workflows() -> None:
    code, findings = zizmor(ROOT / ".github")
    summary = [f"{f.get('ident')}: {f.get('desc')}" for f in findings]
    assert findings == [], "\n".join(summary)
    assert code == 0


def test_zizmor_config_gives_a_reason_for_every_exception() -> None:
    lines = ZIZMOR_CONFIG.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "ignore:":
            assert lines[i + 1].strip().startswith("#"), f"zizmor.yml:{i + 2}: an ignore without a reason"


def test_zizmor_catches_a_tag_pinned_action_and_a_default_persisted_token(tmp_path: Path) -> None:
    # the same audit on a copy with two classic mistakes: it must speak up
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    text = re.sub(r"actions/checkout@[0-9a-f]{40} # v\S+", "actions/checkout@v4", text)
    text = text.replace("        with:\n          persist-credentials: false\n", "")
    (workflows / "ci.yml").write_text(text, encoding="utf-8")
    code, findings = zizmor(tmp_path / ".github")
    idents = {str(f.get("ident")) for f in findings}
    assert code != 0
    assert {"unpinned-uses", "artipacked"} <= idents


def nox_sessions(names: set[str]) -> set[str]:
    result = run(sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--list", "--json", "-s", *sorted(names))
    assert result.returncode == 0, result.stderr
    return {s["session"] for s in json.loads(result.stdout)}


def invoke_tasks() -> set[str]:
    result = run(sys.executable, "-m", "invoke", "--list", "--list-format=json")
    assert result.returncode == 0, result.stderr
    return {t["name"] for t in json.loads(result.stdout)["tasks"]}


def invoke_options(task: str) -> set[str]:
    result = run(sys.executable, "-m", "invoke", "--help", task)
    assert result.returncode == 0, result.stderr
    options = result.stdout.partition("Options:")[2]
    return set(re.findall(r"--([a-z0-9][a-z0-9-]*)", options))


def test_every_nox_session_a_workflow_calls_exists() -> None:
    wanted = {c.name for path in WORKFLOWS for c in calls(path) if c.kind == "nox"}
    assert {"lint", "tests", "build-cpu", "build-metal", "build-cuda", "build-vulkan", "build-rocm"} <= wanted
    assert nox_sessions(wanted) == wanted


def test_nox_listing_fails_for_a_session_that_does_not_exist() -> None:
    result = run(sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--list", "--json", "-s", "build-nope")
    assert "build-nope" in result.stdout + result.stderr
    assert "build-nope" not in {s.get("session") for s in json.loads(result.stdout or "[]")}


def test_every_invoke_task_and_option_a_workflow_calls_exists() -> None:
    used = [c for path in WORKFLOWS for c in calls(path) if c.kind == "invoke"]
    assert {c.name for c in used} >= {"pin-bump", "triage", "bisect"}
    tasks = invoke_tasks()
    missing = sorted({f"{c.name} ({c.where})" for c in used if c.name not in tasks})
    assert missing == [], f"invoke tasks the workflows call but tasks.py lacks: {missing}"
    for c in used:
        unknown = {o.removeprefix("--") for o in c.options} - invoke_options(c.name)
        assert unknown == set(), f"{c.where}: invoke {c.name} has no option(s) {sorted(unknown)}"


# --- the canary's alert script, run with node against a fake GitHub API ----------
#
# The alert job's github-script is the only logic a workflow holds: it decides, from this
# run's job results and the previous scheduled run's conclusion, whether to open, update or
# close the canary issue.  node runs it here the way actions/github-script does (the script
# as the body of an async function of github, context, core and require), with an API that
# answers from the scenario and records every call.

HARNESS = r"""
const fs = require('fs');
const [scriptPath, scenarioPath] = process.argv.slice(2);
const script = fs.readFileSync(scriptPath, 'utf8');
const scenario = JSON.parse(fs.readFileSync(scenarioPath, 'utf8'));
const calls = [];
const notices = [];
const api = (name, reply) => async (params) => {
  calls.push({ name, params });
  return { data: reply(params) };
};
const github = {
  paginate: async (method, params) => (await method(params)).data,
  rest: {
    issues: {
      listForRepo: api('issues.listForRepo', () => scenario.issues),
      create: api('issues.create', (p) => ({ number: 99, ...p })),
      update: api('issues.update', (p) => p),
      createComment: api('issues.createComment', (p) => p),
    },
    actions: {
      getWorkflowRun: api('actions.getWorkflowRun', () => scenario.this_run),
      listWorkflowRuns: api('actions.listWorkflowRuns', () => ({ workflow_runs: scenario.runs })),
    },
  },
};
const context = {
  repo: { owner: 'team', repo: 'queue' },
  runId: scenario.this_run.id,
  eventName: scenario.event,
  serverUrl: 'https://github.example',
};
const core = { notice: (m) => notices.push(m), setSecret: () => {}, exportVariable: () => {} };
const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor;
new AsyncFunction('github', 'context', 'core', 'require', script)(github, context, core, require)
  .then((result) => process.stdout.write(JSON.stringify({ result, calls, notices })))
  .catch((error) => { console.error(error); process.exit(1); });
"""

WRITES = ("issues.create", "issues.update", "issues.createComment")
MARKER = "<!-- skippy-canary-alert -->"
THIS_RUN = {"id": 500, "run_number": 50, "workflow_id": 7, "html_url": "https://github.example/r/500"}


def scheduled_run(number: int, conclusion: str) -> dict[str, object]:
    return {
        "id": number * 10,
        "run_number": number,
        "conclusion": conclusion,
        "html_url": f"https://github.example/r/{number * 10}",
    }


def alert_step() -> dict[str, Any]:
    (step,) = [
        s
        for s in load(ROOT / ".github" / "workflows" / "canary.yml")["jobs"]["alert"]["steps"]
        if "script" in s.get("with", {})
    ]
    assert isinstance(step, dict)
    return step


def run_alert(
    tmp_path: Path,
    *,
    bump: str,
    pr: str = "skipped",
    compatible: str = "skipped",
    compatible_url: str = "",
    event: str = "schedule",
    runs: list[dict[str, object]] | None = None,
    issues: list[dict[str, object]] | None = None,
    reports: dict[str, str] | None = None,
) -> dict[str, Any]:
    step = alert_step()
    report_dir = tmp_path / "canary"
    report_dir.mkdir()
    for name, text in (reports or {}).items():
        (report_dir / name).write_text(text, encoding="utf-8")
    (tmp_path / "alert.js").write_text(step["with"]["script"], encoding="utf-8")
    (tmp_path / "harness.js").write_text(HARNESS, encoding="utf-8")
    scenario = {"event": event, "this_run": THIS_RUN, "runs": runs or [], "issues": issues or []}
    (tmp_path / "scenario.json").write_text(json.dumps(scenario), encoding="utf-8")
    # the step's env as the runner gives it: literal values kept, the expressions answered by the scenario
    answers = {
        "BUMP_RESULT": bump,
        "PR_RESULT": pr,
        "COMPATIBLE_RESULT": compatible,
        "COMPATIBLE_URL": compatible_url,
        "REPORT_DIR": str(report_dir),
    }
    env = {k: answers.get(k, str(v)) for k, v in step["env"].items()}
    assert set(answers) <= set(env)
    assert not [v for v in env.values() if "${{" in v]
    result = proc.run(
        [tool("node"), str(tmp_path / "harness.js"), str(tmp_path / "alert.js"), str(tmp_path / "scenario.json")],
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=tmp_path,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert isinstance(out, dict)
    return out


def writes(out: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["params"]) for c in out["calls"] if c["name"] in WRITES]


def test_alert_opens_one_issue_after_the_second_failed_scheduled_run(tmp_path: Path) -> None:
    triage = "patch   lane   status\n0001-x  core   conflict  src/llama.cpp\n```not a fence end```\n"
    out = run_alert(
        tmp_path,
        bump="failure",
        # newest first, as the API lists them; the cancelled run in between does not count
        runs=[scheduled_run(49, "cancelled"), scheduled_run(48, "failure"), scheduled_run(47, "success")],
        issues=[
            {"number": 3, "body": "an unrelated issue"},
            {"number": 4, "body": MARKER, "pull_request": {"url": "x"}},
        ],
        reports={"triage.txt": triage, "bisect.txt": "newest compatible: abc123\n"},
    )
    assert out["result"] == "opened"
    ((name, params),) = writes(out)
    assert name == "issues.create"
    assert params["labels"] == [alert_step()["env"]["ALERT_LABEL"]]
    assert params["title"] == alert_step()["env"]["ALERT_TITLE"]
    body = params["body"]
    assert body.startswith(MARKER)
    assert "[#48](https://github.example/r/480)" in body and "[#50](" in body
    assert "0001-x  core   conflict" in body and "newest compatible: abc123" in body
    # the triage text holds a ``` run: its fence is longer, so the issue shows it as text
    assert "````text\n" in body
    listed = [c["params"] for c in out["calls"] if c["name"] == "actions.listWorkflowRuns"]
    assert listed == [
        {"owner": "team", "repo": "queue", "workflow_id": 7, "event": "schedule", "status": "completed", "per_page": 20}
    ]


def test_alert_waits_for_a_second_failure(tmp_path: Path) -> None:
    out = run_alert(tmp_path, bump="failure", runs=[scheduled_run(49, "success"), scheduled_run(48, "failure")])
    assert out["result"] == "first-failure"
    assert writes(out) == []
    assert "#49" in out["notices"][0] and "success" in out["notices"][0]
    # the first scheduled run there is
    first = tmp_path / "first"
    first.mkdir()
    out_first = run_alert(first, bump="failure", runs=[])
    assert out_first["result"] == "first-failure"
    assert writes(out_first) == []


def test_alert_updates_the_open_issue_instead_of_opening_another(tmp_path: Path) -> None:
    out = run_alert(
        tmp_path,
        bump="failure",
        runs=[scheduled_run(49, "failure")],
        issues=[{"number": 12, "body": f"{MARKER}\nold text"}],
        reports={"triage.txt": "0002-y conflict\n"},
    )
    assert out["result"] == "updated"
    (update, comment) = writes(out)
    assert update[0] == "issues.update" and update[1]["issue_number"] == 12
    assert "0002-y conflict" in update[1]["body"]
    # the bisect step did not write its file: the issue says so instead of failing
    assert "(bisect.txt was not written" in update[1]["body"]
    assert comment[0] == "issues.createComment" and comment[1]["body"].endswith("/actions/runs/500")


def test_alert_closes_the_issue_when_the_canary_passes_again(tmp_path: Path) -> None:
    issues = [{"number": 12, "body": f"{MARKER}\nfailing"}]
    out = run_alert(tmp_path, bump="success", pr="success", event="workflow_dispatch", issues=issues)
    assert out["result"] == "closed"
    (comment, update) = writes(out)
    assert comment[0] == "issues.createComment" and "passes again" in comment[1]["body"]
    assert update == (
        "issues.update",
        {"owner": "team", "repo": "queue", "issue_number": 12, "state": "closed", "state_reason": "completed"},
    )
    # nothing open, nothing to close; no run history is read for a passing run
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    out = run_alert(quiet, bump="success", pr="success")
    assert (out["result"], writes(out)) == ("passed", [])
    assert not [c for c in out["calls"] if c["name"].startswith("actions.")]


def test_alert_ignores_manual_failures_and_unfinished_bumps(tmp_path: Path) -> None:
    issues = [{"number": 12, "body": MARKER}]
    runs = [scheduled_run(49, "failure")]
    for i, (event, bump, pr) in enumerate(
        [
            ("workflow_dispatch", "failure", "skipped"),
            ("schedule", "cancelled", "skipped"),
            ("schedule", "success", "cancelled"),
        ]
    ):
        where = tmp_path / str(i)
        where.mkdir()
        out = run_alert(where, bump=bump, pr=pr, event=event, runs=runs, issues=issues)
        assert (out["result"], writes(out)) == ("nothing", []), (event, bump, pr)


def test_alert_counts_a_failed_pull_request_job_as_a_failed_run(tmp_path: Path) -> None:
    out = run_alert(tmp_path, bump="success", pr="failure", runs=[scheduled_run(49, "failure")])
    assert out["result"] == "opened"
    ((_, params),) = writes(out)
    assert "bump success, pull-request failure" in params["body"]


# --- jactionlint (with ShellCheck) catches the classic mistakes, one per copy of the workflows ---

MISTAKES = {
    # a needs: to a job that does not exist
    "needs-missing-job": ("canary.yml", "    needs: bump\n", "    needs: bumpp\n"),
    # an invalid cron (minute 61)
    "invalid-cron": ("canary.yml", '- cron: "17 5 * * *"', '- cron: "61 5 * * *"'),
    # a misspelled matrix key in an expression
    "misspelled-matrix-key": ("build.yml", "SESSION: ${{ matrix.session }}", "SESSION: ${{ matrix.sesion }}"),
    # a runner label GitHub does not have
    "unknown-runner-label": ("ci.yml", "runs-on: ubuntu-24.04\n", "runs-on: ubuntu-24.40\n"),
    # an unquoted word in a run: script (ShellCheck through the linter)
    "unquoted-variable": (
        "ci.yml",
        'nox --report "$RUNNER_TEMP/nox-report.json" -s lint',
        "nox --report $RUNNER_TEMP/nox-report.json -s lint",
    ),
}


def jactionlint(repo: Path) -> proc.Result:
    workflows = sorted(str(p) for p in (repo / ".github" / "workflows").glob("*.yml"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    argv = [
        tool("jactionlint"),
        "--no-online",
        "--no-color",
        "--oneline",
        "-c",
        str(repo / ".github" / "jactionlint.yaml"),
    ]
    return proc.run([*argv, *workflows], env=env, cwd=repo, check=False, timeout=120)


def test_jactionlint_finds_nothing_in_the_workflows() -> None:
    result = jactionlint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shellcheck was not found" not in result.stdout + result.stderr


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_jactionlint_fails_on_an_injected_mistake(tmp_path: Path, mistake: str) -> None:
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    name, old, new = MISTAKES[mistake]
    path = tmp_path / ".github" / "workflows" / name
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{mistake}: the workflow changed, update the injection"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    result = jactionlint(tmp_path)
    assert result.returncode != 0, f"{mistake} went unnoticed:\n{result.stdout}"
    assert name in result.stdout


def test_alert_names_the_pull_request_to_the_newest_compatible_commit(tmp_path: Path) -> None:
    """Master failed twice; the canary moved the pin as far as the queue goes: the issue stays, and says so."""
    url = "https://github.example/team/queue/pull/77"
    out = run_alert(
        tmp_path,
        bump="failure",
        compatible="success",
        compatible_url=url,
        runs=[scheduled_run(49, "failure")],
        reports={"bisect.txt": "first breaking: 9f8e7d6 core/0002-y.patch\n"},
    )
    assert out["result"] == "opened"
    ((_, params),) = writes(out)
    assert f"The pin keeps moving meanwhile: {url}" in params["body"]
    assert "first breaking: 9f8e7d6 core/0002-y.patch" in params["body"]
    # the compatible pull request does not make a failed master a pass: nothing is closed
    issues = [{"number": 12, "body": MARKER}]
    again = tmp_path / "again"
    again.mkdir()
    out = run_alert(
        again,
        bump="failure",
        compatible="success",
        compatible_url=url,
        runs=[scheduled_run(49, "failure")],
        issues=issues,
    )
    assert out["result"] == "updated"
    assert [name for name, _ in writes(out)] == ["issues.update", "issues.createComment"]
    # no compatible commit passed either: the issue says there is no such pull request
    none = tmp_path / "none"
    none.mkdir()
    out = run_alert(none, bump="failure", compatible="skipped", runs=[scheduled_run(49, "failure")])
    ((_, params),) = writes(out)
    assert "No pull request to the newest compatible upstream commit (job: skipped)" in params["body"]
