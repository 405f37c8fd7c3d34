"""What a command is: its options' type, its action and what the action hands back.

A :class:`Command` holds its action as a callable, so a reader follows a task to the
function that runs it; :mod:`skippy.cli.commands` lists them, and :mod:`skippy.cli.run`
runs one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from skippy.cli.options import Common, Option, options_of
from skippy.core.settings import Settings
from skippy.core.ui import Console

if TYPE_CHECKING:  # the build sessions' ending: imported where a failure carries one (a prepare never loads it)
    from skippy.spot.report import Ending

#: the nox build sessions' name pattern: one session per backend, the backend taken from its name
BUILD_SESSION: Final = "build-<backend>"
#: what a Ctrl-C leaves behind, unless the command says more
INTERRUPTED: Final = "what was started is recognized and recovered by the next run"


@dataclass(frozen=True)
class Report:
    """What a command's action hands back: its JSON report, and what a human is shown."""

    data: Mapping[str, Any]
    #: the human report (stdout; not printed with --json)
    text: str = ""
    #: the closing block of proofs, binaries and run line (stderr, with and without --json)
    ending: Ending | None = None
    #: set when the command was skipped on request (a nox session shows it as skipped)
    skipped: str | None = None
    #: what to run next, shown last as ``next: ...`` (as an error's is); else the data's ``next``
    next_step: str | None = None


#: a command's action: its typed options, the settings and the console -> its report
Action = Callable[[Any, Settings, Console], Report]


@dataclass(frozen=True)
class Command:
    """One command: an invoke task (and its nox session, where there is one) and the action it runs."""

    name: str
    help: str
    #: what runs it: ``action(options, settings, console)`` (see :mod:`skippy.cli.run`)
    action: Action
    options_type: type[Common]
    #: the nox session (``build-<backend>``: one per backend, the backend taken from its name)
    nox: str | None = None
    #: what a Ctrl-C leaves behind, for its report
    interrupted: str = INTERRUPTED

    @property
    def task(self) -> str:
        return self.name.replace("_", "-")

    @property
    def all_options(self) -> tuple[Option, ...]:
        return options_of(self.options_type)

    @property
    def nox_options(self) -> tuple[Option, ...]:
        """The nox session's options: a build session's backend is its name, not an option."""
        return tuple(o for o in self.all_options if not (self.nox == BUILD_SESSION and o.name == "backend"))

    def option(self, name: str) -> Option:
        for option in self.all_options:
            if option.name == name:
                return option
        raise KeyError(name)
