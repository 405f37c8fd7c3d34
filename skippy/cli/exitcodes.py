"""The exit codes of skippy's commands, one per error class, made from :mod:`skippy.core.errors`.

docs/housekeeping.md shows the table between ``exit-codes`` markers (:mod:`tooling.docs` makes it
again and checks it); a unit test holds every class to a code of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from skippy.core import errors
from skippy.core.errors import SkippyError

#: what a run that did not fail exits with (a skipped build session too: its report says why)
SUCCESS: Final = "the run finished (or was skipped, and its report says why)"


def error_classes() -> list[type[SkippyError]]:
    """Every error class :mod:`skippy.core.errors` defines except the base, by exit code."""
    found = [
        cls
        for _name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, SkippyError) and cls is not SkippyError and cls.__module__ == errors.__name__
    ]
    return sorted(found, key=lambda cls: (cls.exit_code, cls.__name__))


def meaning(cls: type) -> str:
    """The first paragraph of a class's own docstring, on one line."""
    doc = inspect.getdoc(cls) if "__doc__" in vars(cls) else None
    return " ".join((doc or "").split("\n\n")[0].split()).replace("``", "`")


def _parent(cls: type[SkippyError]) -> str:
    base = cls.__bases__[0]
    return "" if base is SkippyError else f" (under `{base.__name__}`)"


def render_exit_codes(_root: Path, classes: Sequence[type[SkippyError]] | None = None) -> str:
    """The table: each exit code, the error's name (``"error"`` in a ``--json`` report) and what it means."""
    lines = [
        '| exit code | error (`"error"` in `--json`) | what happened |',
        "| --- | --- | --- |",
        f"| 0 | - | {SUCCESS} |",
    ]
    for cls in error_classes() if classes is None else classes:
        text = meaning(cls).replace("|", "\\|")
        lines.append(f"| {cls.exit_code} | `{cls.__name__}`{_parent(cls)} | {text} |")
    return "\n".join(lines)
