"""A failure's next step fits its cause: a port another process holds is not a patch to fix,
nor is a -D path that does not exist (a real socket, a real CMake on tests/integration/cmake_probe)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.cli.entries import build_main, spot_main
from skippy.compile.builder import execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import plan_build
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core.errors import BuildError, ModelCheckFailed, SettingsError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionOutcome, SessionRequest
from skippy.spot import proofs
from tests.integration.test_spotcheck import FAST, Rig
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"


@pytest.fixture
def holder() -> Iterator[int]:
    """A port on 127.0.0.1 that another process (here: this one) listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _spot_project(tmp_path: Path) -> tuple[Rig, dict[str, str]]:
    rig = Rig(tmp_path / "proj")
    fast = "\n".join(f"{k} = {v}" for k, v in FAST.items())
    (rig.root / "pyproject.toml").write_text(
        f'[project]\nname = "x"\nversion = "0"\n\n[tool.skippy]\nbuild_root = "build"\ncache_dir = "cache"\n\n'
        f"[tool.skippy.spot_check]\n{fast}\n",
        encoding="utf-8",
    )
    return rig, {"PATH": os.defpath, **rig.env()}


def _spot(
    rig: Rig, env: dict[str, str], capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, object]]:
    argv = ["--server", str(rig.server), "--model", str(rig.model), "--no-provenance", "--no-rpc", "--json", *extra]
    code = spot_main(argv, env=env, root=rig.root)
    return code, json.loads(capsys.readouterr().out)


def test_a_port_taken_between_the_probe_and_the_bind_is_named_not_the_patch(
    tmp_path: Path, holder: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rig, env = _spot_project(tmp_path)
    # every free port the check picks is taken before the server binds it (the race, every time)
    monkeypatch.setattr(proofs, "free_port", lambda *_a: holder)
    allowed = (rig.root / "build", rig.root / "cache", rig.state)
    before = tree_state([tmp_path, Path(os.environ["HOME"])], allowed)

    code, report = _spot(rig, env, capsys)

    assert code == ModelCheckFailed.exit_code
    assert report["ok"] is False and report["what"] == f"spot check failed for 1 of 1 model(s): {rig.model}"
    assert report["untouched"] == "the build and the model cache; the server was stopped"
    assert report["next"] == (
        f"find what holds 127.0.0.1:{holder} (`ss -ltnp 'sport = :{holder}'`), stop it, and rerun nox -s spot-check"
    )
    assert "fix the patch" not in str(report["next"])
    (result,) = report["report"]["results"]  # type: ignore[index]
    assert (
        result["reason"] == f"port {holder} on 127.0.0.1 is in use by another process: llama-server could not "
        "bind it (3 attempt(s))"
    )
    assert any("Address already in use" in line for line in result["log_lines"])
    assert written_outside(before, tree_state([tmp_path, Path(os.environ["HOME"])], allowed)) == []


def test_a_port_given_with_server_arg_is_refused_before_the_server_starts(
    tmp_path: Path, holder: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check sets --port itself: a --server-arg one (taken or free) is refused up front, by name
    (tests/integration/test_blamed_flags.py runs it through nox and invoke)."""
    rig, env = _spot_project(tmp_path)
    code, report = _spot(rig, env, capsys, "--server-arg=--port", f"--server-arg={holder}")
    assert code == SettingsError.exit_code
    assert report["next"] == "rerun without `--server-arg --port` and its value: the check picks a free port itself"
    assert not rig.state.exists()


def test_a_model_that_is_not_there_gives_its_own_next_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rig, env = _spot_project(tmp_path)
    rig.model.unlink()
    code, report = _spot(rig, env, capsys)
    assert code == ModelCheckFailed.exit_code
    assert "fix the patch" not in str(report["next"]) and "rebuild" not in str(report["next"])
    assert report["next"] == report["report"]["results"][0]["next_step"]  # type: ignore[index]
    assert report["next"]


def test_a_failing_build_still_points_at_the_patch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rig, env = _spot_project(tmp_path)
    code, report = _spot(rig, {**env, "FAKE_LLAMA_MODE": "crashing"}, capsys)
    assert code == ModelCheckFailed.exit_code
    assert (
        report["next"] == "read the log(s) above, fix the patch, rebuild (nox -s build-cpu) and rerun nox -s spot-check"
    )


def test_a_configure_failing_on_a_missing_define_path_names_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    shutil.copytree(PROBE, src)
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n\n[tool.skippy]\n', encoding="utf-8")
    missing = tmp_path / "nowhere" / "toolchain.cmake"
    home = tmp_path / "home"
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home)}
    plans = []

    def session(request: SessionRequest, settings: Settings, console: Console) -> SessionOutcome:
        """The session's configure and build on the probe tree (no llama.cpp, no prepare)."""
        plan = plan_build(
            request.build,
            settings,
            tree=inspect_tree(src),
            toolchain=probe_toolchain("cpu", settings),
            patched_sha="1" * 40,
        )
        plans.append(plan)
        return SessionOutcome(backend="cpu", build=execute_plan(plan, console))

    allowed = (root / "build", root / ".deps", src, home)
    before = tree_state([tmp_path], allowed)
    try:
        code, _skip = build_main(
            "cpu", env, root=root, args=["--json", f"-DCMAKE_TOOLCHAIN_FILE={missing}"], session_fn=session
        )
    finally:
        for plan in plans:
            stop_cache_server(plan)
    report = json.loads(capsys.readouterr().out)
    assert code == BuildError.exit_code
    assert report["what"] == (
        f"CMake configure failed (cpu): exit code 1: -DCMAKE_TOOLCHAIN_FILE={missing} names a path that does not exist"
    )
    assert report["untouched"] == f"the source tree; the build dir {plans[0].build_dir} is kept for inspection"
    assert report["next"] == (
        "give -DCMAKE_TOOLCHAIN_FILE a path that exists (or drop it: it was given on the command line, in "
        "[tool.skippy.build] or the environment), then rerun `nox -s build-cpu`"
    )
    assert written_outside(before, tree_state([tmp_path], allowed)) == []
    assert not missing.parent.exists()
