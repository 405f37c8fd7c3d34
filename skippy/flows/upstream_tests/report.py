"""What upstream's tests said: each test's outcome, the patch blamed for a failure, the report a maintainer reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from skippy.compile.builder import BuildReport
from skippy.flows.upstream_tests import backend_ops, ctest

Status = Literal["passed", "broken by the queue", "red upstream", "failed", "flaky", "not run"]


@dataclass(frozen=True)
class Blame:
    """The first patch (in queue order) whose application makes a test fail."""

    patch: str | None
    commit: str | None
    output: str = ""
    #: set when the bisection stopped before it named one patch: why, and how far it got
    gave_up: str | None = None
    probes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "commit": self.commit,
            "output": self.output,
            "gave_up": self.gave_up,
            "probes": self.probes,
        }


@dataclass(frozen=True)
class TestOutcome:
    name: str
    status: Status
    seconds: float
    output: str = ""
    #: added by one of the queue's patches
    own: bool = False
    blame: Blame | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "output": self.output,
            "own": self.own,
            "blame": self.blame.as_dict() if self.blame else None,
        }


@dataclass(frozen=True)
class UpstreamTestsReport:
    backend: str
    upstream_sha: str
    build_dir: Path
    build: BuildReport
    ctest_seconds: float
    tests: tuple[TestOutcome, ...]
    #: "not needed (...)", "cached (...)" or "run (...)"
    baseline: str
    baseline_seconds: float = 0.0
    attribution_seconds: float = 0.0
    #: fixture set-ups CTest added that failed (e.g. a model download without a network)
    setups_failed: tuple[ctest.Result, ...] = ()
    #: a GPU backend's ops against the CPU (test-backend-ops on the device), and the device
    ops: tuple[backend_ops.OpResult, ...] = ()
    ops_device: str | None = None

    @property
    def ok(self) -> bool:
        tests_ok = not any(t.status in ("broken by the queue", "failed") for t in self.tests)
        return tests_ok and not any(o.failed for o in self.ops)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tests:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    def summary(self) -> str:
        if self.ops_device is not None:
            passed = sum(o.passed for o in self.ops)
            failed = sum(o.failed for o in self.ops)
            return f"{len(self.ops)} ops on {self.ops_device} against the CPU: {passed} cases passed, {failed} failed"
        counts = self.counts()
        order: tuple[Status, ...] = ("passed", "broken by the queue", "failed", "red upstream", "flaky", "not run")
        return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "upstream_sha": self.upstream_sha,
            "ok": self.ok,
            "counts": self.counts(),
            "build_dir": str(self.build_dir),
            "build_seconds": round(self.build.total_seconds, 3),
            "compiled": self.build.compiled,
            "ctest_seconds": round(self.ctest_seconds, 3),
            "baseline": self.baseline,
            "baseline_seconds": round(self.baseline_seconds, 3),
            "attribution_seconds": round(self.attribution_seconds, 3),
            "setups_failed": [r.as_dict() for r in self.setups_failed],
            "tests": [t.as_dict() for t in self.tests],
            "ops_device": self.ops_device,
            "ops": [o.as_dict() for o in self.ops],
        }

    def render(self) -> list[str]:
        """The lines a maintainer reads: the counts, then each test that is not simply passed."""
        lines = [f"upstream tests ({self.backend}): {self.summary()}; baseline {self.baseline}"]
        for t in self.tests:
            if t.status == "passed":
                continue
            if t.status == "broken by the queue" and t.blame is not None:
                where = t.blame.patch or "no single patch"
                lines.append(f"  ✗ {t.name}: broken by the queue, first failing with {where}")
                if t.blame.gave_up:
                    lines.append(f"      attribution gave up: {t.blame.gave_up}")
            elif t.status == "flaky":
                lines.append(f"  · {t.name}: flaky (failed, then passed on a rerun of the same build)")
            else:
                lines.append(f"  {'✗' if t.status in ('failed', 'broken by the queue') else '·'} {t.name}: {t.status}")
            if t.output and t.status != "not run":
                lines.extend("      " + line for line in t.output.splitlines()[-8:])
        for s in self.setups_failed:
            first = s.output.strip().splitlines()[-1] if s.output.strip() else "failed"
            lines.append(f"  · set-up {s.name} failed ({first}): the tests needing it did not run")
        for o in self.ops:
            mark = "✗" if o.failed else "✓" if o.passed else "·"
            counts = f"{o.passed} passed, {o.failed} failed, {o.unsupported} not supported, {o.seconds:.0f} s"
            lines.append(f"  {mark} {o.op}: {counts}" + (f" ({o.cut_short})" if o.cut_short else ""))
            lines.extend(f"      {f}" for f in o.failures)
        return lines
