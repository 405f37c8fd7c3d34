"""What every bench section shares: timings and a console that keeps nothing."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def as_dict(self) -> dict[str, Any]:
        return {
            "median_s": round(self.median, 4),
            "min_s": round(min(self.samples), 4),
            "max_s": round(max(self.samples), 4),
            "samples_s": [round(s, 4) for s in self.samples],
        }


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


class Null(io.StringIO):
    """A console stream that keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)
