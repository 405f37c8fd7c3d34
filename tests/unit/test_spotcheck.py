"""Pure parts of the spot check: argv, log scanning, stream parsing, verdicts, provenance, options."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from skippy.cli.commands import command
from skippy.cli.options import SpotCheckOptions, make
from skippy.cli.run import nox_values
from skippy.compile.backends import spec
from skippy.core.errors import SettingsError, SpotCheckFailed
from skippy.core.settings import Settings
from skippy.spot import proofs
from skippy.spot.binaries import backend_of, default_server, parse_provenance, provenance_mismatch, version_line
from skippy.spot.chat import Answer, completion_request, judge, parse_stream, plan_server_argv, scan_log
from skippy.spot.models import ChatFacts
from skippy.spot.report import ModelResult, Options, Provenance, SpotCheckReport, model_check_failed, spot_report_of
from skippy.spot.server import ServerFailure, describe_exit
from skippy.spot.spotcheck import log_dir


def settings(tmp_path: Path, **spot: object) -> Settings:
    table: dict[str, object] = {"build_root": "build", "cache_dir": "cache"}
    if spot:
        table["spot_check"] = spot
    return Settings.from_table(tmp_path, table, {})


def test_server_argv_binds_loopback_and_appends_backend_args(tmp_path: Path) -> None:
    argv = plan_server_argv(tmp_path / "llama-server", tmp_path / "m.gguf", 4242, Options(ctx_size=512), ["-ngl", "99"])
    assert argv[0] == str(tmp_path / "llama-server")
    assert argv[argv.index("--model") + 1] == str(tmp_path / "m.gguf")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "4242"
    assert argv[argv.index("--ctx-size") + 1] == "512"
    assert argv[-2:] == ["-ngl", "99"]


def test_completion_request_is_the_issue_prompt() -> None:
    body = completion_request(Options())
    assert body["messages"] == [{"role": "user", "content": "Say OK"}]
    assert body["max_tokens"] == 5
    assert body["temperature"] == 0
    assert body["stream"] is True


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("ggml_metal_init: metal_library_init: error: shader failed", "Metal shader library failed to build"),
        ("llama_model_load: error loading model: tensor 'x' has wrong shape", "llama.cpp could not load the model"),
        ("srv load_model: failed to load model, '/m.gguf'", "llama.cpp could not load the model"),
        ("gguf_init_from_file: model-open failure", "the model file could not be opened"),
        ("/src/ggml.c:1234: GGML_ASSERT(a->ne[0] == b->ne[0]) failed", "a ggml assertion failed"),
        ("CUDA error: out of memory", "CUDA error"),
        ("ggml_cuda_compute_forward: MUL_MAT failed with error 700", "CUDA error"),
        ("HIP error: invalid device function", "HIP/ROCm error"),
        ("vk::Device::createBuffer: ErrorOutOfDeviceMemory VK_ERROR_OUT_OF_DEVICE_MEMORY", "Vulkan error"),
        ("ggml_vulkan: Device memory allocation of size 1 failed.", "Vulkan error"),
        ("==123==ERROR: AddressSanitizer: heap-buffer-overflow on address", "sanitizer report"),
        ("ggml.c:10:5: runtime error: signed integer overflow", "undefined behaviour (UBSan)"),
    ],
)
def test_known_failure_lines_are_caught(line: str, why: str) -> None:
    assert scan_log(["ok line", line, "another"]) == [(line, why)]


def test_ordinary_server_log_has_no_failure() -> None:
    log = [
        "srv    load_model: loading model '/m.gguf'",
        "ggml_vulkan: Found 1 Vulkan devices:",
        "llama_context: CPU  output buffer size =     1.00 MiB",
        "print_info: file type   = Q4_K - Medium",
        "srv  llama_server: model loaded",
        "W common_chat_peg_parse: unparsed peg-native output",
    ]
    assert scan_log(log) == []


def _events(*chunks: object, start: float = 100.0, step: float = 0.5) -> list[tuple[float, str]]:
    return [(start + step * (i + 1), c if isinstance(c, str) else json.dumps(c)) for i, c in enumerate(chunks)]


def test_stream_first_token_time_and_usage_tokens() -> None:
    events = _events(
        {"choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"content": "O"}}]},
        {"choices": [{"delta": {"content": "K"}}]},
        {"choices": [], "usage": {"completion_tokens": 5}},
        "[DONE]",
    )
    answer = parse_stream(events, started=100.0)
    assert answer == Answer(tokens=5, content="OK", first_token_seconds=1.0, completion_seconds=2.5)


def test_stream_without_usage_counts_timings_then_text_chunks() -> None:
    with_timings = _events({"choices": [{"delta": {"content": "x"}}], "timings": {"predicted_n": 4}}, "[DONE]")
    assert parse_stream(with_timings, 100.0).tokens == 4
    bare = _events({"choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {"content": "b"}}]}, "[DONE]")
    assert parse_stream(bare, 100.0).tokens == 2


def test_stream_error_chunk_is_a_failure() -> None:
    events = _events({"error": {"code": 500, "message": "does not match the expected format"}})
    with pytest.raises(ServerFailure, match="does not match the expected format"):
        parse_stream(events, 100.0)


def test_verdicts() -> None:
    def result() -> ModelResult:
        return ModelResult(model="m", path="m.gguf")

    assert judge(result(), ["fine"], Answer(1, "", 0.1, 0.2)).verdict == "pass"
    assert judge(result(), ["fine"], Answer(0, "OK", 0.1, 0.2)).verdict == "pass"
    empty = judge(result(), ["fine"], Answer(0, "", None, 0.2))
    assert (empty.verdict, empty.reason) == ("fail", "the completion generated no token")
    logged = judge(result(), ["a", "GGML_ASSERT(x) failed", "b"], Answer(5, "OK", 0.1, 0.2))
    assert logged.verdict == "fail"
    assert logged.log_lines == ["GGML_ASSERT(x) failed"]
    early = result()
    early.reason = "llama-server exited with code 1 before it was ready"
    assert judge(early, ["tail"], None).reason == early.reason
    assert judge(early, ["tail"], None).verdict == "fail"


def test_provenance_parsing_and_mismatch() -> None:
    text = "version: 1 (4df29be)\nbuilt with GNU 12.2.0 for Linux x86_64\nskippy: upstream=abc123 queue=d1e2f3\n"
    assert parse_provenance(text) == Provenance("abc123", "d1e2f3")
    assert version_line(text) == "1 (4df29be)"
    assert parse_provenance("version: 1 (x)") is None
    want = Provenance("abc123", "d1e2f3")
    assert provenance_mismatch(want, Provenance("abc123", "d1e2f3")) is None
    assert provenance_mismatch(want, Provenance("zzz", "d1e2f3")) == "upstream is zzz, expected abc123"
    both = provenance_mismatch(want, Provenance("zzz", "yyy"))
    assert both is not None and "upstream is zzz" in both and "queue digest is yyy, expected d1e2f3" in both
    missing = provenance_mismatch(want, None)
    assert missing is not None and "reports no provenance" in missing


def test_backend_and_log_dir_follow_the_build_layout(tmp_path: Path) -> None:
    s = settings(tmp_path)
    server = s.build_root / "vulkan-0a1b2c3d" / "bin" / "llama-server"
    assert backend_of(server, s) == "vulkan"
    assert log_dir(s, server) == s.build_root / "vulkan-0a1b2c3d" / "spot-check"
    elsewhere = tmp_path / "raw" / "bin" / "llama-server"
    assert backend_of(elsewhere, s) == "cpu"
    assert log_dir(s, elsewhere) == s.build_root / "spot-check"


def _touch(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    os.utime(path, (mtime, mtime))
    return path


def test_default_server_prefers_the_newest_cpu_build(tmp_path: Path) -> None:
    s = settings(tmp_path)
    with pytest.raises(SpotCheckFailed, match="no llama-server build under build") as info:
        default_server(s)
    assert info.value.next_step is not None and "nox -s build-cpu" in info.value.next_step
    now = time.time()
    vulkan = _touch(s.build_root / "vulkan-1" / "bin" / "llama-server", now)
    assert default_server(s) == vulkan
    _touch(s.build_root / "cpu-old" / "bin" / "llama-server", now - 100)
    new_cpu = _touch(s.build_root / "cpu-new" / "bin" / "llama-server", now - 50)
    assert default_server(s) == new_cpu
    # a newer build of another workdir under the same build root is not this workdir's
    theirs = _touch(s.build_root / "cpu-theirs" / "bin" / "llama-server", now)
    stamp = {"backend": "cpu", "source_dir": str(tmp_path / "other-workdir")}
    (theirs.parent.parent / "skippy-build-stamp.json").write_text(json.dumps(stamp), encoding="utf-8")
    assert default_server(s) == new_cpu
    stamp["source_dir"] = str(s.workdir)
    (theirs.parent.parent / "skippy-build-stamp.json").write_text(json.dumps(stamp), encoding="utf-8")
    assert default_server(s) == theirs


def test_options_from_settings(tmp_path: Path) -> None:
    assert Options.from_settings(settings(tmp_path)) == Options()
    opts = Options.from_settings(settings(tmp_path, load_timeout=60, ctx_size=2048))
    assert (opts.load_timeout, opts.ctx_size) == (60.0, 2048)
    with pytest.raises(SettingsError, match=r"\[tool.skippy.spot_check\]: unknown key\(s\) load_timout"):
        Options.from_settings(settings(tmp_path, load_timout=60))
    with pytest.raises(SettingsError, match="grace = 'soon': expected a finite number from 0 to 600"):
        Options.from_settings(settings(tmp_path, grace="soon"))
    # a backend's own timeouts (lavapipe compiles its shaders on first use) replace the defaults,
    # and the user's table still wins over them
    vulkan = spec("vulkan").spot_check_timeouts
    assert Options.from_settings(settings(tmp_path), vulkan).request_timeout == vulkan["request_timeout"] > 120
    assert Options.from_settings(settings(tmp_path, request_timeout=30), vulkan).request_timeout == 30.0
    assert spec("cpu").spot_check_timeouts == {}


def test_report_markdown_json_and_failure_message() -> None:
    ok = ModelResult("tiny:llama", "a.gguf", verdict="pass", load_seconds=0.1, first_token_seconds=0.2, tokens=5)
    bad = ModelResult("gemma3-270m", "b.gguf", reason="server log: a ggml assertion failed")
    bad.log_lines = ["GGML_ASSERT(x) failed"]
    report = SpotCheckReport(server="build/cpu-1/bin/llama-server", version="1 (abc)", results=[ok, bad])
    assert not report.ok
    md = report.markdown()
    assert "### Spot check: FAILED" in md
    assert "| `tiny:llama` | pass | 0.10 | 0.20 | - | 5 |  |" in md
    assert "GGML_ASSERT(x) failed" in md
    data = json.loads(json.dumps(report.as_dict()))
    assert [r["verdict"] for r in data["results"]] == ["pass", "fail"]
    err = model_check_failed(report, next_step="nox -s build-cpu")
    assert isinstance(err, SpotCheckFailed) and spot_report_of(err) is report
    assert err.what == "spot check failed for 1 of 2 model(s): gemma3-270m"
    assert err.as_dict()["report"] == report.as_dict()
    assert "GGML_ASSERT(x) failed" in err.render()
    assert not SpotCheckReport(server="x").ok  # nothing checked is not a pass


def parse_args(argv: list[str]) -> SpotCheckOptions:
    return make(SpotCheckOptions, nox_values(command("spot_check"), argv), {})


def test_cli_arguments_repeat() -> None:
    args = parse_args(["--model", "tiny:llama", "--model", "gemma3-270m", "--json", "--server-arg=-ngl"])
    assert args.model == ("tiny:llama", "gemma3-270m")
    assert args.json is True
    assert args.server_arg == ("-ngl",)
    assert parse_args([]).model == ()
    assert parse_args(["-v"]).verbose is True


def test_exit_descriptions_name_signals() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-11) == "was killed by SIGSEGV (exit code -11)"
    assert describe_exit(-9) == "was killed by SIGKILL (exit code -9)"


@pytest.mark.parametrize(
    "data",
    [
        b"not a model\n",  # no GGUF magic
        b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little"),  # a header cut short
        b"",
    ],
)
def test_a_file_gguf_cannot_read_has_no_chat_facts(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    assert proofs.model_chat_facts(path) == ChatFacts(architecture=None, has_template=True)


def test_a_bug_reading_the_chat_facts_is_not_taken_for_an_unreadable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_path: Path) -> ChatFacts:
        raise AttributeError("a bug")

    monkeypatch.setattr(proofs, "chat_facts", broken)
    with pytest.raises(AttributeError, match="a bug"):
        proofs.model_chat_facts(tmp_path / "m.gguf")
