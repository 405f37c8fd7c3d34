"""The one path every command takes, from invoke and from nox alike.

parse (invoke's parser or the nox session's, both made from the option table) ->
the command's typed options object (:func:`skippy.cli.options.make`, once) ->
settings -> the command's action -> catch -> report (human, or one JSON report on
stdout with ``--json``) -> exit code.  A success that leaves something to do ends, as every
error does, with a ``next:`` line (the report's ``next``).  Errors are caught here, once: a
SkippyError is rendered and mapped to its exit code, Ctrl-C to 130, SIGTERM (handled as
Ctrl-C is: the running child's process group is stopped) to 143, an exception skippy did
not foresee to 70 (its traceback on stderr); with ``--json`` each of them still prints one
JSON report.
"""

from __future__ import annotations

import argparse
import contextlib
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from skippy.cli.command import BUILD_SESSION, INTERRUPTED, Action, Command, Report
from skippy.cli.options import JSON_FLAG, Common, Option, make
from skippy.core import proc
from skippy.core.errors import InternalError, Interrupted, SettingsError, SkippyError, TerminatedError
from skippy.core.settings import Settings, find_root
from skippy.core.ui import Console, OptionParser, print_json, say

#: the exit code of a run that finished
OK: Final = 0


@dataclass(frozen=True)
class Ran:
    code: int
    skipped: str | None = None
    #: the JSON report printed (or that would have been), for tests
    report: Mapping[str, Any] = field(default_factory=dict)


def load(root: Path | None, env: Mapping[str, str], console: Console | None = None) -> Settings:
    """The settings; with ``console``, first what killed runs left is told and swept."""
    settings = Settings.load(root if root is not None else find_root(Path.cwd()), env)
    if console is not None:
        from skippy.queue.leftovers import sweep

        sweep(settings, console)
    return settings


def failed(exc: SkippyError, console: Console, *, as_json: bool) -> Ran:
    """A failure, reported once: its ending (when it carries one), the error, its JSON report."""
    ending = exc.ending
    if ending is not None:
        ending.show(console)
    report = {"ok": False, **exc.as_dict()}
    if ending is not None:
        report["proofs"] = ending.as_dict()["proofs"]
    if as_json:
        print_json(report)
    for annotation in exc.annotations:
        console.annotate(annotation)
    console.error(exc.render())
    return Ran(exc.exit_code, report=report)


def guarded(
    action: Callable[[], Report | dict[str, Any]],
    *,
    console: Console,
    as_json: bool,
    interrupted: str = INTERRUPTED,
    rerun: str = "",
) -> Ran:
    """Run ``action`` and report its outcome (see the module's docstring)."""
    # SIGTERM (timeout, a cancelled CI job) unwinds as Ctrl-C does: the running child's whole
    # process group is stopped on the way out, and the report is still printed
    with proc.sigterm_unwinds() as unwinding:
        try:
            done = action()
        except SkippyError as exc:
            unwinding.finish()
            return failed(exc, console, as_json=as_json)
        except (KeyboardInterrupt, proc.Terminated) as exc:
            unwinding.finish()
            return failed(_interrupted(exc, interrupted, rerun), console, as_json=as_json)
        except Exception as exc:
            unwinding.finish()
            # a bug, not a failure we foresaw: the traceback for the bug report, and still one report
            console.error(traceback.format_exc().rstrip())
            return failed(InternalError(exc), console, as_json=as_json)
        unwinding.finish()
        return _succeeded(done, console, as_json=as_json)


def _interrupted(exc: BaseException, untouched: str, rerun: str) -> Interrupted:
    """Ctrl-C (exit code 130) or SIGTERM (143, 128 + SIGTERM, as the shell reports a process it ended)."""
    terminated = isinstance(exc, proc.Terminated)
    return (TerminatedError if terminated else Interrupted)(
        "interrupted by SIGTERM" if terminated else "interrupted",
        untouched=untouched,
        next_step=f"rerun {rerun}" if rerun else "rerun the command",
    )


def _succeeded(done: Report | dict[str, Any], console: Console, *, as_json: bool) -> Ran:
    report = done if isinstance(done, Report) else Report(done)
    data = {"ok": True, **report.data}
    next_step = report.next_step or data.get("next") or None
    if next_step is not None:
        data["next"] = next_step
    if report.ending is not None:
        data["proofs"] = report.ending.as_dict()["proofs"]
    if as_json:
        print_json(data)
    elif report.text:
        say(report.text)
    if report.ending is not None:
        report.ending.show(console)
    if next_step is not None and not report.skipped:
        console.info(f"next: {next_step}")
    return Ran(OK, report.skipped, data)


def then(options: object, settings: Settings, report: Report) -> Report:
    """A success's next step that its own report cannot know: after a build of the workdir as it
    stands (``--workdir-as-is``), carrying that work into the queue
    (:func:`skippy.queue.session.after_as_is`)."""
    if report.next_step or report.skipped or getattr(options, "workdir_as_is", False) is not True:
        return report
    from skippy.queue.session import after_as_is

    return replace(report, next_step=after_as_is(settings))


def run(
    c: Command,
    values: Mapping[str, object],
    env: Mapping[str, str],
    *,
    root: Path | None,
    prog: str,
    action: Action | None = None,
) -> Ran:
    """``c`` with the raw ``values`` its parser found (option name -> value; missing: not given);
    ``action`` replaces the command's own (tests)."""
    as_json = values.get("json") is True
    console = Console(env=env, verbose=values.get("verbose") is True)
    act = action or c.action

    def step() -> Report:
        options = make(c.options_type, values, env, prog=prog)
        # --verbose: every command run is shown (and each step's time, by the console)
        with proc.echoing(console.command) if options.verbose else contextlib.nullcontext():
            settings = load(root, env, console)
            return then(options, settings, act(options, settings, console))

    return guarded(step, console=console, as_json=as_json, interrupted=c.interrupted, rerun=prog)


# --- nox ---------------------------------------------------------------------------


def nox_prog(c: Command, backend: str | None = None) -> str:
    session = f"build-{backend or '<backend>'}" if c.nox == BUILD_SESSION else c.nox
    return f"nox -s {session} --"


def _add(parser: OptionParser, option: Option) -> None:
    if option.kind == "positional":
        parser.add_argument(option.name, metavar=option.metavar, help=option.help)
        return
    names = option.names
    if option.kind == "flag":
        parser.add_argument(*names, dest=option.name, action="store_true", default=None, help=option.help)
    elif option.kind == "list":
        parser.add_argument(*names, dest=option.name, action="append", metavar=option.metavar, help=option.help)
    else:
        parser.add_argument(*names, dest=option.name, metavar=option.metavar, help=option.help)


def nox_parser(c: Command, backend: str | None = None) -> OptionParser:
    """The nox session's arguments, made from the option table; anything else is an error."""
    parser = OptionParser(nox_prog(c, backend), description=c.help)
    for option in c.nox_options:
        _add(parser, option)
    return parser


def nox_values(c: Command, argv: Sequence[str], backend: str | None = None) -> dict[str, object]:
    """What the nox session's parser found: the raw values, not yet typed (:func:`run` does that)."""
    ns: argparse.Namespace = nox_parser(c, backend).parse(argv)
    values = {k: v for k, v in vars(ns).items() if v is not None}
    if backend is not None:
        values["backend"] = backend
    return values


# --- invoke ------------------------------------------------------------------------


def invoke_main(c: Command, values: Mapping[str, object], env: Mapping[str, str], *, root: Path) -> Ran:
    """``invoke TASK ...``: the values invoke's parser found (its tasks are made from the same table)."""
    given = {k: v for k, v in values.items() if v not in (None, "", False, [], ())}
    ran = run(c, given, env, root=root, prog=f"invoke {c.task}")
    if ran.skipped:
        Console(env=env).info(f"skipped: {ran.skipped}")
    return ran


def invoke_parse_error(
    task: str, message: str, argv: Sequence[str], env: Mapping[str, str], *, known: Command | None = None
) -> Ran:
    """invoke's own argument error (an unknown flag, a missing value), reported as ours;
    ``known``: the task's command, whose valid options are listed."""
    where = f"invoke {task}" if task else "invoke"
    lines = [f"  {', '.join(o.names)}: {o.help}" for o in (known.all_options if known is not None else ())]
    error = SettingsError(
        f"{where}: {message}",
        untouched="everything: nothing was started",
        next_step=f"use one of the valid options (invoke --help {task})" if task else "invoke --list",
        details="valid options:\n" + "\n".join(lines) if lines else None,
    )
    return failed(error, Console(env=env), as_json=JSON_FLAG in argv)


__all__ = [
    "Action",
    "Common",
    "Ran",
    "Report",
    "failed",
    "guarded",
    "invoke_main",
    "invoke_parse_error",
    "load",
    "nox_parser",
    "nox_values",
    "run",
]
