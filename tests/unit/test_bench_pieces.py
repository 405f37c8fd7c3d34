"""Small pieces of the bench (benchmarks/bench.py), without building anything."""

from __future__ import annotations

from benchmarks.bench import alternating


def test_alternating_swaps_the_order_every_round_and_times_each_action() -> None:
    calls: list[str] = []
    ticks = iter(range(100))

    def clock() -> float:
        return float(next(ticks))

    first, second = alternating(3, lambda: calls.append("a"), lambda: calls.append("b"), clock=clock)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert first == [1.0, 1.0, 1.0] and second == [1.0, 1.0, 1.0]
    assert alternating(0, lambda: None, lambda: None) == ([], [])
