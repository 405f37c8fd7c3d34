"""The commands: every invoke task (and nox session) with the action it runs.

Each action is held as a function of this module that imports the real one when it runs,
so ``invoke --list`` and ``tasks.py`` load no command's code, and a reader's "go to
definition" goes from a task to this function, and from its import to the action.
"""

from __future__ import annotations

from typing import Final

from skippy.cli.command import BUILD_SESSION, Command, Report
from skippy.cli.options import (
    AuditOptions,
    BisectOptions,
    BuildOptions,
    CleanOptions,
    GenerateOptions,
    PinBumpOptions,
    PrepareOptions,
    RegenerateOptions,
    SpotCheckOptions,
    StatusOptions,
    SummaryOptions,
    TriageOptions,
    render_table,
)
from skippy.core.settings import Settings
from skippy.core.ui import Console

# --- the actions, each imported when it runs ---------------------------------------


def _prepare(options: PrepareOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.app import prepare

    return prepare(options, settings, console)


def _triage(options: TriageOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.app import triage

    return triage(options, settings, console)


def _build(options: BuildOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.build import build

    return build(options, settings, console)


def _spot_check(options: SpotCheckOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.spot import spot_check

    return spot_check(options, settings, console)


def _status(options: StatusOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.app import status

    return status(options, settings, console)


def _pin_bump(options: PinBumpOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.app import pin_bump

    return pin_bump(options, settings, console)


def _summary(options: SummaryOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.app import summary

    return summary(options, settings, console)


def _bisect(options: BisectOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.app import bisect

    return bisect(options, settings, console)


def _regenerate(options: RegenerateOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.maintain import regenerate

    return regenerate(options, settings, console)


def _generate(options: GenerateOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.maintain import generate

    return generate(options, settings, console)


def _parity(options: AuditOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.maintain import parity

    return parity(options, settings, console)


def _check(options: AuditOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.maintain import check

    return check(options, settings, console)


def _clean(options: CleanOptions, settings: Settings, console: Console) -> Report:
    from skippy.cli.clean import clean

    return clean(options, settings, console)


_AUDIT_INTERRUPTED: Final = "the workdir and the queue: the audit reads temporary worktrees only"

#: the commands, in the order ``invoke --list`` shows them
COMMANDS: Final[tuple[Command, ...]] = (
    Command(
        "prepare",
        "Check out upstream llama.cpp and apply the patch queue (git am --3way, three lanes).",
        _prepare,
        PrepareOptions,
    ),
    Command(
        "triage",
        "Try every patch of every lane against a target and classify each (clean/3way/conflict/...).",
        _triage,
        TriageOptions,
        interrupted="the workdir's checkout: triage runs in a temporary worktree",
    ),
    Command(
        "build",
        "Build and spot-check one backend: what `nox -s build-<backend>` runs, with the same options.",
        _build,
        BuildOptions,
        nox=BUILD_SESSION,
        interrupted="the source tree; the build dir is kept (the next run reconfigures or resumes it)",
    ),
    Command(
        "spot_check",
        "A real llama-server on a real model: chat, fingerprint against the CPU reference, the RPC path.",
        _spot_check,
        SpotCheckOptions,
        nox="spot-check",
        interrupted="the build and the model cache; the servers were stopped",
    ),
    Command(
        "status",
        "Pin, upstream and patched SHAs, queue digest, local work, and what prepare would do.",
        _status,
        StatusOptions,
        interrupted="everything: status only reads",
    ),
    Command(
        "pin_bump",
        "Prepare, build, spot-check and audit a new upstream, then move the pin (atomically) and summarize.",
        _pin_bump,
        PinBumpOptions,
    ),
    Command(
        "summary",
        "Pull-request Markdown of upstream OLD..NEW: commits, diffstat, areas, the functions each patch changes that "
        "upstream changed too.",
        _summary,
        SummaryOptions,
        interrupted="everything: summary only reads",
    ),
    Command(
        "bisect",
        "Newest upstream commit the whole queue applies to, and the commit that first breaks each failing patch.",
        _bisect,
        BisectOptions,
        interrupted=_AUDIT_INTERRUPTED,
    ),
    Command(
        "regenerate",
        "Write the core and model_support lanes back from the prepared workdir's commits (their Skippy-Patch "
        "trailers say which lane), or from two branches (verified; backup restored on failure).",
        _regenerate,
        RegenerateOptions,
    ),
    Command(
        "generate",
        "Rewrite the generated lane from generated/families.toml and the pinned tree (or --check it).",
        _generate,
        GenerateOptions,
    ),
    Command(
        "parity",
        "Audit the arch cases the queue drops (allowlist beside the queue) and list its upstream deletions.",
        _parity,
        AuditOptions,
        interrupted=_AUDIT_INTERRUPTED,
    ),
    Command(
        "check",
        "Everything a reviewer needs: validate, apply all lanes, parity, generated-lane drift, boundary lint.",
        _check,
        AuditOptions,
        interrupted=_AUDIT_INTERRUPTED,
    ),
    Command(
        "clean",
        "Remove old build dirs (keeping each backend's newest build of the prepared tree) and source archives "
        "no longer configured; never the workdir, the queue or the backups.",
        _clean,
        CleanOptions,
    ),
)


def command(name: str) -> Command:
    for c in COMMANDS:
        if name in (c.name, c.task):
            return c
    raise KeyError(name)


#: the options block (docs/options.md) between these markers is made by :func:`readme_block`
#: (through ``python -m tooling.docs``, which rewrites every generated block)
README_BEGIN: Final = "<!-- options: made from skippy/cli/commands.py by `python -m tooling.docs` -->"
README_END: Final = "<!-- options: end -->"


def readme_block() -> str:
    """The README's option reference: one table per command, in the table's order."""
    parts = [README_BEGIN]
    for c in COMMANDS:
        where = f"`invoke {c.task}`"
        if c.nox == BUILD_SESSION:
            where += " and `nox -s build-<backend> --` (the backend is the session's name)"
        elif c.nox:
            where += f" and `nox -s {c.nox} --`"
        parts += ["", f"{where}: {c.help}", "", render_table(c.all_options)]
    parts += ["", README_END]
    return "\n".join(parts)
