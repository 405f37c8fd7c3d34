"""The invoke tasks, made from :data:`skippy.cli.options.COMMANDS`.

Each task's flags, help and positional arguments come from the option table;
its body imports the command's entry point (lazily: ``invoke --list`` stays
fast) and calls it once with the parsed values.  ``-h`` is always help: no
option gets a short flag.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke.collection import Collection
from invoke.exceptions import Exit
from invoke.tasks import Task

from skippy.cli.options import COMMANDS, Command


def entry_point(command: Command) -> Callable[..., int]:
    module, _, function = command.target.partition(":")
    found: Callable[..., int] = getattr(importlib.import_module(module), function)
    return found


def make_task(command: Command, root: Path) -> Task[Any]:
    options = command.all_options

    def body(c: object, **values: object) -> None:
        code = entry_point(command)(os.environ, root=root, **{o.keyword: values[o.name] for o in options})
        if code:
            raise Exit(code=code)

    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for o in options:
        default = inspect.Parameter.empty if o.kind == "positional" else o.default
        params.append(inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # invoke reads the signature
    body.__name__ = command.name
    body.__doc__ = command.help
    return Task(
        body,
        name=command.name.replace("_", "-"),
        help={o.flag.removeprefix("--"): o.help for o in options},
        iterable=[o.name for o in options if o.kind == "list"],
        positional=[o.name for o in options if o.kind == "positional"],
        auto_shortflags=False,
    )


def collection(root: Path) -> Collection:
    """Every command of the option table as an invoke task."""
    tasks = Collection()
    for command in COMMANDS:
        tasks.add_task(make_task(command, root))
    return tasks
