"""A backend's ops against the CPU: upstream's ``test-backend-ops`` on a time-boxed subset.

llama.cpp's CI runs ``test-backend-ops`` on every device it has; the whole run is too slow on
a software device (Mesa's lavapipe takes hours), so this runs the ops a transformer forward
pass of the spot check's models uses, each case compared with the CPU backend by the
program itself, one op at a time under a shared time box. An op the box cuts short reports
what it ran and says so.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippy.core import proc
from skippy.core.errors import CommandError

#: (op, params regex or None): the ops of the spot check's models' forward pass (gemma3,
#: llama, qwen2: norms, attention, feed-forward, embeddings), matrix products narrowed to the
#: weight types those models ship in
MODEL_OPS: Final[tuple[tuple[str, str | None], ...]] = (
    ("ADD", None),
    ("MUL", None),
    ("SCALE", None),
    ("RMS_NORM", None),
    ("GET_ROWS", None),
    ("CPY", None),
    ("CONT", None),
    ("SOFT_MAX", None),
    ("ROPE", None),
    ("GELU", None),
    ("SILU", None),
    ("GLU", None),
    ("MUL_MAT", r"type_a=(f32|f16|q8_0),type_b=f32"),
)
#: seconds for the whole subset by default
DEFAULT_BUDGET: Final = 300.0
_CASE = re.compile(r"^\s+([A-Z_0-9]+)\((.*)\): (?:\x1b\[[0-9;]*m)?(OK|FAIL|not supported)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class OpResult:
    op: str
    passed: int
    failed: int
    unsupported: int
    seconds: float
    #: why it stopped early (the time box), or None
    cut_short: str | None = None
    #: the first failing cases, as the program printed them
    failures: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        if self.failed:
            return "failed"
        if self.passed == 0:
            return "not run"
        return "passed"

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "verdict": self.verdict,
            "passed": self.passed,
            "failed": self.failed,
            "unsupported": self.unsupported,
            "seconds": round(self.seconds, 3),
            "cut_short": self.cut_short,
            "failures": list(self.failures),
        }


def parse_cases(output: str) -> tuple[int, int, int, tuple[str, ...]]:
    """test-backend-ops's console lines -> (passed, failed, not supported, the failing lines)."""
    passed = failed = unsupported = 0
    failures: list[str] = []
    for line in output.splitlines():
        match = _CASE.match(line)
        if not match:
            continue
        status = match.group(3)
        if status == "OK":
            passed += 1
        elif status == "FAIL":
            failed += 1
            if len(failures) < 5:
                failures.append(_ANSI.sub("", line).strip())
        else:
            unsupported += 1
    return passed, failed, unsupported, tuple(failures)


def run_ops(
    program: Path,
    device: str,
    env: Mapping[str, str],
    *,
    ops: Sequence[tuple[str, str | None]] = MODEL_OPS,
    budget: float = DEFAULT_BUDGET,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[OpResult, ...]:
    """``test-backend-ops test -b DEVICE -o OP [-p PARAMS]`` for each op until ``budget`` runs out."""
    deadline = clock() + budget
    results: list[OpResult] = []
    for op, params in ops:
        left = deadline - clock()
        if left <= 1:
            results.append(OpResult(op, 0, 0, 0, 0.0, cut_short=f"not reached within the {budget:.0f} s time box"))
            continue
        argv = [str(program), "test", "-b", device, "-o", op, *(("-p", params) if params else ())]
        start = clock()
        cut = None
        lines: list[str] = []
        try:
            proc.run(argv, env=env, check=False, timeout=left, on_line=lines.append)
        except CommandError as exc:
            # the time box: what ran until then is in the lines
            cut = f"cut short by the {budget:.0f} s time box ({exc.what})"
        passed, failed, unsupported, failures = parse_cases("\n".join(lines))
        results.append(OpResult(op, passed, failed, unsupported, clock() - start, cut, failures))
    return tuple(results)
