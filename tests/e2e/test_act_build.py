"""build.yml's CPU job, run here as written by nektos act in host mode (see
tests/integration/test_act.py for which act and how): its matrix row, `if:` conditions, the
setup, `nox -s build-cpu -- --json`, the assert-ran step and both uploads execute on this machine.

Stand-ins (tests/integration/act_actions) take the place of the actions act cannot fetch:
checkout and setup-python (the workspace and python are already there), cache (restores the
listed paths, the source archives and the model, from the project's own cache dir, as a cache hit
would), github-script (runs the step's JavaScript under node), upload-artifact (copies what matched,
failing as the real one does when nothing did).  The compiler cache: the job's storage secret says
`local` (GitHub's cache service is not here), and the workspace starts with the project's compiler
cache in it, as a self-hosted runner that kept its workspace would: the build is all cache hits.

In the e2e tier because it needs the project's CPU build in the compiler cache (the `cpu_build`
fixture makes it, once per session).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.integration.test_act import act, copy_of_the_repository, ran, stand_ins
from tests.workflowtools import ROOT, WORKFLOW_DIR, load


def test_the_cpu_build_job_runs_through_act(tmp_path: Path, cpu_build: object) -> None:
    repo = copy_of_the_repository(tmp_path / "repo")
    sccache = ROOT / ".deps" / "cache" / "sccache"
    assert sccache.is_dir(), "the CPU build filled the compiler cache"
    (repo / ".deps" / "cache").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(sccache), str(repo / ".deps" / "cache" / "sccache")], check=True, timeout=300)
    workflow = WORKFLOW_DIR / "build.yml"
    artifacts = tmp_path / "artifacts"
    argv = [act(), "push", "-W", ".github/workflows/build.yml", "-j", "build", "--matrix", "key:cpu"]
    argv += ["-P", "ubuntu-24.04=-self-hosted", "--action-offline-mode", "--use-gitignore=false"]
    argv += [*stand_ins(workflow), "--secret", "SKIPPY_CACHE_STORAGE=local"]
    argv += ["--env", f"ACT_CACHE_STORE={ROOT}", "--env", f"ACT_ARTIFACTS={artifacts}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "ACT", "CI", "LLAMA_"))}
    env["HOME"] = str(tmp_path / "home")
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    result = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False, timeout=2400)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-8000:]
    assert "Job succeeded" in out
    steps = load(workflow)["jobs"]["build"]["steps"]
    skipped = {
        "Container packages (git for the checkout and prepare)",
        "Runner packages",
        "Keep the backend's cache folder between runs",
    }
    for step in steps:
        name = str(step["name"]).replace("${{ matrix.session }}", "build-cpu")
        if name in skipped:
            assert f"Main {name}" not in out, f"{name} ran, but its if: excludes the cpu row"
        else:
            assert ran(out, name), f"{name} did not run:\n{out[-4000:]}"
    # the build was the project's own, from the compiler cache, and its spot check ran
    report = json.loads(next((artifacts / "build-cpu-report").glob("build.json")).read_text())
    assert report["ok"] is True and report["skipped"] is None and report["mode"] == "prepared"
    assert report["spot_check"] is not None, "the job's spot check ran"
    assert (artifacts / "build-cpu-binaries" / "llama-server").is_file()
    assert "ran to success: build-cpu" in out
