"""GitHub annotations: a finding shown on the line of the file it is about, as a compiler's
problem matcher shows a warning on a source line.

``Console.annotate`` prints them as workflow commands (``::warning file=…,line=…,title=…::…``)
when it runs in GitHub Actions, and nothing elsewhere: the same findings are in the command's
report.  :func:`patch_line` finds the line of a patch file to put one on: the hunk of that
patch that changes a given line of a given file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

LEVELS: Final[tuple[str, ...]] = ("notice", "warning", "error")
_HUNK = re.compile(rb"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
_DIFF = re.compile(rb"^diff --git a/(.*) b/(.*)$")


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


@dataclass(frozen=True)
class Annotation:
    file: str  # relative to the repository's top level, as GitHub shows files
    line: int | None
    title: str
    message: str
    level: str = "warning"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"annotation level {self.level!r} is not one of {', '.join(LEVELS)}")

    def render(self) -> str:
        props = [f"file={_escape_property(self.file)}"]
        if self.line is not None:
            props.append(f"line={self.line}")
        props.append(f"title={_escape_property(self.title)}")
        return f"::{self.level} {','.join(props)}::{_escape_data(self.message)}"


def patch_line(patch: bytes, path: str, first: int | None = None, last: int | None = None) -> int | None:
    """The line of ``patch`` (1-based) to annotate for ``path``: the header of its first hunk whose
    new side overlaps lines ``first..last`` of ``path``, else its ``diff --git`` line, else None."""
    diff_line: int | None = None
    for number, line in enumerate(patch.splitlines(), start=1):
        diff = _DIFF.match(line)
        if diff:
            if diff_line is not None:
                break  # past the file's hunks
            if diff.group(2).decode("utf-8", "replace") == path:
                diff_line = number
            continue
        if diff_line is None:
            continue
        hunk = _HUNK.match(line)
        if hunk is None or first is None:
            continue
        start = int(hunk.group(1))
        count = int(hunk.group(2)) if hunk.group(2) is not None else 1
        if start <= (last if last is not None else first) and first <= start + max(count, 1) - 1:
            return number
    return diff_line
