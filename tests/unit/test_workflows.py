"""The GitHub workflows, read as data: what each job proves, the build matrix against
the backend registry, least privilege, pinned actions, and no logic of their own.
(The schema check, zizmor and the session/task cross-check against the real nox
and invoke menus are in tests/integration/test_workflows.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from skippy.cli.build import session_request
from skippy.cli.entries import session_options
from skippy.compile.backends import matrix, registry
from skippy.compile.backends.cuda_toolkit import TOOLKIT_ENV, resolve_toolkit_choice
from skippy.compile.cache import ENV_VAR as CACHE_STORAGE_ENV
from skippy.compile.cache import reachable, select_storage
from skippy.core.settings import Settings
from skippy.flows.build_session import SessionRequest
from tests.workflowtools import (
    WORKFLOW_DIR,
    WORKFLOWS,
    calls,
    commands,
    expand,
    load,
    matrix_entries,
    steps,
    uses,
)
from tooling.ci import COMMANDS

BUILD = WORKFLOW_DIR / "build.yml"
CANARY = WORKFLOW_DIR / "canary.yml"
CI = WORKFLOW_DIR / "ci.yml"

#: the first words a ``run:`` step may start with: the workflows only install and call
ALLOWED_COMMANDS = (
    (".ci/setup",),
    ("nox",),
    ("invoke",),
    ("python", "-m", "tooling.ci"),
    ("python", "-m", "pip", "install"),
    ("mkdir", "-p"),
    ("apt-get", "update"),
    ("apt-get", "install"),
    ("sudo", "apt-get", "update"),
    ("sudo", "apt-get", "install"),
    # a matrix value split into one word per package or option (then quoted: "${words[@]}")
    ("read", "-r", "-a"),
    # ci.yml's lint job: rhysd's actionlint release, fetched, checked against its sha256, run
    ("archive=$RUNNER_TEMP/actionlint.tar.gz",),
    ("curl", "--fail"),
    ("echo", "$ACTIONLINT_SHA256  $archive"),
    ("sha256sum", "--check", "--strict", "-"),
    ("tar", "-xzf", "$archive"),
    ("$RUNNER_TEMP/actionlint",),
)


def test_the_three_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "build.yml", "canary.yml"}


def build_entries() -> list[dict[str, Any]]:
    return matrix_entries(load(BUILD)["jobs"]["build"])


def test_the_build_matrix_is_generated_from_the_registry_and_up_to_date() -> None:
    text = BUILD.read_text(encoding="utf-8")
    # the committed workflow is what the generator writes (else: python -m skippy.compile.backends.matrix)
    assert matrix.rewrite(text) == text
    entries = build_entries()
    assert entries == matrix.rows()
    # every backend of the registry has a job; keys are unique (the artifacts are named by them)
    assert {e["backend"] for e in entries} == set(registry())
    assert len({e["key"] for e in entries}) == len(entries)
    for e in entries:
        assert e["session"] == registry()[e["backend"]].session
        assert e["session"] in e["title"]
    strategy = load(BUILD)["jobs"]["build"]["strategy"]
    assert strategy["fail-fast"] is False
    # the build step gets every variable a row sets, from that row
    (build,) = _building_steps(BUILD, "build")
    for name in matrix.session_env():
        assert build.step["env"][name] == f"${{{{ matrix.{name} }}}}"


def test_matrix_values_read_back_as_the_same_text() -> None:
    for value in ("ubuntu-24.04", "", "1", "off", "1.5", "a: b", "x # y", "--no-spot-check -DX=1"):
        assert YAML(typ="safe", pure=True).load(f"k: {matrix._scalar(value)}\n") == {"k": value}, value


def test_a_stale_matrix_is_caught_and_rewritten(tmp_path: Any) -> None:
    workflow = tmp_path / "build.yml"
    text = BUILD.read_text(encoding="utf-8")
    workflow.write_text(text.replace("runs-on: macos-15", "runs-on: macos-13"), encoding="utf-8")
    assert matrix.main([str(workflow), "--check"]) == 1
    assert matrix.main([str(workflow)]) == 0
    assert workflow.read_text(encoding="utf-8") == text
    assert matrix.main([str(workflow), "--check"]) == 0
    # without its markers the file is refused and left as it is
    bare = tmp_path / "bare.yml"
    bare.write_text("jobs: {}\n", encoding="utf-8")
    assert matrix.main([str(bare)]) == 2
    assert bare.read_text(encoding="utf-8") == "jobs: {}\n"


def parsed_posargs(entry: dict[str, Any], tmp_path: Path) -> SessionRequest:
    """What the build session is asked by a job's posargs, as its own parser reads them."""
    options = session_options(str(entry.get("posargs", "")).split(), {})
    return session_request(options, Settings.from_table(tmp_path, {}, {}))


def test_each_job_title_says_whether_it_spot_checks(tmp_path: Path) -> None:
    for entry in build_entries():
        # the build session's own parser decides whether the posargs turn the spot check off
        parsed = parsed_posargs(entry, tmp_path)
        assert parsed.skip_unavailable is False
        title = entry["title"]
        if parsed.spot_check:
            assert "spot check" in title and "build only" not in title, title
        elif parsed.upstream_tests:
            # the row that runs upstream's tests says so; its spot check is the plain CPU row's
            assert "build only" in title and "upstream's tests" in title, title
        else:
            assert "build only" in title and "no GPU" in title, title


@pytest.mark.parametrize(
    ("backend", "spot_check", "where"),
    [
        ("cpu", True, "ubuntu"),
        ("vulkan", True, "ubuntu"),
        ("metal", True, "macos"),
        ("cuda", False, "ubuntu"),
        ("rocm", False, "rocm/dev-"),
    ],
)
def test_each_backend_runs_where_it_can_and_spot_checks_when_there_is_a_device(
    backend: str, spot_check: bool, where: str, tmp_path: Path
) -> None:
    (entry,) = [e for e in build_entries() if e["key"] == backend]
    # the build session's own parser decides whether the posargs turn the spot check off
    parsed = parsed_posargs(entry, tmp_path)
    assert parsed.spot_check is spot_check
    assert parsed.skip_unavailable is False
    title = entry["title"]
    if spot_check:
        assert "spot check" in title
        assert "build only" not in title
    else:
        assert "build only" in title
        assert "no GPU" in title
    runner = str(entry.get("container") or entry["runs-on"])
    assert runner.startswith(where)
    if backend == "metal":
        # arm64: macos-14 and later are Apple silicon; macos-13 was the last Intel image
        assert int(re.sub(r"\D", "", entry["runs-on"])) >= 14


def test_vulkan_installs_mesa_and_the_headers_on_the_runner() -> None:
    (entry,) = [e for e in build_entries() if e["backend"] == "vulkan"]
    assert set(entry["apt"].split()) >= {"glslc", "libvulkan-dev", "spirv-headers", "mesa-vulkan-drivers"}


def test_every_nox_call_is_followed_by_assert_ran_for_the_same_sessions() -> None:
    for path in (CI, BUILD):
        by_job: dict[str, list[tuple[str, str, list[str]]]] = {}
        for step in steps(path):
            for argv in commands(str(step.step.get("run", ""))):
                if argv[0] == "nox":
                    report = argv[argv.index("--report") + 1]
                    tail = argv[argv.index("-s") + 1 :]
                    words = tail[: tail.index("--")] if "--" in tail else tail
                    sessions = [v for w in words for v in expand(w, step)]
                    by_job.setdefault(step.job_id, []).append(("nox", report, sessions))
                if argv[:4] == ["python", "-m", "tooling.ci", "assert-ran"]:
                    sessions = [v for w in argv[5:] for v in expand(w, step)]
                    by_job.setdefault(step.job_id, []).append(("assert", argv[4], sessions))
        assert set(by_job) == set(load(path)["jobs"]), path.name
        for job_id, seen in by_job.items():
            assert [k for k, _, _ in seen] == ["nox", "assert"], f"{path.name}:{job_id}: {seen}"
            (_, ran_report, ran), (_, checked_report, checked) = seen
            assert ran_report == checked_report, f"{path.name}:{job_id}: report paths differ"
            assert ran == checked, f"{path.name}:{job_id}: runs {ran}, asserts {checked}"


def test_the_tests_job_runs_the_readme_command_per_tier() -> None:
    tiers = matrix_entries(load(CI)["jobs"]["tests"])
    assert {t["markers"] for t in tiers} == {"not e2e", "e2e"}
    assert {c.name for c in calls(CI) if c.kind == "nox"} == {"lint", "tests"}


def test_build_artifact_names_carry_the_matrix_key() -> None:
    names = [s.step["with"]["name"] for s in steps(BUILD) if "upload-artifact" in str(s.step.get("uses", ""))]
    assert len(names) == 2
    # the key, not the backend: the two CPU rows would otherwise upload under one name
    assert all("${{ matrix.key }}" in n for n in names)
    assert len(set(names)) == len(names)


def test_caches_cover_pip_and_the_downloads_and_the_tests_compiler_cache() -> None:
    for path in WORKFLOWS:
        wf_steps = list(steps(path))
        pythons = [s for s in wf_steps if "setup-python" in str(s.step.get("uses", ""))]
        assert all(s.step["with"]["cache"] == "pip" for s in pythons), path.name
        if path == CI:
            wf_steps = [s for s in wf_steps if s.job_id == "tests"]
        if path == CANARY:
            wf_steps = [s for s in wf_steps if s.job_id == "bump"]
        cached = " ".join(
            str(s.step["with"]["path"]) for s in wf_steps if "actions/cache" in str(s.step.get("uses", ""))
        )
        for folder in (".deps/cache/archives", ".deps/cache/models"):
            assert folder in cached, f"{path.name}: {folder} not cached"
        # the builds share sccache's objects through the GitHub Actions cache, not a saved directory;
        # the test tiers keep their own local store (the tests choose their cache storage themselves)
        assert (".deps/cache/sccache" in cached) is (path == CI), path.name


#: the workflows and jobs that build llama.cpp through skippy's build (nox build-*, invoke pin-bump)
BUILD_JOBS = ((BUILD, "build"), (CANARY, "bump"))
#: what the GitHub Actions cache storage needs, besides SCCACHE_GHA_ENABLED (sccache's docs/GHA.md)
GHA_RUNTIME = ("ACTIONS_RESULTS_URL", "ACTIONS_RUNTIME_TOKEN")
_SECRET_OR_DEFAULT = re.compile(r"^\$\{\{\s*secrets\.(\w+)\s*\|\|\s*'([^']*)'\s*\}\}$")


def _building_steps(path: Any, job_id: str) -> list[Any]:
    found = []
    for step in steps(path):
        if step.job_id != job_id:
            continue
        argv = commands(str(step.step.get("run", "")))
        if any(a[:1] == ["nox"] or a[:2] == ["invoke", "pin-bump"] for a in argv):
            found.append(step)
    return found


@pytest.mark.parametrize(("path", "job_id"), BUILD_JOBS, ids=lambda v: getattr(v, "name", v))
def test_builds_keep_compiler_objects_in_the_github_actions_cache(path: Any, job_id: str) -> None:
    # the canary builds twice after a failed master: the newest compatible commit too; each the same way
    for build in _building_steps(path, job_id):
        _check_the_cache_choice(path, job_id, build)


def _check_the_cache_choice(path: Any, job_id: str, build: Any) -> None:
    # one variable: the repository secret when a team sets it, else the GitHub Actions cache
    m = _SECRET_OR_DEFAULT.match(build.step["env"][CACHE_STORAGE_ENV])
    assert m, build.step["env"][CACHE_STORAGE_ENV]
    assert m.groups() == (CACHE_STORAGE_ENV, "gha")
    # an earlier step of the same job hands the runtime's cache URL and token to the run steps
    job_steps = list(load(path)["jobs"][job_id]["steps"])
    index = job_steps.index(build.step)
    exports = [
        s
        for s in job_steps[:index]
        if str(s.get("uses", "")).startswith("actions/github-script@")
        and all(
            f"'{name}'" in s["with"]["script"] and "core.exportVariable" in s["with"]["script"] for name in GHA_RUNTIME
        )
    ]
    assert len(exports) == 1, f"{path.name}:{job_id}: no step exports {GHA_RUNTIME} before the build"
    assert "core.setSecret" in exports[0]["with"]["script"]


def test_the_gha_storage_the_workflows_choose_is_usable_with_the_runtime_variables_and_falls_back_without() -> None:
    runtime = {"ACTIONS_RESULTS_URL": "https://results.example/", "ACTIONS_RUNTIME_TOKEN": "t0ken"}
    storage = select_storage(None, {CACHE_STORAGE_ENV: "gha", **runtime})
    assert (storage.kind, storage.env.get("SCCACHE_GHA_ENABLED"), storage.unusable) == ("gha", "true", None)
    assert "t0ken" not in storage.description and "t0ken" in storage.secrets
    # outside a job (or without the export step): a warning and a local build, never a failed one
    bare = select_storage(None, {CACHE_STORAGE_ENV: "gha"})
    assert bare.kind == "gha"
    assert reachable(bare) == bare.unusable
    assert bare.unusable and "ACTIONS_RUNTIME_TOKEN" in bare.unusable


def test_the_cpu_runs_on_arm64_too_with_the_spot_check(tmp_path: Path) -> None:
    (arm,) = [e for e in build_entries() if e["key"] == "cpu-arm64"]
    assert arm["backend"] == "cpu" and arm["runs-on"] == "ubuntu-24.04-arm" and arm["container"] == ""
    assert parsed_posargs(arm, tmp_path).spot_check is True
    assert "arm64" in arm["title"] and "spot check" in arm["title"]


def test_every_job_that_lints_tests_or_builds_on_a_runner_uses_the_setup_of_ci_run() -> None:
    for path in WORKFLOWS:
        for job_id, job in load(path)["jobs"].items():
            scripts = [str(s.get("run", "")) for s in job["steps"]]
            runs_project = any(
                a[:1] == ["nox"] or a[:2] == ["invoke", "pin-bump"] for script in scripts for a in commands(script)
            )
            if not runs_project:
                continue
            setups = [a for script in scripts for a in commands(script) if a[:1] == [".ci/setup"]]
            assert setups, f"{path.name}:{job_id}: runs the project without .ci/setup"
            assert not [a for s in scripts for a in commands(s) if a[:4] == ["python", "-m", "pip", "install"]]
    # the test tiers get the whole setup (system packages included) and run as root, as .ci/run does
    tests = load(CI)["jobs"]["tests"]
    argv = [a for s in tests["steps"] for a in commands(str(s.get("run", "")))]
    assert [".ci/setup"] in argv
    (run_tests,) = [str(s["run"]) for s in tests["steps"] if "nox --report" in str(s.get("run", ""))]
    assert run_tests.startswith(".ci/as-root nox ")
    run_script = (WORKFLOW_DIR.parents[1] / ".ci" / "run").read_text(encoding="utf-8")
    assert [".ci/setup"] in commands(run_script) and ["nox", "-s", "lint", "tests"] in commands(run_script)


def test_the_canary_opens_a_pull_request_to_the_newest_compatible_commit_when_master_fails() -> None:
    wf = load(CANARY)
    bump = wf["jobs"]["bump"]
    by_id = {s.get("id"): s for s in bump["steps"] if s.get("id")}
    step = by_id["compatible"]
    assert step["if"] == "${{ failure() && steps.bump.outcome == 'failure' }}"
    argv = commands(step["run"])
    assert argv[0] == ["invoke", "pin-bump", "--newest-compatible"]
    # its body: pin-bump's Markdown, then bisect's result (the first breaking commit and patch)
    assert argv[1][:4] == ["python", "-m", "tooling.ci", "publish"] and argv[1][-2:] == [
        "--append-to",
        ".deps/ci/compatible-body.md",
    ]
    assert argv[1][5] == ".deps/ci/bisect.txt"
    assert bump["steps"].index(by_id["bisect"]) < bump["steps"].index(step)
    assert bump["outputs"]["compatible"] == "${{ steps.compatible.outcome }}"
    job = wf["jobs"]["compatible-pull-request"]
    assert job["needs"] == "bump" and "needs.bump.outputs.compatible == 'success'" in job["if"]
    (create,) = [s for s in job["steps"] if "create-pull-request" in str(s.get("uses"))]
    assert create["with"]["body-path"].endswith("/compatible-body.md")
    (main_pr,) = [s for s in wf["jobs"]["pull-request"]["steps"] if "create-pull-request" in str(s.get("uses"))]
    assert create["with"]["branch"] != main_pr["with"]["branch"]
    (pin,) = [s for s in job["steps"] if s.get("with", {}).get("name") == "canary-compatible-pin"]
    (upload,) = [s for s in bump["steps"] if s.get("with", {}).get("name") == "canary-compatible-pin"]
    assert "steps.compatible.outcome == 'success'" in upload["if"]
    assert pin["with"]["path"] == "skippy/llama_cpp"


def test_cuda_builds_with_the_wheel_toolkit_on_a_plain_runner() -> None:
    (entry,) = [e for e in build_entries() if e["backend"] == "cuda"]
    assert entry["container"] == ""
    assert entry["runs-on"].startswith("ubuntu-")
    (build,) = _building_steps(BUILD, "build")
    m = re.fullmatch(r"\$\{\{\s*matrix\.([\w-]+)\s*\}\}", build.step["env"][TOOLKIT_ENV])
    assert m, build.step["env"][TOOLKIT_ENV]
    # each job's environment, as skippy reads it: wheels for CUDA, the default (auto) elsewhere
    for e in build_entries():
        choice = resolve_toolkit_choice({}, {TOOLKIT_ENV: str(e.get(m.group(1), ""))})
        assert choice == ("wheels" if e["backend"] == "cuda" else "auto"), e["backend"]
    # build only, so the artifact gate (the backend's symbol in the binary) is what proves CUDA is in it
    assert "--no-spot-check" in str(entry["posargs"]).split()


#: the only jobs that write, and exactly what each holds
WRITERS = {
    ("canary.yml", "pull-request"): {"contents": "write", "pull-requests": "write"},
    ("canary.yml", "compatible-pull-request"): {"contents": "write", "pull-requests": "write"},
    ("canary.yml", "alert"): {"actions": "read", "issues": "write"},
}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege(path: Any) -> None:
    wf = load(path)
    assert wf["permissions"] == {}
    for job_id, job in wf["jobs"].items():
        grants = job.get("permissions")
        assert isinstance(grants, dict), f"{job_id}: no job-level permissions"
        writes = {k for k, v in grants.items() if v == "write"}
        if writes:
            assert grants == WRITERS.get((path.name, job_id)), f"{path.name}:{job_id}: {grants}"
        else:
            assert grants == {"contents": "read"}


@pytest.mark.parametrize(("workflow", "job_id"), sorted(WRITERS))
def test_jobs_that_write_run_no_project_code(workflow: str, job_id: str) -> None:
    job = load(WORKFLOW_DIR / workflow)["jobs"][job_id]
    assert not [s for s in job["steps"] if "run" in s], "no shell step"
    used = [str(s["uses"]).partition("@")[0] for s in job["steps"]]
    # no local action, no interpreter set up, no pip: only GitHub's and the PR action's own code runs
    assert set(used) <= {
        "actions/checkout",
        "actions/download-artifact",
        "actions/github-script",
        "peter-evans/create-pull-request",
    }, used
    scripts = [str(s.get("with", {}).get("script", "")) for s in job["steps"]]
    assert not [s for s in scripts if "exec" in s or "child_process" in s or "require('./" in s]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_checkouts_do_not_persist_credentials(path: Any) -> None:
    checkouts = [s for s in steps(path) if str(s.step.get("uses", "")).startswith("actions/checkout@")]
    assert checkouts
    for s in checkouts:
        assert s.step["with"]["persist-credentials"] is False, s.label


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_with_its_version(path: Any) -> None:
    found = uses(path)
    assert found
    for ref, comment in found:
        action, _, sha = ref.partition("@")
        assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{path.name}: {ref} is not pinned to a full commit SHA"
        assert re.fullmatch(r"v\d+(\.\d+){0,2}", comment), f"{path.name}: {action} has no version comment"


#: the first major release of each action that runs on node24 (hosted runners no longer provide node20)
NODE24_SINCE = {
    "actions/checkout": 5,
    "actions/setup-python": 6,
    "actions/cache": 5,
    "actions/upload-artifact": 6,
    "actions/download-artifact": 6,
    "peter-evans/create-pull-request": 8,
    # v8.0.0 (ed597411d8f9...): action.yml `runs.using: node24`
    "actions/github-script": 8,
}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_a_node24_release(path: Any) -> None:
    for ref, comment in uses(path):
        action = ref.partition("@")[0]
        assert action in NODE24_SINCE, f"{path.name}: {action} is not known to run on node24; add it here once checked"
        major = int(comment.removeprefix("v").split(".")[0])
        assert major >= NODE24_SINCE[action], f"{path.name}: {action} {comment} declares node20"


def test_one_version_per_action_across_the_workflows() -> None:
    pins: dict[str, set[str]] = {}
    for path in WORKFLOWS:
        for ref, comment in uses(path):
            action, _, sha = ref.partition("@")
            pins.setdefault(action, set()).add(f"{sha} {comment}")
    assert {a: len(v) for a, v in pins.items() if len(v) > 1} == {}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_run_steps_only_install_and_call_the_menus(path: Any) -> None:
    for step in steps(path):
        script = step.step.get("run")
        if not script:
            continue
        assert "${{" not in str(script), f"{step.label}: expressions go through env, never into the script"
        for argv in commands(str(script)):
            assert any(tuple(argv[: len(p)]) == p for p in ALLOWED_COMMANDS), f"{step.label}: {argv}"


def test_skippy_ci_commands_exist() -> None:
    used = {c.name for path in WORKFLOWS for c in calls(path) if c.kind == "tooling.ci"}
    assert used
    assert used <= set(COMMANDS)


def test_the_canary_is_scheduled_and_manual_and_bumps_with_triage_and_bisect_on_failure() -> None:
    wf = load(CANARY)
    assert set(wf["on"]) == {"schedule", "workflow_dispatch"}
    bump = wf["jobs"]["bump"]
    by_id = {s.get("id"): s for s in bump["steps"] if s.get("id")}
    assert commands(by_id["bump"]["run"])[-1][:2] == ["invoke", "pin-bump"]
    for step_id, task in (("triage", ["invoke", "triage", "--latest"]), ("bisect", ["invoke", "bisect"])):
        assert commands(by_id[step_id]["run"])[0] == task
        assert by_id[step_id]["if"] == "${{ failure() && steps.bump.outcome == 'failure' }}"
    pr = wf["jobs"]["pull-request"]
    assert pr["needs"] == "bump"
    (create,) = [s for s in pr["steps"] if "create-pull-request" in str(s.get("uses"))]
    assert create["with"]["add-paths"] == "skippy/llama_cpp/upstream.txt"
    assert create["with"]["body-path"].endswith("/pr-body.md")


def test_the_canary_alert_runs_after_every_finished_run_from_the_reports_artifact_without_a_checkout() -> None:
    wf = load(CANARY)
    alert = wf["jobs"]["alert"]
    assert alert["needs"] == ["bump", "pull-request", "compatible-pull-request"]
    # failed jobs upstream must not skip it (a failure is what it reports); a cancelled run decides nothing
    assert alert["if"] == "${{ !cancelled() }}"
    uses_ = [str(s.get("uses", "")).partition("@")[0] for s in alert["steps"]]
    assert uses_ == ["actions/download-artifact", "actions/github-script"]
    download, script = alert["steps"]
    # the artifact the bump job uploads on every outcome, with the triage and bisect output in it
    (upload,) = [s for s in wf["jobs"]["bump"]["steps"] if s.get("name") == "Upload the canary report"]
    assert upload["if"] == "${{ always() }}"
    assert download["with"]["name"] == upload["with"]["name"] == "canary-report"
    assert download.get("continue-on-error") is True
    env = script["env"]
    assert env["REPORT_DIR"] == download["with"]["path"]
    assert env["BUMP_RESULT"] == "${{ needs.bump.result }}"
    assert env["PR_RESULT"] == "${{ needs.pull-request.result }}"
    body = script["with"]["script"]
    # the decision reads the previous *scheduled* run, and only scheduled failures count
    assert "event: 'schedule'" in body and "context.eventName !== 'schedule'" in body
    for produced in ("triage.txt", "bisect.txt"):
        assert produced in body
        (step,) = [s for s in wf["jobs"]["bump"]["steps"] if f"> .deps/ci/{produced}" in str(s.get("run", ""))]
        assert step["if"] == "${{ failure() && steps.bump.outcome == 'failure' }}"


def test_commands_splits_scripts_like_a_shell() -> None:
    script = 'mkdir -p .deps/ci\nnox --report r.json -s "$SESSION" -- --json $POSARGS > out.json  # note\n'
    assert commands(script) == [
        ["mkdir", "-p", ".deps/ci"],
        ["nox", "--report", "r.json", "-s", "$SESSION", "--", "--json", "$POSARGS"],
    ]
    assert commands("a && b | c; d \\\n  e") == [["a"], ["b"], ["c"], ["d", "e"]]
