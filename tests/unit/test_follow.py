"""The spot check follows the change (pure parts): the models a session checks, and the ending's lines
for each touched family, with or without a tiny model, passed, failed or not run."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionOutcome, session_ending
from skippy.flows.follow import FOLLOWED, Baseline, Family, Following, proofs, read_record
from skippy.maintain.touched import Touched
from skippy.spot.models import DEFAULT_MODEL
from skippy.spot.report import ModelResult, SpotCheckReport
from tests.unit.test_ending import _report

QWEN2 = Family(
    Touched("qwen2", "LLM_ARCH_QWEN2", ("src/models/qwen2.cpp: llama_model_qwen2::graph::graph changed",)), "tiny:qwen2"
)
BERT = Family(Touched("bert", "LLM_ARCH_BERT", ("src/models/bert.cpp: llama_model_bert::graph::graph changed",)), None)
PIN = Baseline("a" * 40, "pin", "the pin aaaaaaaaaaaa, every family the queue touches (no earlier cpu build ...)")
FOLLOWING = Following(PIN, (BERT, QWEN2))


def report(*verdicts: tuple[str, Literal["pass", "fail"]]) -> SpotCheckReport:
    """A spot check's report of (model, verdict)s."""
    results = []
    for model, verdict in verdicts:
        reason = "" if verdict == "pass" else "no token"
        results.append(ModelResult(model=model, path=None, verdict=verdict, content=" abc", tokens=3, reason=reason))
    return SpotCheckReport(server="bin/llama-server", results=results)


def test_the_models_asked_for_then_the_touched_families_tiny_models() -> None:
    assert FOLLOWING.models(()) == (DEFAULT_MODEL, "tiny:qwen2")
    assert FOLLOWING.models(("model.gguf",)) == ("model.gguf", "tiny:qwen2")
    # a family asked for already (in any quantization) is not checked twice
    assert FOLLOWING.models(("tiny:qwen2:q8_0",)) == ("tiny:qwen2:q8_0",)
    assert FOLLOWING.models((DEFAULT_MODEL, "tiny:qwen2")) == (DEFAULT_MODEL, "tiny:qwen2")
    # nothing added: the models asked for, unchanged (none still means the default model)
    assert Following(PIN, (BERT,)).models(()) == ()
    assert Following(skipped="no baseline").models(()) == ()


def test_each_family_is_a_line_and_one_without_a_tiny_model_is_not_run() -> None:
    lines = proofs(FOLLOWING, report((DEFAULT_MODEL, "pass"), ("tiny:qwen2", "pass")), None)
    assert [(p.name, p.verdict) for p in lines] == [
        (FOLLOWED, "pass"),
        ("family bert", "not run"),
        ("family qwen2", "pass"),
    ]
    assert lines[0].detail == f"bert, qwen2, since {PIN.said}"
    assert lines[1].detail == "no tiny model for bert (src/models/bert.cpp: llama_model_bert::graph::graph changed)"
    assert (
        lines[2].detail == "tiny:qwen2 answered 'abc' (src/models/qwen2.cpp: llama_model_qwen2::graph::graph changed)"
    )
    failed = proofs(FOLLOWING, report((DEFAULT_MODEL, "pass"), ("tiny:qwen2", "fail")), None)
    assert (failed[2].verdict, failed[2].detail.split(" (")[0]) == ("fail", "tiny:qwen2: no token")
    off = proofs(FOLLOWING, None, "--no-spot-check")
    assert (off[2].verdict, off[2].detail) == ("not run", "tiny:qwen2: --no-spot-check")
    none = proofs(Following(PIN, ()), report((DEFAULT_MODEL, "pass")), None)
    assert [(p.name, p.verdict, p.detail) for p in none] == [(FOLLOWED, "pass", f"none, since {PIN.said}")]
    skipped = proofs(Following(skipped="the workdir is not a git checkout"), None, None)
    assert [(p.name, p.verdict, p.detail) for p in skipped] == [
        (FOLLOWED, "not run", "the workdir is not a git checkout")
    ]


def test_the_sessions_ending_says_not_run_no_tiny_model(tmp_path: Path) -> None:
    outcome = SessionOutcome(
        backend="cpu",
        build=_report(tmp_path),
        spot=report((DEFAULT_MODEL, "pass"), ("tiny:qwen2", "pass")),
        following=FOLLOWING,
    )
    ending = session_ending(outcome, Settings.from_table(tmp_path, {}, {"PATH": str(tmp_path)}))
    assert ending.ok, "a family with no tiny model is not a failure, and not a pass either"
    out = Console(env={}, stream=io.StringIO())
    ending.show(out)
    text = out.stream.getvalue()  # type: ignore[attr-defined]
    assert "- family bert" in text and "not run: no tiny model for bert (src/models/bert.cpp:" in text
    assert "✓ family qwen2" in text


def test_a_record_that_cannot_be_read_is_no_record(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    assert read_record(path) is None
    for text in ("[]", '{"schema": 1}', '{"schema": 2, "backend": "cpu"}', "\xff"):
        path.write_text(text, encoding="utf-8")
        assert read_record(path) is None, text
