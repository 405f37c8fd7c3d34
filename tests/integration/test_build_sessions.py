"""The nox menu itself: a backend this host cannot build fails with the reason,
or shows as *skipped* when asked; never as passed."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.entries import build_main
from skippy.compile.backends import registry
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionFn, SessionOutcome, SessionRequest
from skippy.spot.report import SpotCheckReport
from tests.conftest import Project

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def nox(*args: str, **env: str) -> proc.Result:
    merged = {k: v for k, v in os.environ.items() if k != "SKIPPY_SKIP_UNAVAILABLE"}
    merged.update(env)
    return proc.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
        env=merged,
        cwd=ROOT,
        check=False,
        timeout=300,
    )


@pytest.fixture(autouse=True)
def _not_on_macos() -> None:
    if platform.system() == "Darwin":
        pytest.skip("Metal is available on macOS: these tests need a host that cannot build it")


def test_build_metal_fails_with_the_reason() -> None:
    result = nox("-s", "build-metal")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "needs macOS with Xcode command line tools" in text
    assert "xcode-select --install" in text
    assert "was successful" not in text
    # nox's uv probe is not echoed (skippy.cli.noxlog): the sessions run in the project's environment
    assert "uv binary not found" not in text


def test_build_metal_is_skipped_on_request() -> None:
    for args, env in ((("--", "--skip-unavailable"), {}), ((), {"SKIPPY_SKIP_UNAVAILABLE": "1"})):
        result = nox("-s", "build-metal", *args, **env)
        text = result.stdout + result.stderr
        assert result.returncode == 0, text
        assert "Session build-metal skipped" in text
        assert "needs macOS" in text
        assert "was successful" not in text


def test_sessions_are_listed_with_tags() -> None:
    result = nox("-l")
    for backend, entry in registry().items():
        assert f"build-{backend} [build{',gpu' if entry.gpu else ''}]" in result.stdout
    assert "build-cuda [build,gpu]" in result.stdout


def json_report(stdout: str) -> dict[str, object]:
    report = json.loads(stdout)
    assert isinstance(report, dict)
    return report


def test_an_unknown_option_fails_before_any_work_and_json_says_so() -> None:
    """`--no-spotcheck` (a typo) used to reach CMake after prepare had run."""
    result = nox("-s", "build-cpu", "--", "--no-spotcheck", "-DGGML_RPC=ON", "--json")
    assert result.returncode != 0
    report = json_report(result.stdout)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "SettingsError", 2)
    assert report["what"] == "nox -s build-cpu --: unknown option --no-spotcheck (did you mean --no-spot-check?)"
    assert "--no-spot-check" in str(report["details"])
    assert "-D, --define NAME[:TYPE]=VALUE" in str(report["details"])
    # the session stopped before its first step
    assert "probe the cpu toolchain" not in result.stderr
    assert "unknown option --no-spotcheck" in result.stderr


def test_a_backend_that_cannot_build_gives_json_too() -> None:
    result = nox("-s", "build-metal", "--", "--json")
    assert result.returncode != 0
    report = json_report(result.stdout)
    assert (report["ok"], report["error"]) == (False, "ToolchainMissing")
    assert "needs macOS" in str(report["what"])


def test_an_unknown_option_touches_no_checkout(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    code, skipped = build_main("cpu", project.env, root=project.root, args=["-DA=1", "cmake-arg", "--json"])
    assert (code, skipped) == (2, None)
    report = json_report(capsys.readouterr().out)
    assert report["what"] == "nox -s build-cpu --: unexpected argument cmake-arg"
    assert not project.workdir.exists(), "nothing may be prepared before the options are checked"


def _interrupted(request: SessionRequest, settings: Settings, console: Console) -> Any:
    raise KeyboardInterrupt


def _broken(request: SessionRequest, settings: Settings, console: Console) -> Any:
    raise RuntimeError("a bug")


@pytest.mark.parametrize(
    ("session_fn", "expected"),
    [
        (_interrupted, (130, "Interrupted", "interrupted")),
        (_broken, (70, "InternalError", "unexpected RuntimeError: a bug")),
    ],
)
def test_json_on_interrupts_and_unforeseen_exceptions(
    project: Project, capsys: pytest.CaptureFixture[str], session_fn: SessionFn, expected: tuple[int, str, str]
) -> None:
    code, error, what = expected
    assert build_main("cpu", project.env, root=project.root, args=["--json"], session_fn=session_fn) == (code, None)
    out, err = capsys.readouterr()
    report = json_report(out)
    assert (report["ok"], report["error"], report["exit_code"], report["what"]) == (False, error, code, what)
    if error == "InternalError":
        assert "Traceback" in err and "RuntimeError: a bug" in err


def test_json_carries_the_spot_check_report(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    spot = SpotCheckReport(server="bin/llama-server", devices=[], not_run="no CUDA device on this machine")

    def session_fn(request: SessionRequest, settings: Settings, console: Console) -> Any:
        return SessionOutcome(backend="cuda", spot=spot)

    assert build_main("cuda", project.env, root=project.root, args=["--json"], session_fn=session_fn) == (0, None)
    report = json_report(capsys.readouterr().out)
    assert report["ok"] is True
    shown = report["spot_check"]
    assert isinstance(shown, dict)
    assert (shown["ran"], shown["not_run"], shown["devices"]) == (False, "no CUDA device on this machine", [])


def test_invoke_build_runs_the_same_session_with_the_same_options(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    from skippy.cli.entries import build_task_main

    code = build_task_main(project.env, root=project.root, backend="metal", skip_unavailable=True, json=True)
    assert code == 0
    assert "needs macOS" in str(json_report(capsys.readouterr().out)["skipped"])
    assert build_task_main(project.env, root=project.root, jobs="0", workdir_as_is=True, json=True) == 2
    report = json_report(capsys.readouterr().out)
    assert report["what"] == "invoke build: -j/--jobs: wants a positive number of jobs, got '0' (e.g. -j2)"
    assert not project.workdir.exists(), "nothing may be prepared before the options are checked"
