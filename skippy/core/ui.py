"""CI-aware output: timed steps, ``::group::`` folds and the step summary on
GitHub Actions, plain lines elsewhere.  Human output goes to stderr so that
``--json`` reports own stdout.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO


@dataclass
class Console:
    env: Mapping[str, str] = field(default_factory=dict)
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    quiet: bool = False
    verbose: bool = False

    @property
    def github(self) -> bool:
        return self.env.get("GITHUB_ACTIONS") == "true"

    def info(self, message: str) -> None:
        if not self.quiet:
            print(message, file=self.stream, flush=True)

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            print("  " + message, file=self.stream, flush=True)

    def command(self, line: str) -> None:
        self.detail(line)

    def warn(self, message: str) -> None:
        prefix = "::warning::" if self.github else "warning: "
        print(prefix + message, file=self.stream, flush=True)

    def error(self, message: str) -> None:
        if self.github:
            first, _, rest = message.partition("\n")
            print("::error::" + first.removeprefix("error: "), file=self.stream, flush=True)
            if rest:
                print(rest, file=self.stream, flush=True)
        else:
            print(message, file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        started = time.monotonic()
        if self.github:
            print(f"::group::{title}", file=self.stream, flush=True)
        else:
            self.info(f"==> {title}")
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            if self.github:
                print("::endgroup::", file=self.stream, flush=True)
            self.detail(f"{title}: {elapsed:.2f} s")

    def summary(self, markdown: str) -> None:
        """Append to the GitHub step summary when there is one."""
        path = self.env.get("GITHUB_STEP_SUMMARY")
        if path:
            with Path(path).open("a", encoding="utf-8") as fh:
                fh.write(markdown.rstrip() + "\n\n")


def print_json(report: Mapping[str, Any], stream: TextIO | None = None) -> None:
    out = stream if stream is not None else sys.stdout
    out.write(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    out.flush()
