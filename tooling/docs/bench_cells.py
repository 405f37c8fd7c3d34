"""What every row of the figures table is made of: the row itself, seconds as shown, met or missed."""

from __future__ import annotations

from typing import TypeAlias

#: one row of the figures table: the figure, what was measured, the target, met or missed
Row: TypeAlias = tuple[str, str, str, str]


def seconds(value: object) -> str:
    """``12.1 s``, or ``?`` where nothing was measured."""
    return f"{value} s" if value is not None else "?"


def verdict(met: bool | None) -> str:
    """``met``, ``**missed**`` or ``?`` (no target was judged)."""
    return "?" if met is None else ("met" if met else "**missed**")
