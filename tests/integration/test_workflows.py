"""Every workflow validated offline with the real tools: the GitHub workflow schema
(check-jsonschema's bundled copy), zizmor's security audits (offline, pedantic
persona, the repository's .github/zizmor.yml), and every nox session and invoke
task (with its --options) a workflow calls checked against the real menus."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from skippy.core import proc
from tests.workflowtools import ROOT, WORKFLOWS, calls

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ZIZMOR_CONFIG = ROOT / ".github" / "zizmor.yml"
ZIZMOR_PERSONA = "pedantic"


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


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
