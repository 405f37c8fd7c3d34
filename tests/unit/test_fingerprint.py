"""The compute fingerprint: parsing llama-server's answer, comparing with the reference, the messages."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from skippy.spot.fingerprint import (
    N_PREDICT,
    PROMPTS,
    Fingerprint,
    ResponseError,
    Run,
    Step,
    compare,
    completion_request,
    greedy_changed,
    parse_completion,
    read_reference,
    reference_path,
    render_reference,
    request_key,
)

#: the shape of a real /completion answer with n_probs (trimmed to two tokens)
ANSWER = {
    "content": " Paris.",
    "completion_probabilities": [
        {"id": 9079, "token": " Paris", "bytes": [32], "logprob": -0.2131, "top_logprobs": []},
        {"id": 236761, "token": ".", "bytes": [46], "logprob": -1.0517, "top_logprobs": []},
    ],
}


def fingerprint(*runs: Run, sha: str = "f" * 64) -> Fingerprint:
    return Fingerprint(model="gemma3-270m", model_sha256=sha, runs=runs)


def run(prompt: str, *steps: tuple[int, str, float]) -> Run:
    return Run(prompt, tuple(Step(*s) for s in steps))


def test_the_request_is_greedy_seeded_uncached_with_probabilities() -> None:
    body = completion_request("x")
    assert body["temperature"] == 0.0
    assert body["n_predict"] == N_PREDICT == 16
    assert body["n_probs"] > 0
    assert body["cache_prompt"] is False
    assert isinstance(body["seed"], int)
    assert request_key() == request_key(PROMPTS)
    assert request_key(("other",)) != request_key()


def test_parse_a_real_answer_shape() -> None:
    parsed = parse_completion("The capital of France is", ANSWER)
    assert [s.id for s in parsed.steps] == [9079, 236761]
    assert parsed.text == " Paris."
    assert parsed.steps[0].logprob == pytest.approx(-0.2131)
    with pytest.raises(ResponseError, match="no completion_probabilities"):
        parse_completion("p", {"content": "x"})
    with pytest.raises(ResponseError, match=r"token 0 .* lacks id/token/logprob"):
        parse_completion("p", {"completion_probabilities": [{"id": 1}]})


def test_identical_runs_agree_and_report_the_largest_delta() -> None:
    ref = fingerprint(run("a", (1, "x", -0.5), (2, "y", -1.0)))
    ours = fingerprint(run("a", (1, "x", -0.51), (2, "y", -1.0)))
    result = compare(ours, ref, tolerance=0.05)
    assert result.ok
    assert result.max_logprob_delta == pytest.approx(0.01)
    assert "agrees with the CPU reference" in result.describe()


def test_a_different_token_names_prompt_position_both_tokens_and_logprobs() -> None:
    ref = fingerprint(run("The capital of France is", (9079, " Paris", -0.21), (236761, ".", -1.05)))
    ours = fingerprint(run("The capital of France is", (9079, " Paris", -0.21), (563, " is", -0.9)))
    result = compare(ours, ref)
    assert not result.ok
    assert result.status == "differs"
    (d,) = result.divergences
    assert d.position == 1
    text = result.describe()
    assert "prompt 'The capital of France is', token 1: a different greedy token" in text
    assert "got ' is' (id 563, logprob -0.9000)" in text
    assert "reference '.' (id 236761, logprob -1.0500)" in text


def test_a_logprob_out_of_tolerance_fails_even_with_the_same_tokens() -> None:
    ref = fingerprint(run("a", (1, "x", -0.5)))
    ours = fingerprint(run("a", (1, "x", -0.7)))
    result = compare(ours, ref, tolerance=0.1)
    assert not result.ok
    assert "log-probability off by 0.2000 (tolerance 0.1)" in result.describe()
    assert compare(ours, ref, tolerance=0.25).ok


def test_shorter_answer_and_missing_prompt_are_divergences() -> None:
    ref = fingerprint(run("a", (1, "x", -0.5), (2, "y", -0.5)))
    short = compare(fingerprint(run("a", (1, "x", -0.5))), ref)
    assert "different lengths" in short.describe()
    other = compare(fingerprint(run("b", (1, "x", -0.5))), ref)
    assert "the reference has no run of this prompt" in other.describe()


def test_a_missing_or_foreign_reference_is_reported_never_passed() -> None:
    ours = fingerprint(run("a", (1, "x", -0.5)))
    assert compare(ours, None).status == "no-reference"
    assert not compare(ours, None).ok
    other_model = fingerprint(run("a", (1, "x", -0.5)), sha="0" * 64)
    assert compare(ours, other_model).status == "no-reference"
    assert "NOT checked" in compare(ours, None).describe()


def test_reference_round_trips_through_its_file(tmp_path: Path) -> None:
    fp = replace(fingerprint(run("a", (1, "x", -0.5))), recorded={"backend": "cpu", "upstream": "4df29be"})
    path = reference_path(tmp_path, "tiny:llama")
    assert path.name == "tiny-llama.json"
    path.write_text(render_reference(fp), encoding="utf-8")
    back = read_reference(tmp_path, "tiny:llama")
    assert back == fp
    assert json.loads(path.read_text(encoding="utf-8"))["request_parameters"]["n_predict"] == N_PREDICT
    assert read_reference(tmp_path, "other") is None


def test_greedy_changed_lists_the_prompts_whose_tokens_moved() -> None:
    old = fingerprint(run("a", (1, "x", -0.5)), run("b", (2, "y", -0.5)))
    new = fingerprint(run("a", (1, "x", -0.9)), run("b", (3, "z", -0.5)))
    assert greedy_changed(old, new) == ["b"]
    assert greedy_changed(None, new) == ["a", "b"]


def test_another_device_may_part_at_a_near_tie_but_never_at_a_confident_token() -> None:
    """Measured on Vulkan (lavapipe): ' capital' at -1.8709 where the CPU took ' largest' at -1.9246."""
    ref = fingerprint(
        run("The capital of France is", (1, " the", -0.5), (7488, " largest", -1.9246), (5, " city", -0.4))
    )
    ours = fingerprint(
        run("The capital of France is", (1, " the", -0.52), (5279, " capital", -1.8709), (9, " of", -0.1))
    )
    strict = compare(ours, ref, tolerance=0.3)
    assert not strict.ok, "the CPU against its own reference is held to identical tokens"
    tied = compare(ours, ref, tolerance=0.3, near_ties=True)
    assert tied.ok and tied.status == "agrees"
    (tie,) = tied.near_ties
    assert (tie.position, tie.ours and tie.ours.id, tie.reference and tie.reference.id) == (1, 5279, 7488)
    assert "up to a near tie" in tied.describe() and "token 1" in tied.describe()
    assert json.loads(json.dumps(tied.as_dict()))["near_ties"][0]["position"] == 1
    # a confident divergence (p = 0.9: no other token can come within the tolerance) is never a tie
    sure_ref = fingerprint(run("a", (1, "x", -0.105)))
    sure_ours = fingerprint(run("a", (2, "y", -0.11)))
    assert not compare(sure_ours, sure_ref, tolerance=0.3, near_ties=True).ok
    # nor are two tokens whose log-probabilities are further apart than the tolerance
    far = fingerprint(run("The capital of France is", (1, " the", -0.5), (5279, " capital", -1.2)))
    assert not compare(far, ref, tolerance=0.3, near_ties=True).ok


def test_the_cpu_on_another_architecture_is_held_to_the_stated_arch_tolerance() -> None:
    from skippy.spot.fingerprint import DEFAULT_ARCH_TOLERANCE, read_reference, tolerance_for
    from skippy.spot.report import Options

    o = Options()
    pick = {"device": o.device_logprob_tolerance, "arch": o.arch_logprob_tolerance, "same": o.logprob_tolerance}
    # the committed reference says where it was recorded: x86_64
    ref = read_reference(Path(__file__).resolve().parents[2] / "skippy" / "llama_cpp" / "reference", "gemma3-270m")
    assert ref is not None and ref.recorded["machine"] == "x86_64"
    same = tolerance_for(**pick, on_device=False, reference_machine="x86_64", machine="x86_64")
    assert same == (o.logprob_tolerance, False)
    arm = tolerance_for(**pick, on_device=False, reference_machine="x86_64", machine="aarch64")
    assert arm == (DEFAULT_ARCH_TOLERANCE, True)
    assert o.logprob_tolerance < DEFAULT_ARCH_TOLERANCE
    # a GPU device keeps its own; a reference that does not say where it was made is held exactly
    assert tolerance_for(**pick, on_device=True, reference_machine="x86_64", machine="aarch64")[0] == (
        o.device_logprob_tolerance
    )
    assert tolerance_for(**pick, on_device=False, reference_machine=None, machine="aarch64") == (
        o.logprob_tolerance,
        False,
    )
