"""What a spot check found: its options, one result per model, the report and its failure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from skippy.core import specs
from skippy.core.errors import ModelCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.core.ui import Verdict as ProofVerdict
from skippy.spot.compute import (
    ComputeResult,
)
from skippy.spot.fingerprint import (
    DEFAULT_ARCH_TOLERANCE,
    DEFAULT_DEVICE_TOLERANCE,
    DEFAULT_RPC_TOLERANCE,
    DEFAULT_TOLERANCE,
    Run,
)


@dataclass(frozen=True)
class Provenance:
    """What a skippy-built llama-server says it was built from."""

    upstream_sha: str
    queue_digest: str


@dataclass(frozen=True)
class Options:
    """Timeouts and sizes; ``[tool.skippy.spot_check]`` overrides the defaults."""

    load_timeout: float = 300.0
    request_timeout: float = 120.0
    grace: float = 10.0
    ctx_size: int = 1024
    max_tokens: int = 5
    poll_interval: float = 0.1
    bind_attempts: int = 3
    #: how far a top-1 log-probability may be from the CPU reference's (nats)
    logprob_tolerance: float = DEFAULT_TOLERANCE
    #: the same over RPC (its numbers vary from run to run; the greedy tokens must still be identical)
    rpc_logprob_tolerance: float = DEFAULT_RPC_TOLERANCE
    #: the same for a GPU backend's own device (near ties allowed, as over RPC)
    device_logprob_tolerance: float = DEFAULT_DEVICE_TOLERANCE
    #: the same for the CPU on another architecture than the reference's (near ties allowed)
    arch_logprob_tolerance: float = DEFAULT_ARCH_TOLERANCE

    @classmethod
    def from_settings(cls, settings: Settings, backend_defaults: Mapping[str, float] | None = None) -> Options:
        """The defaults, then the backend's own (``BackendSpec.spot_check_timeouts``), then the table."""
        table = settings.subtable("spot_check", cls.__dataclass_fields__, example="load_timeout = 600")
        values: dict[str, Any] = dict(backend_defaults or {})
        for key in table:
            values[key] = specs.value(specs.SPOT_CHECK, key, table, settings.env, where="[tool.skippy.spot_check]")
        return cls(**values)


Verdict = Literal["pass", "fail"]


@dataclass
class ModelResult:
    model: str
    path: str | None
    verdict: Verdict = "fail"
    reason: str = ""
    load_seconds: float | None = None
    first_token_seconds: float | None = None
    completion_seconds: float | None = None
    tokens: int = 0
    content: str = ""
    port: int | None = None
    exit_code: int | None = None
    log_path: str | None = None
    #: the log lines that decided a failure (or the log tail)
    log_lines: list[str] = field(default_factory=list)
    #: the way out of a failure that is not the build's (a port taken, a model that cannot be had)
    next_step: str | None = None
    #: the argument llama-server refused (unknown, or a bad value) before it exited
    refused_argument: str | None = None
    #: the chat template used, the fingerprint and its agreement, the device and RPC proofs
    compute: ComputeResult = field(default_factory=ComputeResult)
    #: the greedy runs of the fingerprint prompts (in ``compute.fingerprint`` once keyed by the model)
    runs: list[Run] = field(default_factory=list, repr=False)
    #: when the proof was made, for a result kept from an earlier run (:mod:`skippy.spot.kept`); None: made now
    kept_from: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def as_dict(self) -> dict[str, Any]:
        """The result as the JSON report (and a kept proof) has it."""
        plain = {k: v for k, v in asdict(self).items() if k not in ("runs", "compute")}
        return {**plain, "compute": self.compute.as_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResult:
        """What :meth:`as_dict` wrote; the runs come back from the fingerprint."""
        names = {f.name for f in fields(cls)} - {"runs", "compute"}
        result = cls(**{k: v for k, v in data.items() if k in names})
        result.compute = ComputeResult.from_dict(dict(data.get("compute") or {}))
        if result.compute.fingerprint is not None:
            result.runs = list(result.compute.fingerprint.runs)
        return result


@dataclass
class SpotCheckReport:
    server: str
    version: str | None = None
    provenance: Provenance | None = None
    results: list[ModelResult] = field(default_factory=list)
    #: ``llama-server --list-devices`` (GPU backends; None when not asked)
    devices: list[str] | None = None
    #: why no model was checked (no device of the backend on this machine), or None
    not_run: str | None = None
    #: the provenance the binary had to report (None: not checked)
    expected: Provenance | None = None

    @property
    def ok(self) -> bool:
        """Nothing failed: every model passed, or the check could not run here (``not_run`` says why)."""
        if self.not_run is not None:
            return not self.results
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def failed(self) -> list[ModelResult]:
        return [r for r in self.results if not r.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "version": self.version,
            "provenance": asdict(self.provenance) if self.provenance else None,
            "ok": self.ok,
            "ran": self.not_run is None,
            "not_run": self.not_run,
            "devices": self.devices,
            "results": [r.as_dict() for r in self.results],
        }

    def markdown(self) -> str:
        if self.not_run is not None:
            return f"### Spot check: not run\n\n`{self.server}`: {self.not_run}"
        lines = [
            "### Spot check: " + ("passed" if self.ok else "FAILED"),
            "",
            f"`{self.server}`" + (f" ({self.version})" if self.version else ""),
            "",
            "| model | verdict | load s | first token s | completion s | tokens | reason |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in self.results:
            lines.append(
                f"| `{r.model}` | {r.verdict}{_kept_note(r)} | {_fmt(r.load_seconds)} | {_fmt(r.first_token_seconds)} "
                f"| {_fmt(r.completion_seconds)} | {r.tokens} | {r.reason.replace('|', '/')} |"
            )
        for r in self.failed:
            if r.log_lines:
                lines += ["", f"<details><summary>{r.model}: log</summary>", "", "```"]
                lines += r.log_lines
                lines += ["```", "", "</details>"]
        return "\n".join(lines)


def model_check_failed(report: SpotCheckReport, *, next_step: str, ending: Ending | None = None) -> ModelCheckFailed:
    """The failure of a spot check that ran and saw at least one model fail, the report attached;
    ``next_step`` and ``ending`` (the block the run ends with) come from the caller, who knows them."""
    failed = report.failed
    names = ", ".join(r.model for r in failed)
    details = "\n".join(
        f"{r.model}: {r.reason}" + "".join(f"\n  | {line}" for line in r.log_lines[-12:]) for r in failed
    )
    return ModelCheckFailed(
        f"spot check failed for {len(failed)} of {len(report.results)} model(s): {names}",
        untouched="the build and the model cache; the server was stopped",
        next_step=next_step,
        details=details,
        report=report,
        ending=ending,
    )


def spot_report_of(error: ModelCheckFailed) -> SpotCheckReport:
    """The report a failed spot check carries, as its own type (the error, defined in the layer
    below, knows it only as something with ``as_dict``)."""
    if not isinstance(error.report, SpotCheckReport):
        raise TypeError(f"{type(error).__name__} carries a {type(error.report).__name__}, not a SpotCheckReport")
    return error.report


def _kept_note(result: ModelResult) -> str:
    return "" if result.kept_from is None else f" (kept from {shown_time(result.kept_from)})"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


@dataclass(frozen=True)
class Proof:
    """One thing a run proved, failed to prove, or did not try (and why)."""

    name: str
    verdict: ProofVerdict
    #: what was found (pass, fail) or why it was not run
    detail: str
    #: when it was made, for a proof kept from an earlier run of the same binaries, model, reference
    #: and settings (:mod:`skippy.spot.kept`); None: made by this run
    kept_from: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "detail": self.detail,
            "kept": self.kept_from is not None,
            "kept_from": self.kept_from,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Proof:
        """What :meth:`as_dict` wrote (a recorded run's ending, docs/figures/build-cpu.json)."""
        return cls(data["name"], data["verdict"], data["detail"], kept_from=data.get("kept_from"))

    @property
    def shown(self) -> str:
        """The detail as the ending shows it: a kept proof says so first."""
        return self.detail if self.kept_from is None else f"(kept from {shown_time(self.kept_from)}) {self.detail}"


def shown_time(stamp: str) -> str:
    """``2026-12-06T04:03:12Z`` as ``2026-12-06 04:03:12 UTC`` (anything else as it is)."""
    if len(stamp) == 20 and stamp[10] == "T" and stamp.endswith("Z"):
        return f"{stamp[:10]} {stamp[11:19]} UTC"
    return stamp


@dataclass(frozen=True)
class Ending:
    """The block a build or spot check ends with: the proofs, then where the binaries are and
    how to run them (one more proof is one more entry of ``proofs``)."""

    title: str
    proofs: tuple[Proof, ...]
    #: the lines after the proofs: binaries, the run line
    tail: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(p.verdict != "fail" for p in self.proofs)

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "proofs": [p.as_dict() for p in self.proofs], "tail": list(self.tail)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ending:
        """What :meth:`as_dict` wrote: shown again by :meth:`show`, the same lines as the run's."""
        return cls(data["title"], tuple(Proof.from_dict(p) for p in data["proofs"]), tuple(data["tail"]))

    def show(self, console: Console) -> None:
        console.block(self.title, [(p.verdict, p.name, p.shown) for p in self.proofs], self.tail)


def kept_from(results: Sequence[ModelResult]) -> str | None:
    """When the proofs of ``results`` were made, if every one of them was kept (the oldest time);
    None when any was made by this run."""
    times = [r.kept_from for r in results]
    return min(t for t in times if t is not None) if times and None not in times else None


def _each(results: Sequence[ModelResult], name: str, proof: Any) -> list[Proof]:
    """One proof of ``name`` over the models: ``proof(result)`` gives (verdict, detail) per model;
    kept when every model's result was kept (with some kept and some made now, each kept one says so)."""
    found: list[tuple[ProofVerdict, str]] = [proof(r) for r in results]
    kept = kept_from(results)
    many = len(results) > 1
    if not many:
        return [Proof(name, *found[0], kept_from=kept)] if found else []
    worst: ProofVerdict = next((v for v in ("fail", "not run", "pass") if any(f[0] == v for f in found)), "pass")

    def said(r: ModelResult, detail: str) -> str:
        when = f" (kept from {shown_time(r.kept_from)})" if r.kept_from is not None and kept is None else ""
        return f"{r.model}{when}: {detail}"

    details = "; ".join(said(r, d) for r, (_, d) in zip(results, found, strict=True))
    return [Proof(name, worst, details, kept_from=kept)]


def _chat(r: ModelResult) -> tuple[ProofVerdict, str]:
    if r.ok or (r.content and r.tokens):
        return (
            "pass",
            f"{r.model} answered {r.content.strip()!r} ({r.tokens} token(s) in {_fmt(r.completion_seconds)} s)",
        )
    return "fail", f"{r.model}: {r.reason}"


def _no_reference(r: ModelResult) -> bool:
    return r.compute.agreement is not None and r.compute.agreement.status == "no-reference"


def _fingerprint(r: ModelResult) -> tuple[ProofVerdict, str]:
    agreement = r.compute.agreement
    if agreement is None:
        return "not run", f"{r.model}: no fingerprint was taken" + (f" ({r.reason})" if r.reason else "")
    if agreement.status == "no-reference":
        return "not run", agreement.describe()
    if agreement.ok:
        return "pass", f"agrees with the CPU reference (largest difference {agreement.max_logprob_delta:.3f})"
    return "fail", agreement.describe()


def _rpc(r: ModelResult) -> tuple[ProofVerdict, str]:
    rpc = r.compute.rpc
    if not rpc:
        return "not run", "no RPC server beside the binary, or --no-rpc"
    agreement = rpc.get("agreement") or {}
    delta = agreement.get("max_logprob_delta")
    difference = f" (difference {delta:.3f})" if isinstance(delta, int | float) else ""
    if rpc.get("ok"):
        return "pass", f"{rpc.get('device') or 'offloaded'}{difference}"
    return "fail", f"{rpc.get('reason') or 'differs from the CPU reference'}{difference}"


def spot_proofs(report: SpotCheckReport) -> list[Proof]:
    """What a spot check proved: provenance, the chat answer, the fingerprint, the device, RPC."""
    proofs: list[Proof] = []
    if report.expected is None:
        proofs.append(Proof("provenance", "not run", "the binary was not checked against the prepared workdir"))
    else:
        seen = report.provenance or report.expected
        proofs.append(
            Proof("provenance", "pass", f"upstream {seen.upstream_sha[:12]}, queue digest {seen.queue_digest[:12]}")
        )
    if report.not_run is not None:
        return proofs + [Proof(name, "not run", report.not_run) for name in ("chat answer", "fingerprint", "RPC")]
    proofs += _each(report.results, "chat answer", _chat)
    # a model with no committed reference (a tiny model) does not make the others' agreement "not run"
    referenced = [r for r in report.results if not _no_reference(r)]
    proofs += _each(referenced or report.results, "fingerprint", _fingerprint)
    with_device = [r for r in report.results if r.compute.device]
    proofs += _each(with_device, "device", lambda r: ("pass" if r.ok else "fail", r.compute.device))
    proofs += _each(report.results, "RPC", _rpc)
    return proofs


def model_path(report: SpotCheckReport | None) -> str | None:
    """The model file the spot check loaded (the run line starts the server on it), or None."""
    if report is None:
        return None
    return next((r.path for r in report.results if r.ok and r.path), None)
