"""The compute fingerprint: what a build's numbers look like, and whether they agree.

A fingerprint is a greedy run of a few fixed prompts over llama-server's raw
``/completion`` endpoint (temperature 0, fixed seed, :data:`N_PREDICT` tokens,
the top-:data:`N_PROBS` log-probabilities, no prompt cache): per prompt the
generated token ids and the log-probability of each.  Two builds of the same
patched tree on the same model agree when the tokens are identical and every
log-probability is within a tolerance.

The reference is the CPU build's fingerprint, committed beside the queue
(``<patch_dir>/../reference/<model>.json``) and keyed by what determines the
numbers: the model's sha256 and the request (prompts, token count, seed).  A
queue change that does not move the numbers costs nothing; one that does fails
every spot check until the reference is rewritten on purpose (one command).

Everything here is pure: the request, parsing a response, comparing, reading
and writing the reference file.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

#: the prompts of the greedy run: prose, arithmetic, code (a few, so a divergence in one area shows)
PROMPTS: Final = (
    "The capital of France is",
    "1, 2, 3, 4, 5,",
    "def fibonacci(n):",
)
N_PREDICT: Final = 16
N_PROBS: Final = 3
SEED: Final = 1234
#: default tolerance on the top-1 log-probabilities (nats), ``[tool.skippy.spot_check] logprob_tolerance``;
#: the direct CPU run repeats its numbers exactly on the pinned tree and Gemma 3 270M
DEFAULT_TOLERANCE: Final = 0.15
#: the RPC path's tolerance, ``rpc_logprob_tolerance``: its numbers vary from run to run (measured on
#: the pinned tree, Gemma 3 270M, 2 cores: up to 0.18 nats from the direct run, greedy tokens identical)
DEFAULT_RPC_TOLERANCE: Final = 0.5
#: a GPU backend's tolerance, ``device_logprob_tolerance`` (other kernels, other rounding: measured on
#: the pinned tree, Gemma 3 270M, Vulkan on lavapipe: up to 0.18 nats, one near tie at 0.05)
DEFAULT_DEVICE_TOLERANCE: Final = 0.3
#: the CPU backend on another architecture than the reference's (``recorded["machine"]``),
#: ``arch_logprob_tolerance``: other SIMD kernels (NEON instead of AVX2), other rounding, so the same
#: bound as a GPU device and near ties allowed.  Stated, not measured: no arm64 machine was at hand
#: (the build matrix's arm64 CPU row is where it is first held)
DEFAULT_ARCH_TOLERANCE: Final = 0.3


def tolerance_for(
    *, device: float, arch: float, same: float, on_device: bool, reference_machine: str | None, machine: str
) -> tuple[float, bool]:
    """(tolerance, near ties allowed) for one comparison with the committed reference: a GPU
    device's own; the CPU on another architecture than the one the reference was recorded on;
    else the plain CPU tolerance, with identical greedy tokens."""
    if on_device:
        return device, True
    if reference_machine is not None and reference_machine != machine:
        return arch, True
    return same, False


SCHEMA: Final = 1


def completion_request(prompt: str) -> dict[str, Any]:
    """The ``/completion`` body of one greedy, uncached, seeded run."""
    return {
        "prompt": prompt,
        "n_predict": N_PREDICT,
        "temperature": 0.0,
        "top_k": 1,
        "seed": SEED,
        "n_probs": N_PROBS,
        "cache_prompt": False,
        "stream": False,
    }


def request_key(prompts: Sequence[str] = PROMPTS) -> str:
    """A digest of everything in the request that changes the numbers."""
    blob = json.dumps([completion_request(p) for p in prompts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Step:
    """One generated token: its id, text and log-probability."""

    id: int
    text: str
    logprob: float

    def describe(self) -> str:
        return f"{self.text!r} (id {self.id}, logprob {self.logprob:.4f})"


@dataclass(frozen=True)
class Run:
    prompt: str
    steps: tuple[Step, ...]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)


class ResponseError(ValueError):
    """A ``/completion`` answer without the per-token probabilities we asked for."""


def parse_completion(prompt: str, body: Mapping[str, Any]) -> Run:
    """The steps of a ``/completion`` answer (``completion_probabilities``: id, token, logprob)."""
    probs = body.get("completion_probabilities")
    if not isinstance(probs, list) or not probs:
        raise ResponseError(f"no completion_probabilities in the answer to {prompt!r} (keys: {sorted(body)})")
    steps = []
    for i, entry in enumerate(probs):
        try:
            logprob = float(entry["logprob"])
            steps.append(Step(id=int(entry["id"]), text=str(entry["token"]), logprob=logprob))
        except (KeyError, TypeError, ValueError) as exc:
            raise ResponseError(f"token {i} of the answer to {prompt!r} lacks id/token/logprob: {entry!r}") from exc
    return Run(prompt=prompt, steps=tuple(steps))


@dataclass(frozen=True)
class Fingerprint:
    model: str
    model_sha256: str
    runs: tuple[Run, ...]
    request: str = field(default_factory=request_key)
    #: where it was taken: backend, upstream commit, queue digest (information, not part of the key)
    recorded: Mapping[str, str] = field(default_factory=dict)

    def key(self) -> tuple[str, str]:
        return (self.model_sha256, self.request)

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "model_sha256": self.model_sha256,
            "request": self.request,
            "request_parameters": {"n_predict": N_PREDICT, "n_probs": N_PROBS, "seed": SEED, "temperature": 0.0},
            "recorded": dict(self.recorded),
            "runs": [
                {"prompt": r.prompt, "tokens": [[s.id, s.text, round(s.logprob, 6)] for s in r.steps]}
                for r in self.runs
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"fingerprint schema {data.get('schema')!r}, expected {SCHEMA}")
        runs = tuple(
            Run(prompt=str(r["prompt"]), steps=tuple(Step(int(i), str(t), float(lp)) for i, t, lp in r["tokens"]))
            for r in data["runs"]
        )
        return cls(
            model=str(data["model"]),
            model_sha256=str(data["model_sha256"]),
            runs=runs,
            request=str(data["request"]),
            recorded={str(k): str(v) for k, v in dict(data.get("recorded", {})).items()},
        )


@dataclass(frozen=True)
class Divergence:
    prompt: str
    #: index of the first generated token that differs (or whose log-probability is out of tolerance)
    position: int
    ours: Step | None
    reference: Step | None
    why: str

    def describe(self) -> str:
        ours = self.ours.describe() if self.ours else "nothing"
        ref = self.reference.describe() if self.reference else "nothing"
        return f"prompt {self.prompt!r}, token {self.position}: {self.why}: got {ours}, reference {ref}"


@dataclass(frozen=True)
class Agreement:
    """The comparison of a fingerprint with the reference."""

    #: "agrees", "differs", or "no-reference" (never a pass by omission)
    status: str
    tolerance: float
    divergences: tuple[Divergence, ...] = ()
    max_logprob_delta: float = 0.0
    reference_recorded: Mapping[str, str] = field(default_factory=dict)
    #: where the greedy tokens parted at a near tie (allowed for another device's numbers)
    near_ties: tuple[Divergence, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "agrees"

    def describe(self) -> str:
        if self.status == "no-reference":
            return "no CPU reference fingerprint for this model and request: agreement NOT checked"
        if self.ok:
            parted = "".join(f"; parted at {t.describe()}" for t in self.near_ties)
            same = "identical greedy tokens" if not self.near_ties else "identical greedy tokens up to a near tie"
            return (
                f"agrees with the CPU reference: {same}, top-1 logprobs within "
                f"{self.max_logprob_delta:.4f} (tolerance {self.tolerance}){parted}"
            )
        return "differs from the CPU reference: " + "; ".join(d.describe() for d in self.divergences)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "tolerance": self.tolerance,
            "max_logprob_delta": round(self.max_logprob_delta, 6),
            "divergences": [
                {
                    "prompt": d.prompt,
                    "position": d.position,
                    "why": d.why,
                    "ours": None if d.ours is None else [d.ours.id, d.ours.text, d.ours.logprob],
                    "reference": None
                    if d.reference is None
                    else [d.reference.id, d.reference.text, d.reference.logprob],
                }
                for d in self.divergences
            ],
            "reference_recorded": dict(self.reference_recorded),
            "near_ties": [
                {"prompt": t.prompt, "position": t.position, "ours": _step(t.ours), "reference": _step(t.reference)}
                for t in self.near_ties
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Agreement:
        """The agreement :meth:`as_dict` wrote (a kept proof, :mod:`skippy.spot.kept`)."""
        return cls(
            status=str(data["status"]),
            tolerance=float(data["tolerance"]),
            divergences=tuple(_divergence(d, str(d["why"])) for d in data.get("divergences", ())),
            max_logprob_delta=float(data.get("max_logprob_delta", 0.0)),
            reference_recorded={str(k): str(v) for k, v in dict(data.get("reference_recorded") or {}).items()},
            near_ties=tuple(_divergence(t, NEAR_TIE) for t in data.get("near_ties", ())),
        )


def _divergence(data: Mapping[str, Any], why: str) -> Divergence:
    ours, reference = _from_step(data["ours"]), _from_step(data["reference"])
    return Divergence(str(data["prompt"]), int(data["position"]), ours, reference, why)


def _step(step: Step | None) -> list[object] | None:
    return None if step is None else [step.id, step.text, step.logprob]


def _from_step(value: Sequence[Any] | None) -> Step | None:
    if value is None:
        return None
    token_id, text, logprob = value
    return Step(int(token_id), str(text), float(logprob))


#: why two greedy tokens that part at a near tie are not a divergence
NEAR_TIE: Final = "a near tie (both tokens within tolerance)"


def near_tie(ours: Step, ref: Step, tolerance: float) -> bool:
    """Two different greedy tokens that can both be the top-1 within ``tolerance``: their
    log-probabilities are that close, and neither run was so sure of its token that no
    other could come within ``tolerance`` of it (p * e^-tolerance <= 1 - p).  Only the
    top-1 is recorded, so this is the honest bound: a confident divergence is never a tie."""
    if not (math.isfinite(ours.logprob) and math.isfinite(ref.logprob)):
        return False
    if abs(ours.logprob - ref.logprob) > tolerance:
        return False
    return all(math.exp(lp) * math.exp(-tolerance) <= 1 - math.exp(lp) for lp in (ours.logprob, ref.logprob))


def _first_divergence(
    ours: Run, ref: Run, tolerance: float, *, near_ties: bool = False
) -> tuple[Divergence | None, float, Divergence | None]:
    """(the first divergence, the largest log-probability delta before it, a near tie where the
    runs parted legitimately and the comparison of this prompt stopped)."""
    worst = 0.0
    for pos in range(max(len(ours.steps), len(ref.steps))):
        a = ours.steps[pos] if pos < len(ours.steps) else None
        b = ref.steps[pos] if pos < len(ref.steps) else None
        if a is None or b is None:
            return Divergence(ours.prompt, pos, a, b, "the answers have different lengths"), worst, None
        if a.id != b.id:
            if near_ties and near_tie(a, b, tolerance):
                tie = Divergence(ours.prompt, pos, a, b, NEAR_TIE)
                return None, max(worst, abs(a.logprob - b.logprob)), tie
            return Divergence(ours.prompt, pos, a, b, "a different greedy token"), worst, None
        delta = abs(a.logprob - b.logprob) if math.isfinite(a.logprob) and math.isfinite(b.logprob) else math.inf
        if delta > tolerance:
            why = f"log-probability off by {delta:.4f} (tolerance {tolerance})"
            return Divergence(ours.prompt, pos, a, b, why), max(worst, delta), None
        worst = max(worst, delta)
    return None, worst, None


def compare(
    ours: Fingerprint, reference: Fingerprint | None, *, tolerance: float = DEFAULT_TOLERANCE, near_ties: bool = False
) -> Agreement:
    """Identical greedy tokens and top-1 log-probabilities within ``tolerance``, prompt by prompt.

    ``near_ties`` (another device's numbers: a GPU, the RPC path): where the greedy tokens part
    at a near tie (:func:`near_tie`), the prompt agrees up to there and is not compared further
    (the continuations legitimately differ); the tie is reported.  The CPU against its own
    reference is held to identical tokens."""
    if reference is None or reference.key() != ours.key():
        return Agreement(status="no-reference", tolerance=tolerance)
    refs = {r.prompt: r for r in reference.runs}
    divergences: list[Divergence] = []
    ties: list[Divergence] = []
    worst = 0.0
    for run in ours.runs:
        ref = refs.get(run.prompt)
        if ref is None:
            divergences.append(Divergence(run.prompt, 0, None, None, "the reference has no run of this prompt"))
            continue
        found, delta, tie = _first_divergence(run, ref, tolerance, near_ties=near_ties)
        worst = max(worst, delta)
        if found is not None:
            divergences.append(found)
        if tie is not None:
            ties.append(tie)
    return Agreement(
        status="differs" if divergences else "agrees",
        tolerance=tolerance,
        divergences=tuple(divergences),
        max_logprob_delta=worst,
        reference_recorded=reference.recorded,
        near_ties=tuple(ties),
    )


def greedy_changed(old: Fingerprint | None, new: Fingerprint) -> list[str]:
    """Prompts whose greedy answer differs between two fingerprints (for pin-bump's summary)."""
    if old is None:
        return [r.prompt for r in new.runs]
    before = {r.prompt: tuple(s.id for s in r.steps) for r in old.runs}
    return [r.prompt for r in new.runs if before.get(r.prompt) != tuple(s.id for s in r.steps)]


# --- the committed reference ---------------------------------------------------------


def reference_path(reference_dir: Path, model: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model)
    return reference_dir / f"{safe}.json"


def read_reference(reference_dir: Path, model: str) -> Fingerprint | None:
    path = reference_path(reference_dir, model)
    if not path.is_file():
        return None
    return Fingerprint.from_dict(json.loads(path.read_text(encoding="utf-8")))


def render_reference(fingerprint: Fingerprint) -> str:
    return json.dumps(fingerprint.as_dict(), indent=1, ensure_ascii=False, sort_keys=True) + "\n"
