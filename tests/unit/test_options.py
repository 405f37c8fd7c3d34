"""The option table: every command's options declared once, used by invoke and by the entry points."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.cli.invoke_tasks import collection, entry_point
from skippy.cli.options import COMMANDS, JSON, VERBOSE, Command, render_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_entry_point_takes_exactly_the_declared_options(command: Command) -> None:
    params = inspect.signature(entry_point(command)).parameters
    keywords = {name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY} - {"root"}
    assert keywords == {o.keyword for o in command.all_options}
    assert next(iter(params)) == "env"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_task_has_json_and_verbose_and_no_short_flags(command: Command) -> None:
    task = collection(ROOT)[command.name.replace("_", "-")]
    args = {a.name: a for a in task.get_arguments()}
    assert JSON.name in args and VERBOSE.name in args
    for arg in args.values():
        assert all(len(n) > 1 for n in arg.names), (command.name, arg.names)
    for option in command.all_options:
        assert args[option.name].help == option.help


def test_dash_h_is_help_on_every_task() -> None:
    # -h was taken by --checkout on generate and regenerate before the table set auto_shortflags off
    for name in ("generate", "regenerate", "prepare"):
        result = subprocess.run(
            [sys.executable, "-m", "invoke", name, "-h"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "--verbose" in result.stdout
        assert "--json" in result.stdout


def test_render_table_lists_flags_with_their_values() -> None:
    table = render_table(next(c for c in COMMANDS if c.name == "pin_bump").all_options)
    assert "| `--backend NAME` | build and spot-check this backend (repeatable; default cpu) |" in table
    assert "| `--dry-run` |" in table
    summary = render_table(next(c for c in COMMANDS if c.name == "summary").options)
    assert "| `OLD` | older upstream commit |" in summary
