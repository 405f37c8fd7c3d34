"""Kept proofs (issue 43, item 5): the record of a build dir's proofs, the digests it caches, a
result's round trip through it, and how a kept proof is shown and reported."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from skippy.core.files import sha256_of
from skippy.core.ui import Console
from skippy.spot import kept
from skippy.spot.compute import ComputeResult
from skippy.spot.fingerprint import NEAR_TIE, Agreement, Divergence, Fingerprint, Run, Step
from skippy.spot.kept import PROOFS_NAME, SCHEMA, ProofRecord, proof_key
from skippy.spot.report import Ending, ModelResult, Proof, Provenance, SpotCheckReport, shown_time, spot_proofs

WHEN = "2026-12-06T04:03:12Z"


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the record hashes, in order."""
    hashed: list[Path] = []
    real = sha256_of  # what kept.py calls, replaced there by the counting one

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(kept, "sha256_of", counting)
    return hashed


def test_a_file_is_hashed_once_while_it_is_unchanged_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = _hashes(monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF one")
    record = ProofRecord.load(tmp_path / PROOFS_NAME)
    first = record.digest(model)
    record.keep("k", what="m", server="s", result={"model": "m", "path": None}, when=WHEN)
    record.save("s")
    # a later run reads the digest from the record: the file is not read again
    again = ProofRecord.load(tmp_path / PROOFS_NAME)
    assert again.digest(model) == first
    assert hashed == [model]
    # the same size, the same mtime, other bytes: the ctime moved, so it is hashed again
    stat = model.stat()
    model.write_bytes(b"GGUF two")
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert again.digest(model) != first
    assert hashed == [model, model]


def test_the_record_keeps_the_proofs_of_the_current_binary_only(tmp_path: Path) -> None:
    path = tmp_path / PROOFS_NAME
    record = ProofRecord.load(path)
    record.keep("old", what="m", server="old-server", result={"model": "m"}, when=WHEN)
    record.keep("new", what="m", server="new-server", result={"model": "m"}, when=WHEN)
    record.save("new-server")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema"] == SCHEMA
    assert set(data["proofs"]) == {"new"}
    loaded = ProofRecord.load(path)
    assert loaded.kept("new") is not None and loaded.kept("old") is None
    loaded.drop("new")
    loaded.save("new-server")
    assert ProofRecord.load(path).kept("new") is None


def test_a_run_that_keeps_nothing_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    record = ProofRecord.load(tmp_path / PROOFS_NAME)
    record.digest(tmp_path / "m.gguf")
    record.drop("never kept")
    record.save("server")
    assert not (tmp_path / PROOFS_NAME).exists()


@pytest.mark.parametrize("text", ["{not json", '{"schema": 999, "proofs": {"k": {}}}', "[1, 2]"])
def test_an_unreadable_or_other_format_record_keeps_nothing(tmp_path: Path, text: str) -> None:
    path = tmp_path / PROOFS_NAME
    path.write_text(text, encoding="utf-8")
    assert ProofRecord.load(path).entries == {}


def test_no_build_dir_no_record() -> None:
    record = ProofRecord.load(None)
    record.keep("k", what="m", server="s", result={"model": "m"}, when=WHEN)
    assert record.kept("k") is None
    record.save("s")  # nowhere to write: nothing happens


def test_the_key_changes_with_every_part_and_not_with_their_order() -> None:
    parts = {
        "binaries": {"llama-server": "a", "ggml-rpc-server": "b"},
        "model_sha256": "m",
        "reference_sha256": None,
        "settings": {"backend": "cpu", "server_args": ["-ngl", "99"]},
    }
    key = proof_key(parts)
    assert proof_key(dict(reversed(list(parts.items())))) == key
    changed = [
        {**parts, "binaries": {"llama-server": "a2", "ggml-rpc-server": "b"}},
        {**parts, "binaries": {"llama-server": "a", "ggml-rpc-server": "b2"}},
        {**parts, "model_sha256": "m2"},
        {**parts, "reference_sha256": "r"},
        {**parts, "settings": {"backend": "vulkan", "server_args": ["-ngl", "99"]}},
        {**parts, "settings": {"backend": "cpu", "server_args": ["-ngl", "98"]}},
    ]
    assert len({proof_key(c) for c in changed} | {key}) == len(changed) + 1


def _result() -> ModelResult:
    steps = (Step(1, " Paris", -0.01), Step(2, ".", -0.2))
    fingerprint = Fingerprint(model="m", model_sha256="f" * 64, runs=(Run("The capital of France is", steps),))
    agreement = Agreement(
        status="differs",
        tolerance=0.15,
        divergences=(Divergence("p", 3, Step(4, "a", -1.0), None, "the answers have different lengths"),),
        max_logprob_delta=0.05,
        reference_recorded={"machine": "x86_64"},
        near_ties=(Divergence("q", 1, Step(5, "b", -0.7), Step(6, "c", -0.71), NEAR_TIE),),
    )
    result = ModelResult(model="m", path="/models/m.gguf", verdict="pass", content=" OK", tokens=2, load_seconds=1.5)
    result.compute = ComputeResult(
        chat_template="the GGUF's own chat template",
        fingerprint=fingerprint,
        agreement=agreement,
        device="3/3 layers on Vulkan0",
        rpc={"ok": True, "device": "RPC0", "agreement": None, "seconds": 1.0},
    )
    result.runs = list(fingerprint.runs)
    return result


def test_a_result_comes_back_from_the_record_as_it_was_kept() -> None:
    result = _result()
    back = ModelResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert back == result
    assert back.compute.agreement is not None
    assert (
        back.compute.agreement.describe() == result.compute.agreement.describe() if result.compute.agreement else False
    )


def _report(*results: ModelResult) -> SpotCheckReport:
    up = Provenance("a" * 40, "d" * 64)
    return SpotCheckReport(server="bin/llama-server", provenance=up, expected=up, results=list(results))


def test_a_kept_proof_says_when_it_was_made_in_the_ending_and_the_json() -> None:
    result = _result()
    result.kept_from = WHEN
    proofs = {p.name: p for p in spot_proofs(_report(result))}
    # the provenance is read again on every run (--version), never kept
    assert proofs["provenance"].kept_from is None
    assert proofs["chat answer"].kept_from == WHEN and proofs["RPC"].kept_from == WHEN
    stream = io.StringIO()
    Ending("build-cpu: every proof made holds", tuple(proofs.values())).show(Console(env={}, stream=stream))
    text = stream.getvalue()
    assert "✓ chat answer  (kept from 2026-12-06 04:03:12 UTC) m answered 'OK'" in text
    assert "✓ provenance   upstream aaaaaaaaaaaa" in text
    assert proofs["chat answer"].as_dict() == {
        "name": "chat answer",
        "verdict": "pass",
        "detail": "m answered 'OK' (2 token(s) in - s)",
        "kept": True,
        "kept_from": WHEN,
    }
    assert proofs["provenance"].as_dict()["kept"] is False


def test_a_proof_over_models_some_kept_some_made_now_is_made_now_naming_the_kept_ones() -> None:
    old, new = _result(), _result()
    old.kept_from, new.model = WHEN, "tiny:llama"
    (chat,) = [p for p in spot_proofs(_report(old, new)) if p.name == "chat answer"]
    assert chat.kept_from is None
    assert chat.detail.startswith("m (kept from 2026-12-06 04:03:12 UTC): m answered 'OK'")
    assert "; tiny:llama: tiny:llama answered" in chat.detail
    both = _result()
    both.kept_from = "2026-12-07T00:00:00Z"
    (chat,) = [p for p in spot_proofs(_report(old, both)) if p.name == "chat answer"]
    assert chat.kept_from == WHEN, "the oldest of the kept times"


def test_a_time_not_in_the_records_form_is_shown_as_it_is() -> None:
    assert shown_time("yesterday") == "yesterday"
    assert Proof("x", "pass", "d", kept_from="yesterday").shown == "(kept from yesterday) d"
