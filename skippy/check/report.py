"""What a spot check found: its options, one result per model, the report and its failure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from skippy.check.compute import (
    ComputeResult,
)
from skippy.check.fingerprint import (
    DEFAULT_ARCH_TOLERANCE,
    DEFAULT_DEVICE_TOLERANCE,
    DEFAULT_RPC_TOLERANCE,
    DEFAULT_TOLERANCE,
    Run,
)
from skippy.core import specs
from skippy.core.errors import SpotCheckFailed
from skippy.core.settings import Settings


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
    #: the chat template used, the fingerprint and its agreement, the device and RPC proofs
    compute: ComputeResult = field(default_factory=ComputeResult)
    #: the greedy runs of the fingerprint prompts (in ``compute.fingerprint`` once keyed by the model)
    runs: list[Run] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"


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
            "results": [
                {**{k: v for k, v in asdict(r).items() if k not in ("runs", "compute")}, "compute": r.compute.as_dict()}
                for r in self.results
            ],
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
                f"| `{r.model}` | {r.verdict} | {_fmt(r.load_seconds)} | {_fmt(r.first_token_seconds)} "
                f"| {_fmt(r.completion_seconds)} | {r.tokens} | {r.reason.replace('|', '/')} |"
            )
        for r in self.failed:
            if r.log_lines:
                lines += ["", f"<details><summary>{r.model}: log</summary>", "", "```"]
                lines += r.log_lines
                lines += ["```", "", "</details>"]
        return "\n".join(lines)


class ModelCheckFailed(SpotCheckFailed):
    """A spot check ran and at least one model failed; the report is attached."""

    def __init__(self, report: SpotCheckReport, *, next_step: str) -> None:
        failed = report.failed
        names = ", ".join(r.model for r in failed)
        details = "\n".join(
            f"{r.model}: {r.reason}" + "".join(f"\n  | {line}" for line in r.log_lines[-12:]) for r in failed
        )
        super().__init__(
            f"spot check failed for {len(failed)} of {len(report.results)} model(s): {names}",
            untouched="the build and the model cache; the server was stopped",
            next_step=next_step,
            details=details,
        )
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "report": self.report.as_dict()}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
