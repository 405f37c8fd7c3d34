"""The spot-check lifecycle against a stand-in llama-server process (real processes, real HTTP)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from skippy.cli.entries import spot_main
from skippy.core.errors import ModelCheckFailed, SpotCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot import proofs, server
from skippy.spot.report import Provenance, SpotCheckReport, spot_report_of
from skippy.spot.server import port_is_free
from skippy.spot.spotcheck import spot_check
from tests.busy import sigint_raises
from tests.integration import fake_server

pytestmark = pytest.mark.integration

FAST = {"load_timeout": 5, "grace": 1, "poll_interval": 0.05, "request_timeout": 5}


def gone(pid: int) -> bool:
    """The process does not exist (or is a zombie nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


class Rig:
    def __init__(self, root: Path, **spot: object) -> None:
        self.root = root
        self.server = fake_server.install(root / "build" / "cpu-0123abcd" / "bin")
        self.state = root / "state"
        self.model = root / "models" / "m.gguf"
        self.model.parent.mkdir(parents=True)
        self.model.write_bytes(b"GGUF stand-in")
        self.table: dict[str, object] = {
            "build_root": "build",
            "cache_dir": "cache",
            "spot_check": {**FAST, **spot},
        }

    def settings(self, **env: str) -> Settings:
        return Settings.from_table(self.root, self.table, {"PATH": os.defpath, **env})

    def env(self, mode: str = "ready", **extra: str) -> dict[str, str]:
        return {"FAKE_LLAMA_MODE": mode, "FAKE_LLAMA_STATE": str(self.state), **extra}

    def argv(self) -> list[str]:
        return list(json.loads((self.state / "argv.json").read_text()))

    def port(self) -> int:
        argv = self.argv()
        return int(argv[argv.index("--port") + 1])

    def pid(self) -> int:
        return int((self.state / "pid").read_text())

    def check(
        self,
        mode: str = "ready",
        *,
        models: tuple[str, ...] | None = None,
        expect_provenance: Provenance | None = None,
    ) -> SpotCheckReport:
        return spot_check(
            self.settings(),
            self.server,
            models if models is not None else (str(self.model),),
            console=Console(env={}, quiet=True),
            server_env=self.env(mode),
            expect_provenance=expect_provenance,
        )

    def assert_cleaned_up(self) -> None:
        assert wait_gone(self.pid()), "the server process outlived the spot check"
        assert port_is_free(self.port()), "the server's port is still bound"
        child = self.state / "child.pid"
        if child.exists():
            assert wait_gone(int(child.read_text())), "a child of the server outlived it"


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_ready_server_passes_with_timings_and_is_stopped(rig: Rig) -> None:
    report = spot_check(
        rig.settings(),
        rig.server,
        [str(rig.model)],
        console=Console(env={}, quiet=True),
        server_env=rig.env("ready", FAKE_LLAMA_CHILD="1"),
        extra_server_args=["-ngl", "99"],
    )
    assert report.ok
    (result,) = report.results
    assert result.verdict == "pass"
    assert result.tokens == 3
    assert result.content == "OK!"
    assert result.load_seconds is not None and result.load_seconds >= 0.2
    assert result.first_token_seconds is not None and result.completion_seconds is not None
    assert 0 < result.first_token_seconds <= result.completion_seconds
    assert report.version == "1 (fake)"
    argv = rig.argv()
    assert argv[argv.index("--model") + 1] == str(rig.model)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[-2:] == ["-ngl", "99"]
    log = Path(result.log_path or "")
    assert log.parent == rig.root / "build" / "cpu-0123abcd" / "spot-check"
    assert "loading model" in log.read_text()
    rig.assert_cleaned_up()


def test_slow_loading_server_is_waited_for(rig: Rig) -> None:
    result = rig.check("slow").results[0]
    assert result.verdict == "pass"
    assert result.load_seconds is not None and result.load_seconds >= 1.5
    rig.assert_cleaned_up()


def test_server_exiting_early_fails_with_log_tail(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        rig.check("crashing")
    (result,) = spot_report_of(info.value).results
    assert result.verdict == "fail"
    assert "exited with code 3 before it was ready" in result.reason
    assert any("unexpected end of tensor data" in line for line in result.log_lines)
    assert "unexpected end of tensor data" in info.value.render()
    assert info.value.exit_code == ModelCheckFailed.exit_code == 20
    rig.assert_cleaned_up()


def test_failure_line_in_log_fails_even_when_http_answered(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        rig.check("error-in-log")
    (result,) = spot_report_of(info.value).results
    assert result.tokens == 3  # the HTTP side looked fine
    assert result.verdict == "fail"
    assert result.reason == "server log: a ggml assertion failed"
    assert result.log_lines == ["/src/ggml/src/ggml-cpu/ops.cpp:42: GGML_ASSERT(ne0 % 32 == 0) failed"]
    rig.assert_cleaned_up()


def test_hanging_server_times_out_and_is_killed_with_its_children(tmp_path: Path) -> None:
    rig = Rig(tmp_path, load_timeout=1)
    started = time.monotonic()
    with pytest.raises(ModelCheckFailed) as info:
        spot_check(
            rig.settings(),
            rig.server,
            [str(rig.model)],
            console=Console(env={}, quiet=True),
            server_env=rig.env("hanging", FAKE_LLAMA_CHILD="1"),
        )
    (result,) = spot_report_of(info.value).results
    assert "not ready after 1 s (still loading (503))" in result.reason
    assert any("ignoring SIGTERM" in line for line in Path(result.log_path or "").read_text().splitlines())
    assert result.exit_code == -signal.SIGKILL
    assert time.monotonic() - started < 10
    rig.assert_cleaned_up()


def test_answer_without_tokens_fails(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        rig.check("empty")
    assert spot_report_of(info.value).results[0].reason == "the completion generated no token"
    rig.assert_cleaned_up()


def test_error_chunk_in_the_stream_fails(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        rig.check("error-answer")
    reason = spot_report_of(info.value).results[0].reason
    assert "the server answered with an error: The model produced output" in reason
    rig.assert_cleaned_up()


def test_stalled_completion_times_out(tmp_path: Path) -> None:
    rig = Rig(tmp_path, request_timeout=1)
    with pytest.raises(ModelCheckFailed) as info:
        rig.check("stall")
    assert "/v1/chat/completions failed" in spot_report_of(info.value).results[0].reason
    rig.assert_cleaned_up()


def _polled(root: Path) -> bool:
    """The server answered the spot check's /health poll: it is up, and the check waits on it."""
    for log in root.rglob("*.log"):
        with contextlib.suppress(OSError):
            if "GET /health" in log.read_text(encoding="utf-8", errors="replace"):
                return True
    return False


def test_ctrl_c_stops_the_server(tmp_path: Path) -> None:
    rig = Rig(tmp_path, load_timeout=60)

    def interrupt() -> None:
        # a real readiness signal, not a fixed sleep: the (hanging) server has answered a poll
        deadline = time.monotonic() + 30
        while not _polled(rig.root) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    # SIGINT raises KeyboardInterrupt here whatever this process inherited (a background job of
    # a non-interactive shell starts with SIGINT ignored)
    with sigint_raises():
        thread.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                rig.check("hanging")
        finally:
            thread.join()
    assert _polled(rig.root), "the signal came once the server answered the spot check's poll"
    rig.assert_cleaned_up()


def test_several_models_in_one_run_report_each(rig: Rig) -> None:
    missing = rig.root / "nope.gguf"
    with pytest.raises(ModelCheckFailed) as info:
        rig.check(models=(str(rig.model), str(missing)))
    first, second = spot_report_of(info.value).results
    assert first.verdict == "pass"
    assert second.verdict == "fail"
    assert "does not exist" in second.reason
    assert "1 of 2 model(s)" in info.value.what


def test_stale_binary_is_refused_before_starting(rig: Rig) -> None:
    expected = Provenance("a" * 40, "b" * 16)
    with pytest.raises(SpotCheckFailed) as info:
        rig.check(expect_provenance=expected)
    assert "reports no provenance" in info.value.what
    assert info.value.next_step == "rebuild it: nox -s build-cpu"
    assert not (rig.state / "pid").exists(), "a stale binary must not be started"


def test_provenance_mismatch_names_the_value(rig: Rig) -> None:
    expected = Provenance("a" * 40, "b" * 16)
    with pytest.raises(SpotCheckFailed) as info:
        spot_check(
            rig.settings(),
            rig.server,
            [str(rig.model)],
            console=Console(env={}, quiet=True),
            server_env={**rig.env(), "FAKE_LLAMA_PROVENANCE": f"upstream={'a' * 40} queue={'c' * 16}"},
            expect_provenance=expected,
        )
    assert f"queue digest is {'c' * 16}, expected {'b' * 16}" in info.value.what
    assert "upstream is" not in info.value.what


def test_matching_provenance_passes(rig: Rig) -> None:
    expected = Provenance("a" * 40, "b" * 16)
    report = spot_check(
        rig.settings(),
        rig.server,
        [str(rig.model)],
        console=Console(env={}, quiet=True),
        server_env={**rig.env(), "FAKE_LLAMA_PROVENANCE": f"upstream={'a' * 40} queue={'b' * 16}"},
        expect_provenance=expected,
    )
    assert report.provenance == expected


def test_github_step_summary_gets_the_table(rig: Rig) -> None:
    summary = rig.root / "summary.md"
    report = spot_check(
        rig.settings(),
        rig.server,
        [str(rig.model)],
        console=Console(env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}, quiet=True),
        server_env=rig.env(),
    )
    text = summary.read_text()
    assert "### Spot check: passed" in text
    assert f"| `{report.results[0].model}` | pass |" in text


def _project(rig: Rig) -> None:
    spot = "\n".join(f"{k} = {v}" for k, v in FAST.items())
    (rig.root / "pyproject.toml").write_text(
        f'[tool.skippy]\nbuild_root = "build"\ncache_dir = "cache"\n\n[tool.skippy.spot_check]\n{spot}\n'
    )


def _stamp(rig: Rig, upstream: str, queue: str) -> None:
    from skippy.queue import workdir as wd

    git_dir = rig.root / ".deps" / "llama.cpp" / ".git"
    git_dir.mkdir(parents=True, exist_ok=True)
    wd.write_stamp(
        git_dir, wd.Stamp(upstream_sha=upstream, patched_sha="p" * 40, queue_digest=queue, base_commit=upstream)
    )


def test_cli_json_report_and_default_server(rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    _project(rig)
    _stamp(rig, "a" * 40, "d" * 64)
    env = {"PATH": os.defpath, **rig.env(), "FAKE_LLAMA_PROVENANCE": f"upstream={'a' * 40} queue={'d' * 64}"}
    code = spot_main(["--model", str(rig.model), "--json"], env=env, root=rig.root)
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    assert out["server"] == "build/cpu-0123abcd/bin/llama-server"
    assert out["results"][0]["tokens"] == 3
    assert out["results"][0]["compute"]["fingerprint"]["runs"]


def test_cli_checks_provenance_unless_told_not_to(rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    _project(rig)
    stale = {"PATH": os.defpath, **rig.env(), "FAKE_LLAMA_PROVENANCE": f"upstream={'0' * 40} queue={'0' * 64}"}
    # no prepared workdir: nothing to check the binary against, said, not passed
    assert spot_main(["--model", str(rig.model), "--json"], env=stale, root=rig.root) == 13
    out = json.loads(capsys.readouterr().out)
    assert "has no prepare stamp" in out["what"] and "--no-provenance" in out["next"]
    # a stale binary (reports another pin and queue) fails
    _stamp(rig, "a" * 40, "d" * 64)
    assert spot_main(["--model", str(rig.model), "--json"], env=stale, root=rig.root) == 13
    out = json.loads(capsys.readouterr().out)
    assert out["what"].startswith("stale llama-server")
    # --no-provenance checks it as it is, loudly
    assert spot_main(["--model", str(rig.model), "--json", "--no-provenance"], env=stale, root=rig.root) == 0
    captured = capsys.readouterr()
    assert "--no-provenance: the binary is NOT checked" in captured.err
    assert spot_main(["--backend", "vulkan", "--json"], env=stale, root=rig.root) == 13
    assert "no vulkan llama-server build" in json.loads(capsys.readouterr().out)["what"]


def test_cli_failure_exit_code_and_json_carries_the_report(rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    _project(rig)
    env = {"PATH": os.defpath, **rig.env("error-in-log")}
    code = spot_main(
        ["--model", str(rig.model), "--server", str(rig.server), "--json", "--no-provenance"], env=env, root=rig.root
    )
    assert code == ModelCheckFailed.exit_code
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["ok"] is False
    assert out["error"] == "ModelCheckFailed"
    assert out["report"]["results"][0]["reason"] == "server log: a ggml assertion failed"
    assert "GGML_ASSERT" in captured.err


def test_cli_unknown_option_fails_with_json_before_starting_anything(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    _project(rig)
    env = {"PATH": os.defpath, **rig.env()}
    code = spot_main(["--model", str(rig.model), "--modle", "x", "--json"], env=env, root=rig.root)
    assert code == 2
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["error"]) == (False, "SettingsError")
    assert out["what"] == "nox -s spot-check --: unknown option --modle (did you mean --model?); also x"
    assert "--server-arg" in out["details"]
    assert not rig.state.exists(), "no server may start"


def test_children_of_a_crashed_server_are_stopped_too(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed):
        spot_check(
            rig.settings(),
            rig.server,
            [str(rig.model)],
            console=Console(env={}, quiet=True),
            server_env=rig.env("crashing", FAKE_LLAMA_CHILD="1"),
        )
    assert (rig.state / "child.pid").exists()
    rig.assert_cleaned_up()


def test_port_taken_between_probe_and_bind_is_retried(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        ports = iter([busy, server.free_port()])
        monkeypatch.setattr(proofs, "free_port", lambda: next(ports))
        report = rig.check()
    (result,) = report.results
    assert result.verdict == "pass"
    assert result.port != busy
