"""The block every build and spot check ends with: each proof with its verdict (and why one
was not run), the binaries, and a run line that starts the server on the model it loaded."""

from __future__ import annotations

import io
from pathlib import Path

from skippy.compile.builder import BuildReport
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionOutcome, session_ending
from skippy.spot.compute import ComputeResult
from skippy.spot.fingerprint import Agreement
from skippy.spot.report import ModelResult, Proof, Provenance, SpotCheckReport, spot_proofs

UP, DIGEST = "a" * 40, "d" * 64


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _report(tmp_path: Path) -> BuildReport:
    bin_dir = tmp_path / "build" / "cpu-1" / "bin"
    return BuildReport(
        backend="cpu",
        build_dir=bin_dir.parent,
        configured=False,
        configure_reason="up to date",
        configure_seconds=0.0,
        build_seconds=0.1,
        compiled=0,
        steps=1,
        binaries={"llama-server": bin_dir / "llama-server", "ggml-rpc-server": bin_dir / "ggml-rpc-server"},
        cache=None,
    )


def _spot(model: Path) -> SpotCheckReport:
    agreement = Agreement(status="agrees", tolerance=0.05, max_logprob_delta=0.0123)
    rpc_agreement = {"status": "agrees", "max_logprob_delta": 0.191}
    compute = ComputeResult(
        agreement=agreement,
        rpc={"ok": True, "device": "19/19 layers on RPC0", "agreement": rpc_agreement, "reason": ""},
    )
    result = ModelResult(
        model="gemma3-270m", path=str(model), verdict="pass", content=" Paris", tokens=5, completion_seconds=0.4
    )
    result.compute = compute
    return SpotCheckReport(
        server="bin/llama-server", provenance=Provenance(UP, DIGEST), expected=Provenance(UP, DIGEST), results=[result]
    )


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_table(tmp_path, {}, {"PATH": str(tmp_path)})


def test_the_ending_says_every_proof_and_a_run_line_on_the_loaded_model(tmp_path: Path) -> None:
    model = tmp_path / "cache" / "models" / "gemma-3-270m-it-Q8_0.gguf"
    outcome = SessionOutcome(
        backend="cpu",
        build=_report(tmp_path),
        spot=_spot(model),
        proofs=(Proof("artifact gate", "pass", "llama-server contains its backend (ggml_backend_cpu_reg)"),),
    )
    ending = session_ending(outcome, _settings(tmp_path))
    assert [(p.name, p.verdict) for p in ending.proofs] == [
        ("artifact gate", "pass"),
        ("provenance", "pass"),
        ("chat answer", "pass"),
        ("fingerprint", "pass"),
        ("RPC", "pass"),
    ]
    out = Console(env={}, stream=io.StringIO())
    ending.show(out)
    text = out.stream.getvalue()  # type: ignore[attr-defined]
    lines = text.splitlines()
    assert lines[0] == "build-cpu: every proof made holds"
    assert "✓ fingerprint    agrees with the CPU reference (largest difference 0.012)" in text
    assert "✓ RPC            19/19 layers on RPC0 (difference 0.191)" in text
    assert f"✓ provenance     upstream {UP[:12]}, queue digest {DIGEST[:12]}" in text
    assert "✓ chat answer    gemma3-270m answered 'Paris' (5 token(s) in 0.40 s)" in text
    assert "run: build/cpu-1/bin/llama-server --model cache/models/gemma-3-270m-it-Q8_0.gguf --port 8080" in text
    assert "<model.gguf>" not in text
    assert "\033[" not in text, "no colour when not on a terminal"
    assert ending.as_dict()["proofs"][3] == {
        "name": "fingerprint",
        "verdict": "pass",
        "detail": "agrees with the CPU reference (largest difference 0.012)",
        "kept": False,
        "kept_from": None,
    }


def test_what_was_not_run_says_why_and_a_terminal_gets_colour(tmp_path: Path) -> None:
    outcome = SessionOutcome(
        backend="cpu",
        build=_report(tmp_path),
        proofs=(Proof("artifact gate", "pass", "contains its backend"),),
        spot_not_run="--no-spot-check",
    )
    ending = session_ending(outcome, _settings(tmp_path))
    assert [p.verdict for p in ending.proofs] == ["pass", "not run", "not run", "not run", "not run"]
    terminal = Terminal()
    ending.show(Console(env={}, stream=terminal))
    shown = terminal.getvalue()
    assert "\033[32m✓\033[0m" in shown and "\033[33m-\033[0m" in shown
    assert "fingerprint    not run: --no-spot-check" in shown
    plain = Terminal()
    ending.show(Console(env={"NO_COLOR": "1"}, stream=plain))
    assert "\033[" not in plain.getvalue()


def test_a_difference_is_a_failed_proof(tmp_path: Path) -> None:
    spot = _spot(tmp_path / "m.gguf")
    spot.results[0].compute.rpc = {"ok": False, "device": "", "agreement": None, "reason": "the server exited"}
    outcome = SessionOutcome(backend="cpu", build=_report(tmp_path), spot=spot)
    ending = session_ending(outcome, _settings(tmp_path))
    assert not ending.ok
    assert ending.title == "build-cpu: FAILED"
    assert ("RPC", "fail", "the server exited") in [(p.name, p.verdict, p.detail) for p in ending.proofs]


def test_a_spot_check_ends_with_the_same_proofs_and_a_run_line(tmp_path: Path) -> None:
    from skippy.cli.spot import spot_ending

    settings = _settings(tmp_path)
    server = tmp_path / "build" / "cpu-1" / "bin" / "llama-server"
    ending = spot_ending(_spot(tmp_path / "models" / "m.gguf"), settings, server)
    assert ending.title == "spot check of bin/llama-server: every proof made holds"
    assert [p.name for p in ending.proofs] == ["provenance", "chat answer", "fingerprint", "RPC"]
    assert ending.tail == (
        "run: build/cpu-1/bin/llama-server --model models/m.gguf --port 8080  (then http://127.0.0.1:8080)",
    )


def test_a_tiny_model_without_a_reference_leaves_the_fingerprint_proof_to_the_others(tmp_path: Path) -> None:
    spot = _spot(tmp_path / "m.gguf")
    tiny = ModelResult(model="tiny:qwen2", path=str(tmp_path / "t.gguf"), verdict="pass", content=" x", tokens=5)
    tiny.compute = ComputeResult(agreement=Agreement(status="no-reference", tolerance=0.05))
    spot.results.append(tiny)
    proofs = {p.name: p for p in spot_proofs(spot)}
    assert proofs["fingerprint"].verdict == "pass"
    assert "tiny:qwen2" not in proofs["fingerprint"].detail
    # alone, a model without a reference is not a pass
    spot.results[:] = [tiny]
    assert {p.name: p.verdict for p in spot_proofs(spot)}["fingerprint"] == "not run"
    # and a model that differs still fails the proof beside it
    spot = _spot(tmp_path / "m.gguf")
    other = ModelResult(model="other", path=str(tmp_path / "o.gguf"), verdict="fail", content=" y", tokens=5)
    other.compute = ComputeResult(agreement=Agreement(status="differs", tolerance=0.05))
    spot.results.append(other)
    assert {p.name: p.verdict for p in spot_proofs(spot)}["fingerprint"] == "fail"
