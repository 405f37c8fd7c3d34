"""What the GitHub workflows call besides nox and invoke: ``python -m tooling.ci``.

The workflows hold no logic of their own; the two decisions they need live
here, unit-tested:

* ``assert-ran REPORT SESSION...``: read the JSON that ``nox --report REPORT``
  wrote and fail unless every named session ran and succeeded.  nox exits 0
  for a *skipped* session (``session.skip``, e.g. ``--skip-unavailable`` or
  ``SKIPPY_SKIP_UNAVAILABLE=1`` on a runner without the toolchain), so a job
  that checked only the exit code would pass having built nothing.
* ``publish TITLE FILE``: print a command's saved output to the log and append
  it, fenced, to the GitHub step summary (``$GITHUB_STEP_SUMMARY``), e.g. the
  canary's triage table and bisect result after a failed pin bump.  With
  ``--append-to OUT`` the fenced text is also appended to ``OUT`` (the canary's
  pull request to the newest compatible commit carries the bisect result).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from skippy.core.errors import CIError

#: nox's result strings (``nox.sessions.Status``) and what a CI job makes of them
RAN_OK: Final = "success"


@dataclass(frozen=True)
class SessionResult:
    name: str
    result: str
    reason: str | None
    signatures: tuple[str, ...]

    def matches(self, wanted: str) -> bool:
        return wanted == self.name or wanted in self.signatures


def parse_report(data: Any) -> tuple[SessionResult, ...]:
    """The sessions of a ``nox --report`` JSON document, in the order nox ran them."""
    if not isinstance(data, Mapping) or not isinstance(data.get("sessions"), list):
        raise CIError(
            "not a nox report: expected an object with a 'sessions' list",
            untouched="everything",
            next_step="pass the file written by `nox --report FILE -s SESSION`",
        )
    out: list[SessionResult] = []
    for entry in data["sessions"]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise CIError(
                f"not a nox report: a session entry without a name ({entry!r})",
                untouched="everything",
                next_step="pass the file written by `nox --report FILE -s SESSION`",
            )
        reason = entry.get("reason")
        signatures = entry.get("signatures") or ()
        out.append(
            SessionResult(
                name=entry["name"],
                result=str(entry.get("result", "")),
                reason=str(reason) if reason else None,
                signatures=tuple(str(s) for s in signatures),
            )
        )
    return tuple(out)


def ran_problems(results: Sequence[SessionResult], wanted: Sequence[str]) -> list[str]:
    """One line per wanted session that did not run to success (empty: all ran)."""
    problems: list[str] = []
    for name in wanted:
        found = [r for r in results if r.matches(name)]
        if not found:
            ran = ", ".join(r.name for r in results) or "none"
            problems.append(f"{name}: not in the report (sessions in it: {ran})")
            continue
        for r in found:
            if r.result != RAN_OK:
                why = f": {r.reason}" if r.reason else ""
                problems.append(f"{r.name}: {r.result or 'no result'}{why}")
    return problems


def assert_ran(report_path: Path, sessions: Sequence[str]) -> tuple[SessionResult, ...]:
    """Raise CIError unless every session in ``sessions`` ran and succeeded."""
    if not sessions:
        raise CIError(
            "assert-ran needs at least one session name",
            untouched="everything",
            next_step="python -m tooling.ci assert-ran REPORT build-cpu",
        )
    try:
        data = json.loads(report_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CIError(
            f"cannot read the nox report {report_path}: {exc.strerror or exc}",
            untouched="everything",
            next_step=f"run nox with --report {report_path} before this check",
        ) from None
    except ValueError as exc:
        raise CIError(
            f"the nox report {report_path} is not JSON: {exc}",
            untouched="everything",
            next_step=f"rerun nox with --report {report_path}",
        ) from None
    results = parse_report(data)
    problems = ran_problems(results, sessions)
    if problems:
        raise CIError(
            f"{len(problems)} nox session(s) did not run to success: a skipped session proves nothing",
            untouched="everything: this check only reads the report",
            next_step=(
                "read the session log above; a skipped build needs its toolchain installed on this runner "
                "(or no --skip-unavailable / SKIPPY_SKIP_UNAVAILABLE), a failed one its error fixed"
            ),
            details="\n".join(problems),
        )
    return results


def fenced(title: str, text: str) -> str:
    """Markdown: a heading and ``text`` in a code fence longer than any backtick run inside it."""
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    body = text.rstrip("\n") or "(no output)"
    return f"### {title}\n\n{fence}text\n{body}\n{fence}\n"


def publish(title: str, path: Path, env: Mapping[str, str], out: TextIO, *, append_to: Path | None = None) -> None:
    """Echo ``path`` to ``out`` and append it, fenced, to the step summary when there is one
    (and to ``append_to`` when given)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        text = f"({path.name} was not written: the step that makes it did not run or failed early)"
    out.write(text if text.endswith("\n") or not text else text + "\n")
    targets = [Path(s) for s in (env.get("GITHUB_STEP_SUMMARY"), append_to) if s]
    for target in targets:
        with target.open("a", encoding="utf-8") as fh:
            fh.write(fenced(title, text) + "\n")


USAGE: Final = """\
usage: python -m tooling.ci assert-ran REPORT SESSION [SESSION...]
       python -m tooling.ci publish TITLE FILE [--append-to OUT]
"""

COMMANDS: Final = ("assert-ran", "publish")


def main(argv: Sequence[str], env: Mapping[str, str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        stdout.write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    try:
        if command == "assert-ran" and len(rest) >= 2:
            results = assert_ran(Path(rest[0]), rest[1:])
            names = ", ".join(r.name for r in results if any(r.matches(w) for w in rest[1:]))
            stdout.write(f"ran to success: {names}\n")
            return 0
        if command == "publish" and len(rest) == 2:
            publish(rest[0], Path(rest[1]), env, stdout)
            return 0
        if command == "publish" and len(rest) == 4 and rest[2] == "--append-to":
            publish(rest[0], Path(rest[1]), env, stdout, append_to=Path(rest[3]))
            return 0
    except CIError as exc:
        prefix = "::error::" if env.get("GITHUB_ACTIONS") == "true" else ""
        first, _, tail = exc.render().partition("\n")
        stderr.write(prefix + first.removeprefix("error: ") + "\n" + (tail + "\n" if tail else ""))
        return exc.exit_code
    stderr.write(f"unknown command or wrong arguments: {' '.join(args)}\n{USAGE}")
    return 2


__all__ = [
    "COMMANDS",
    "CIError",
    "SessionResult",
    "assert_ran",
    "fenced",
    "main",
    "parse_report",
    "publish",
    "ran_problems",
]


if __name__ == "__main__":  # `python -m tooling.ci`: the entry point, the one place the environment is read
    import os

    raise SystemExit(main(sys.argv[1:], os.environ))
