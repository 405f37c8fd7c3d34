"""The invoke tasks, made from :data:`skippy.cli.commands.COMMANDS`.

Each task's flags, short forms, help and positional arguments come from the
option table (the nox sessions' parsers are made from the same table); its body
hands what invoke parsed to the one path (:func:`skippy.cli.run.invoke_main`),
which makes the typed options object and runs the command.  ``-h`` is always
help: no option has it as its short form.  invoke's own argument errors (an
unknown flag, a missing value) are reported as skippy's, with ``--json`` as one
JSON report (:func:`report_parse_errors`).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Final

from invoke.collection import Collection
from invoke.exceptions import Exit, ParseError
from invoke.program import Program
from invoke.tasks import Task

from skippy.cli.command import Command
from skippy.cli.commands import COMMANDS


class _Task(Task[Any]):
    """A task whose options take the short forms the table gives them (and no others)."""

    def __init__(self, *args: Any, shorts: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shorts = shorts

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        short = self.shorts.get(name)
        if short:
            opts["names"] = [*opts["names"], short.lstrip("-")]
        return opts


def make_task(command: Command, root: Path) -> Task[Any]:
    options = command.all_options

    def body(c: object, **values: object) -> None:
        from skippy.cli.run import invoke_main

        code = invoke_main(command, values, os.environ, root=root).code
        if code:
            raise Exit(code=code)

    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for o in options:
        # invoke only reads the command line: every value is checked and typed on the one path
        default = {"positional": inspect.Parameter.empty, "flag": False, "text": "", "list": None}.get(o.kind)
        params.append(inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # invoke reads the signature
    body.__name__ = command.name
    body.__doc__ = command.help
    return _Task(
        body,
        name=command.task,
        help={o.flag.removeprefix("--"): o.help for o in options},
        iterable=[o.name for o in options if o.kind == "list"],
        positional=[o.name for o in options if o.kind == "positional"],
        auto_shortflags=False,
        shorts={o.name: o.short for o in options if o.short},
    )


#: the short forms that take a value (``-D``, ``-j``), and whether the value may be attached
_VALUE_SHORTS: Final = frozenset(o.short for c in COMMANDS for o in c.all_options if o.short and o.kind != "flag")


def attached_values(argv: list[str]) -> list[str]:
    """``-DNAME=VALUE`` and ``-j2`` as invoke reads them (``-D NAME=VALUE``, ``-j 2``): its
    parser would split ``-DNAME=VALUE`` at the ``=``; written either way, as for nox.  A
    value-taking short form that ends the line is refused (invoke would drop it silently)."""
    out: list[str] = []
    for token in argv:
        short = token[:2]
        out += [short, token[2:]] if short in _VALUE_SHORTS and len(token) > 2 else [token]
    if out and out[-1] in _VALUE_SHORTS:
        raise ParseError(f"{out[-1]} needs a value")
    return out


def report_parse_errors(program: Program) -> None:
    """invoke's argument errors on ``program`` reported as skippy's: the error with the task's
    valid options, exit code 2, and with ``--json`` one JSON report on stdout."""
    if getattr(program, "_skippy_parse_errors", False):
        return
    parse_tasks = program.parse_tasks

    def parse() -> None:
        try:
            if program.core is not None:
                program.core.unparsed = attached_values(list(program.core.unparsed))
            parse_tasks()
        except ParseError as exc:
            from skippy.cli.run import invoke_parse_error

            argv = list(program.core.unparsed) if program.core is not None else []
            context = getattr(exc, "context", None)
            named = getattr(context, "name", None) or (argv[0] if argv else "")
            known = next((c for c in COMMANDS if c.task == named), None)
            ran = invoke_parse_error(known.task if known else "", str(exc), argv, os.environ, known=known)
            raise Exit(code=ran.code) from None

    program.parse_tasks = parse  # type: ignore[method-assign]
    program._skippy_parse_errors = True  # type: ignore[attr-defined]


def collection(root: Path) -> Collection:
    """Every command of the option table as an invoke task."""
    tasks = Collection()
    for command in COMMANDS:
        tasks.add_task(make_task(command, root))
    try:
        from invoke.main import program
    except ImportError:  # pragma: no cover - invoke always has it
        return tasks
    report_parse_errors(program)
    return tasks
