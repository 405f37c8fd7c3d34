"""CI-aware output: timed steps, ``::group::`` folds and the step summary on
GitHub Actions, plain lines elsewhere.  Human output goes to stderr so that
``--json`` reports own stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NoReturn, TextIO

from skippy.core.errors import SettingsError
from skippy.core.redact import redact_urls

#: a proof's verdict, and how a closing block shows it
Verdict = Literal["pass", "fail", "not run"]
MARKS: Final[Mapping[Verdict, str]] = {"pass": "✓", "fail": "✗", "not run": "-"}
#: ANSI colours (SGR codes) of the styles :meth:`Console.paint` knows
_SGR: Final = {"pass": "32", "fail": "31", "not run": "33", "bold": "1"}


@dataclass
class Console:
    env: Mapping[str, str] = field(default_factory=dict)
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    quiet: bool = False
    verbose: bool = False
    #: what info and warn have printed, so that a closing list of notes says nothing twice
    said: set[str] = field(default_factory=set, repr=False)

    def already_said(self, message: str) -> bool:
        return message in self.said

    @property
    def github(self) -> bool:
        return self.env.get("GITHUB_ACTIONS") == "true"

    @property
    def color(self) -> bool:
        """Colour on a terminal; none when piped, with ``NO_COLOR`` set (no-color.org) or ``TERM=dumb``."""
        if self.env.get("NO_COLOR") or self.env.get("TERM") == "dumb":
            return False
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def paint(self, text: str, style: str) -> str:
        """``text`` in ``style`` (a verdict or ``bold``) when colour is on."""
        code = _SGR.get(style)
        return f"\033[{code}m{text}\033[0m" if code and self.color else text

    def block(self, title: str, rows: Sequence[tuple[Verdict, str, str]], tail: Sequence[str] = ()) -> None:
        """A closing block: its title, one line per (verdict, name, detail), then ``tail``'s lines."""
        if self.quiet:
            return
        width = max((len(name) for _, name, _ in rows), default=0)
        lines = [self.paint(title, "bold")]
        for verdict, name, detail in rows:
            said = f"not run: {detail}" if verdict == "not run" else detail
            lines.append(f"  {self.paint(MARKS[verdict], verdict)} {name.ljust(width)}  {said}")
        lines += list(tail)
        print(redact_urls("\n".join(lines)), file=self.stream, flush=True)

    def info(self, message: str) -> None:
        self.said.add(message)
        if not self.quiet:
            print(redact_urls(message), file=self.stream, flush=True)

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            print("  " + redact_urls(message), file=self.stream, flush=True)

    def command(self, line: str) -> None:
        self.detail(line)

    def warn(self, message: str) -> None:
        self.said.add(message)
        prefix = "::warning::" if self.github else "warning: "
        print(prefix + redact_urls(message), file=self.stream, flush=True)

    def error(self, message: str) -> None:
        message = redact_urls(message)
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
            print(f"::group::{redact_urls(title)}", file=self.stream, flush=True)
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
                fh.write(redact_urls(markdown).rstrip() + "\n\n")


def print_json(report: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """``report`` as JSON, with the credentials of any URL in it masked (:func:`redact_urls`)."""
    out = stream if stream is not None else sys.stdout
    out.write(redact_urls(json.dumps(report, indent=2, sort_keys=True, default=str)) + "\n")
    out.flush()


def say(text: str) -> None:
    """A command's human report on stdout (credentials in URLs masked, as everywhere)."""
    print(redact_urls(text), flush=True)


class OptionParser(argparse.ArgumentParser):
    """argparse for the entry points' options, failing as skippy fails.

    An unknown option, a missing or bad value: a :class:`~skippy.core.errors.SettingsError`
    (so ``--json`` still gets its JSON report) naming the option, the closest valid
    one and the list of valid options, raised before any work.  No abbreviations:
    ``--no-spot`` is not ``--no-spot-check``.
    """

    def __init__(self, prog: str, *, description: str | None = None) -> None:
        super().__init__(prog=prog, description=description, allow_abbrev=False)

    def valid_options(self) -> list[str]:
        lines = []
        for action in self._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                names += f" {action.metavar or action.dest.upper()}"
            lines.append(f"{names}: {action.help}" if action.help else names)
        return lines

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        namespace, unknown = self.parse_known_args(list(argv))
        if unknown:
            known = [name for action in self._actions for name in action.option_strings]
            first = unknown[0]
            close = difflib.get_close_matches(first.split("=", 1)[0], known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            what = "unknown option" if first.startswith("-") else "unexpected argument"
            self.error(f"{what} {first}{hint}" + (f"; also {' '.join(unknown[1:])}" if unknown[1:] else ""))
        return namespace

    def error(self, message: str) -> NoReturn:
        raise SettingsError(
            f"{self.prog}: {message}",
            untouched="everything: nothing was started",
            next_step=f"use one of the valid options ({self.prog} --help)",
            details="valid options:\n" + "\n".join("  " + line for line in self.valid_options()),
        )


def human_size(n: float | None) -> str:
    """``123 B``, ``4.5 KiB``, ``67.8 MiB``, ``1.23 GiB``: sizes in console lines and messages."""
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"
