"""The commands' entry points from Python and nox: by name, each on :mod:`skippy.cli.run`'s path.

``nox -s NAME -- ARGV`` (:func:`nox_main`), and each command called with its options as keywords
(``prepare_main(env, root=..., latest=True, json=True)``), as tests and scripts do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from skippy.cli.command import Action
from skippy.cli.commands import command
from skippy.cli.options import JSON_FLAG, BuildOptions, make
from skippy.cli.run import Ran, failed, nox_prog, nox_values, run
from skippy.core.errors import SettingsError
from skippy.core.ui import Console

if TYPE_CHECKING:  # the build session's code loads when a build runs
    from skippy.flows.build_session import SessionFn


def nox_main(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    root: Path | None,
    backend: str | None = None,
    action: Action | None = None,
) -> Ran:
    """``nox -s NAME -- ARGV`` (``build-<backend>``: ``name`` "build" and its ``backend``)."""
    c = command(name)
    try:
        values = nox_values(c, argv, backend)
    except SettingsError as exc:
        # the arguments could not be parsed, so neither could --json: its token decides
        return failed(exc, Console(env=env), as_json=JSON_FLAG in argv)
    return run(c, values, env, root=root, prog=nox_prog(c, backend).removesuffix(" --"), action=action)


class Entry(Protocol):
    def __call__(self, env: Mapping[str, str], *, root: Path | None = None, **values: object) -> int: ...


def entry(name: str) -> Entry:
    """The command ``name`` called from Python (tests, scripts) with its options as keywords
    (``prepare_main(env, root=..., latest=True, json=True)``): invoke's path, the exit code."""
    c = command(name)

    def main(env: Mapping[str, str], *, root: Path | None = None, **values: object) -> int:
        return run(c, values, env, root=root, prog=f"invoke {c.task}").code

    main.__name__ = main.__qualname__ = f"{name}_main"
    return main


prepare_main = entry("prepare")
triage_main = entry("triage")
status_main = entry("status")
pin_bump_main = entry("pin_bump")
summary_main = entry("summary")
bisect_main = entry("bisect")
build_task_main = entry("build")
spot_check_main = entry("spot_check")
regenerate_main = entry("regenerate")
generate_main = entry("generate")
parity_main = entry("parity")
check_main = entry("check")
clean_main = entry("clean")


def build_main(
    backend: str,
    env: Mapping[str, str],
    *,
    root: Path,
    args: Sequence[str] = (),
    session_fn: SessionFn | None = None,
) -> tuple[int, str | None]:
    """``nox -s build-<backend> -- ARGS``: (exit code, skip reason)."""
    from skippy.cli.build import build

    ran = nox_main("build", args, env, root=root, backend=backend, action=partial(build, session_fn=session_fn))
    return ran.code, ran.skipped


def session_options(argv: Sequence[str], env: Mapping[str, str], backend: str = "cpu") -> BuildOptions:
    """The typed options of ``nox -s build-<backend> -- ARGV`` (workflow checks, tests)."""
    return make(BuildOptions, nox_values(command("build"), argv, backend), env)


def spot_main(argv: Sequence[str], *, env: Mapping[str, str], root: Path | None = None) -> int:
    """``nox -s spot-check -- ARGV``: the exit code."""
    return nox_main("spot_check", argv, env, root=root).code
