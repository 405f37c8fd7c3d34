"""The option table: every command's options declared once, parsed by invoke and by nox
the same way, and turned into the command's typed options object on one path."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import textwrap
import typing
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest
from invoke.parser import Parser
from invoke.parser.context import ParserContext

from skippy.cli.command import Command
from skippy.cli.commands import COMMANDS, command
from skippy.cli.invoke_tasks import attached_values, collection
from skippy.cli.options import Common, Option, make, render_table
from skippy.cli.run import nox_parser, nox_values

ROOT = Path(__file__).resolve().parents[2]
TASKS = collection(ROOT)
NOX_COMMANDS = [c for c in COMMANDS if c.nox]

#: a valid value for an option that takes one (the converters check these)
SAMPLES = {
    "backend": "vulkan",
    "define": "GGML_X=ON",
    "jobs": "3",
    "server": "bin/llama-server",
    "sha": "4df29be4f4c3",
}
#: options that are only valid together
COMPANIONS = {"core_head": "model_support_head", "model_support_head": "core_head"}


def invoke_values(c: Command, argv: list[str]) -> dict[str, object]:
    """What invoke's own parser makes of ``invoke TASK ARGV`` (the task made from the table)."""
    parser = Parser(contexts=TASKS.to_contexts(), initial=ParserContext())
    (ctx,) = parser.parse_argv([c.task, *attached_values(argv)])[1:]
    return dict(ctx.as_kwargs)


def argv_for(o: Option, name: str | None = None) -> list[str]:
    value = SAMPLES.get(o.name, f"{o.name}-value")
    if o.kind == "positional":
        return [value]
    flag = name or o.names[-1]
    return [flag] if o.kind == "flag" else [flag, value]


@pytest.mark.parametrize("c", NOX_COMMANDS, ids=lambda c: c.name)
def test_invoke_and_nox_show_the_same_options_with_the_same_short_forms(c: Command) -> None:
    task = TASKS[c.task]
    shown_by_invoke = {
        arg.attr_name or arg.name: sorted(("--" if len(n) > 1 else "-") + n for n in arg.names)
        for arg in task.get_arguments()
    }
    parser = nox_parser(c, "cpu")
    shown_by_nox = {a.dest: sorted(a.option_strings) for a in parser._actions if a.dest != "help"}
    session_only = {"backend"} if c.nox == "build-<backend>" else set()
    assert {k: v for k, v in shown_by_invoke.items() if k not in session_only} == shown_by_nox
    for o in c.all_options:
        assert sorted(o.names) == shown_by_invoke[o.name]


def typed_from_invoke(c: Command, argv: list[str]) -> Common:
    given = {k: v for k, v in invoke_values(c, argv).items() if v not in (None, "", False, [])}
    return make(c.options_type, given, {})


@pytest.mark.parametrize("c", COMMANDS, ids=lambda c: c.name)
def test_each_option_reaches_the_typed_options_object_from_invoke_and_from_nox(c: Command) -> None:
    """Each option, written on its own (short form and long), lands in its field, the same from
    invoke's parser and from the nox session's; nothing else changes (no option read twice)."""
    required = [o for o in c.all_options if o.kind == "positional"]
    base = [arg for o in required for arg in argv_for(o)]
    default = typed_from_invoke(c, base)
    assert all(getattr(default, o.name) == argv_for(o)[0] for o in required)
    for o in c.all_options:
        if o.kind == "positional":
            continue
        for name in o.names:
            argv = base + argv_for(o, name)
            if o.name in COMPANIONS:
                argv += argv_for(c.option(COMPANIONS[o.name]))
            typed = typed_from_invoke(c, argv)
            changed = {f.name for f in fields(typed) if getattr(typed, f.name) != getattr(default, f.name)}
            assert changed == {o.name} | ({COMPANIONS[o.name]} if o.name in COMPANIONS else set()), (c.name, argv)
            if c.nox and o in c.nox_options:
                assert make(c.options_type, nox_values(c, argv), {}) == typed, (c.name, argv)


@pytest.mark.parametrize("c", COMMANDS, ids=lambda c: c.name)
def test_every_command_takes_json_and_verbose_and_its_action_its_own_options(c: Command) -> None:
    assert issubclass(c.options_type, Common)
    assert [o.name for o in c.all_options][-2:] == ["json", "verbose"]
    assert all("h" not in (o.short or "") for o in c.all_options), "-h is help"
    # the table holds a function that imports the real action when it runs: both take the options type
    assert typing.get_type_hints(c.action)["options"] is c.options_type
    real = called_action(c)
    assert typing.get_type_hints(real)["options"] is c.options_type, (c.name, real)


def called_action(c: Command) -> Callable[..., object]:
    """The action ``c.action`` imports and calls (its one ``from MODULE import NAME``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(c.action)))
    (found,) = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert found.module is not None and len(found.names) == 1
    action: Callable[..., object] = getattr(importlib.import_module(found.module), found.names[0].name)
    return action


def test_a_flag_with_an_environment_default_is_read_from_the_table_only() -> None:
    build = command("build")
    assert make(build.options_type, {}, {"SKIPPY_SKIP_UNAVAILABLE": "1"}).skip_unavailable is True  # type: ignore[attr-defined]
    assert make(build.options_type, {}, {"SKIPPY_SKIP_UNAVAILABLE": "0"}).skip_unavailable is False  # type: ignore[attr-defined]
    assert build.option("skip_unavailable").env == "SKIPPY_SKIP_UNAVAILABLE"


def test_attached_values_are_read_as_nox_reads_them() -> None:
    assert attached_values(["-DA=1", "-j2", "-v", "--json"]) == ["-D", "A=1", "-j", "2", "-v", "--json"]


def test_dash_h_is_help_on_every_task() -> None:
    # -h was taken by --checkout on generate and regenerate before the table set auto_shortflags off
    for name in ("generate", "regenerate", "prepare", "build"):
        result = subprocess.run(
            [sys.executable, "-m", "invoke", name, "-h"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "-v, --verbose" in result.stdout
        assert "--json" in result.stdout


def test_render_table_lists_flags_with_their_values() -> None:
    table = render_table(command("pin_bump").all_options)
    assert "| `--backend NAME` | build and spot-check this backend (repeatable; default cpu) |" in table
    assert "| `--dry-run` |" in table
    assert "| `-v`, `--verbose` |" in table
    summary = render_table(command("summary").all_options)
    assert "| `OLD` | older upstream commit |" in summary
