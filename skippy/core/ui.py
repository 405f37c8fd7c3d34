"""CI-aware output: timed steps, ``::group::`` folds and the step summary on
GitHub Actions, plain lines elsewhere.  Human output goes to stderr so that
``--json`` reports own stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NoReturn, TextIO

from skippy.core.annotations import Annotation
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
    #: the progress line shown in place right now (cleared before any other line is printed)
    _live: Progress | None = field(default=None, init=False, repr=False)

    def already_said(self, message: str) -> bool:
        return message in self.said

    @property
    def github(self) -> bool:
        return self.env.get("GITHUB_ACTIONS") == "true"

    @property
    def live(self) -> bool:
        """Whether progress may redraw one line in place: a terminal, not CI, not quiet."""
        isatty = getattr(self.stream, "isatty", None)
        on_ci = self.github or self.env.get("CI", "").lower() in ("1", "true", "yes")
        return bool(not self.quiet and not on_ci and isatty is not None and isatty())

    def _print(self, text: str) -> None:
        live = self._live
        if live is None:
            print(text, file=self.stream, flush=True)
            return
        with live.lock:  # a watcher thread does not redraw between the wipe and the line
            live.clear()
            print(text, file=self.stream, flush=True)

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
        self._print(redact_urls("\n".join(lines)))

    def info(self, message: str) -> None:
        self.said.add(message)
        if not self.quiet:
            self._print(redact_urls(message))

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            self._print("  " + redact_urls(message))

    def command(self, line: str) -> None:
        self.detail(line)

    def warn(self, message: str) -> None:
        self.said.add(message)
        prefix = "::warning::" if self.github else "warning: "
        self._print(prefix + redact_urls(message))

    def annotate(self, annotation: Annotation) -> None:
        """A finding on a file's line in GitHub Actions' view of the run (nothing elsewhere: the
        command's report says it)."""
        if self.github:
            self._print(redact_urls(annotation.render()))

    def error(self, message: str) -> None:
        message = redact_urls(message)
        if self.github:
            first, _, rest = message.partition("\n")
            self._print("::error::" + first.removeprefix("error: "))
            if rest:
                self._print(rest)
        else:
            self._print(message)

    def progress(self, label: str, total: int | None = None, *, verb: str = "fetching") -> Progress:
        """A :class:`Progress` for one long step (``with console.progress(...) as p: p.advance(n)``)."""
        return Progress(self, label, total, verb=verb)

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
        next_step = f"use one of the valid options ({self.prog} --help)"
        missing = re.fullmatch(r"argument (?:\S+/)?(\S+): expected one argument", message)
        if missing:
            # `--server-arg --port`: argparse takes a value that starts with - for the next option
            flag = missing[1]
            next_step = (
                f"give {flag} its value; one that starts with - is attached with =: {flag}=VALUE ({self.prog} --help)"
            )
        raise SettingsError(
            f"{self.prog}: {message}",
            untouched="everything: nothing was started",
            next_step=next_step,
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


#: seconds between two redraws of a progress line on a terminal
REDRAW_SECONDS: Final = 0.2
#: seconds between two looks at what a watched step has written (:meth:`Progress.watching`)
WATCH_SECONDS: Final = 0.5


class Progress:
    """Size, rate and share done of one long step (a download, an unpack, a copy).

    On a terminal (:attr:`Console.live`) one line is redrawn in place, at most
    every :data:`REDRAW_SECONDS`: ``name: 12.0 MiB / 71.4 MiB (17%), 5.1 MiB/s``;
    a line the console prints meanwhile clears it first.  Anywhere else (a log,
    CI) the step gets one line when it starts (``fetching name (71.4 MiB)``) and
    one when it ends (``name: 71.4 MiB in 14.0 s (5.1 MiB/s)``).  Safe to update
    from a watcher thread (:meth:`watching`) while the main thread prints.
    """

    def __init__(
        self,
        console: Console,
        label: str,
        total: int | None = None,
        *,
        verb: str = "fetching",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.label = label
        self.total = total
        self.live = console.live
        self.done_bytes = 0
        self.clock = clock
        self.started = clock()
        self.ended = False
        self._shown: float | None = None
        self._drawn = False
        self.lock = threading.RLock()
        if not self.live:
            console.info(f"{verb} {label}" + (f" ({human_size(total)})" if total else ""))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.finish()
        else:
            self.abandon()

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more are done."""
        with self.lock:
            self.set(self.done_bytes + nbytes)

    def set(self, done: int) -> None:
        """``done`` bytes are done so far."""
        with self.lock:
            if self.ended:
                return
            self.done_bytes = done
            now = self.clock()
            if self.live and (self._shown is None or now - self._shown >= REDRAW_SECONDS):
                self._shown = now
                self._draw(self.line(now, live=True))

    def finish(self, done: int | None = None) -> None:
        """The step ended well: its closing line (``done`` bytes when given, e.g. the known total)."""
        with self.lock:
            if self.ended:
                return
            if done is not None:
                self.done_bytes = done
            line = self.line(self.clock(), live=False)
            self._end()
            self.console.info(line)

    def abandon(self) -> None:
        """The step failed: the live line is cleared, no closing line (the error says why)."""
        with self.lock:
            if not self.ended:
                self.clear()
                self._end()

    def clear(self) -> None:
        """Wipe the live line (before another line is printed; the next update draws it again)."""
        with self.lock:
            if self._drawn:
                self.console.stream.write("\r\x1b[K")
                self.console.stream.flush()
                self._drawn = False
                self._shown = None

    def line(self, now: float, *, live: bool) -> str:
        elapsed = max(now - self.started, 1e-6)
        rate = human_size(self.done_bytes / elapsed)
        of = f" / {human_size(self.total)}" if self.total else ""
        if live:
            share = f" ({min(100, 100 * self.done_bytes // self.total)}%)" if self.total else ""
            return f"{self.label}: {human_size(self.done_bytes)}{of}{share}, {rate}/s"
        return f"{self.label}: {human_size(self.done_bytes)}{of} in {elapsed:.1f} s ({rate}/s)"

    @contextlib.contextmanager
    def watching(self, measure: Callable[[], int], *, every: float = WATCH_SECONDS) -> Iterator[Progress]:
        """While the block runs, a thread sets the bytes done to ``measure()`` every ``every`` seconds
        (what a child process has written so far, for instance); ``measure`` must not raise."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(every):
                self.set(measure())

        thread = threading.Thread(target=watch, name=f"progress {self.label}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def _draw(self, text: str) -> None:
        self.console._live = self
        self.console.stream.write("\r" + redact_urls(text) + "\x1b[K")
        self.console.stream.flush()
        self._drawn = True

    def _end(self) -> None:
        self.clear()
        self.ended = True
        if self.console._live is self:
            self.console._live = None


def tree_size(path: Path) -> int:
    """Bytes of the regular files at or under ``path``, links not followed (0 where nothing is;
    what vanishes meanwhile is not counted)."""
    try:
        info = path.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size if stat.S_ISREG(info.st_mode) else 0
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                found = Path(folder, name).lstat()
                if stat.S_ISREG(found.st_mode):
                    total += found.st_size
    return total
