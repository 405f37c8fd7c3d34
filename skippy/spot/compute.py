"""The compute half of the spot check: the fingerprint runs over HTTP, and what a
result says about the numbers (agreement with the CPU reference, the chat template,
the device the layers went to).  The server's life is :mod:`skippy.spot.proofs`'s.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from skippy.spot.evidence import device_evidence, parse_offload, template_leak
from skippy.spot.fingerprint import (
    PROMPTS,
    Agreement,
    Fingerprint,
    ResponseError,
    Run,
    completion_request,
    parse_completion,
)


class ComputeFailure(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fingerprint_runs(host: str, port: int, timeout: float, prompts: Sequence[str] = PROMPTS) -> list[Run]:
    """The greedy ``/completion`` run of each prompt on a ready server."""
    runs = []
    for prompt in prompts:
        body = json.dumps(completion_request(prompt)).encode()
        request = urllib.request.Request(
            f"http://{host}:{port}/completion",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback only
                answer: dict[str, Any] = json.loads(response.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")[:300]
            raise ComputeFailure(f"/completion answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
            raise ComputeFailure(f"/completion failed: {exc}") from None
        try:
            runs.append(parse_completion(prompt, answer))
        except ResponseError as exc:
            raise ComputeFailure(str(exc)) from None
    return runs


@dataclass
class ComputeResult:
    """What one model's checks found beyond "it answered"."""

    chat_template: str = ""
    fingerprint: Fingerprint | None = None
    agreement: Agreement | None = None
    #: the device proof for a GPU backend or the RPC run ("" when not asked)
    device: str = ""
    rpc: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "chat_template": self.chat_template,
            "fingerprint": self.fingerprint.as_dict() if self.fingerprint else None,
            "agreement": self.agreement.as_dict() if self.agreement else None,
            "device": self.device,
            "rpc": self.rpc or None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ComputeResult:
        """What :meth:`as_dict` wrote (a kept proof, :mod:`skippy.spot.kept`)."""
        fingerprint = data.get("fingerprint")
        agreement = data.get("agreement")
        return cls(
            chat_template=str(data.get("chat_template") or ""),
            fingerprint=Fingerprint.from_dict(fingerprint) if fingerprint else None,
            agreement=Agreement.from_dict(agreement) if agreement else None,
            device=str(data.get("device") or ""),
            rpc=dict(data.get("rpc") or {}),
        )


def leak_reason(answer: str) -> str | None:
    token = template_leak(answer)
    return None if token is None else f"the answer contains the chat template token {token!r}: {answer!r}"


def device_reason(log: Sequence[str], prefix: str) -> tuple[str | None, str]:
    """(failure reason or None, what the log shows) for the layers on a ``prefix`` device."""
    used, why = device_evidence(parse_offload(log), prefix)
    return (None if used else f"the model did not run on a {prefix} device: {why}"), why
