"""``nox -s build-<backend>`` and ``invoke build``: parse the session's options (from the
option table), run a build session and render its outcome, once."""

from __future__ import annotations

import argparse
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from skippy.build.plan import DEFINE_ARG
from skippy.check.report import SpotCheckReport
from skippy.cli.options import BUILD_SESSION, COMMON, Option
from skippy.core.errors import InternalError, Interrupted, SkippyError
from skippy.core.settings import Settings, find_root
from skippy.core.ui import Console, OptionParser, print_json
from skippy.flows.build_session import (
    SessionArgs,
    SessionFn,
    SessionOutcome,
    run_build_session,
    skip_unavailable_from,
)
from skippy.queue.leftovers import sweep


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a positive number of jobs, got {text!r} (e.g. -j2)")
    return value


def _define(text: str) -> str:
    arg = "-D" + text
    if not DEFINE_ARG.match(arg):
        raise argparse.ArgumentTypeError(f"wants NAME=VALUE or NAME:TYPE=VALUE, got {text!r}")
    return arg


#: how a value of these options is checked and normalized (the others are flags)
_CONVERT: dict[str, Callable[[str], Any]] = {"jobs": _jobs, "define": _define}


def _names(option: Option) -> list[str]:
    if option.kind == "list" and option.short:
        # -D stays CMake's own spelling, and the only one: -DNAME=VALUE or -D NAME=VALUE
        return [option.short]
    return [option.short, option.flag] if option.short else [option.flag]


def _add(parser: OptionParser, option: Option) -> None:
    names = _names(option)
    convert = _CONVERT.get(option.name, str)
    if option.kind == "flag":
        parser.add_argument(*names, dest=option.name, action="store_true", help=option.help)
    elif option.kind == "list":
        parser.add_argument(
            *names, dest=option.name, action="append", default=[], type=convert, metavar=option.metavar,
            help=option.help,
        )  # fmt: skip
    else:
        parser.add_argument(*names, dest=option.name, type=convert, metavar=option.metavar, help=option.help)


def session_parser(backend: str = "<backend>", prog: str | None = None) -> OptionParser:
    """The options of ``nox -s build-<backend> -- ...`` (the option table's BUILD_SESSION,
    --json and --verbose); anything else is an error.  ``prog`` names the command in
    errors (``invoke build`` for the task)."""
    parser = OptionParser(prog or f"nox -s build-{backend} --")
    for option in (*BUILD_SESSION, *COMMON):
        _add(parser, option)
    return parser


def parse_session_args(
    posargs: Sequence[str], env: Mapping[str, str], backend: str = "<backend>", *, prog: str | None = None
) -> SessionArgs:
    """``nox -s build-cuda -- --skip-unavailable -j2 -DCMAKE_CUDA_ARCHITECTURES=86``.

    Only ``-D`` values reach CMake; any other argument that is not an option of the
    session raises SettingsError (before anything is probed, prepared or built).
    """
    ns = session_parser(backend, prog).parse(posargs)
    return SessionArgs(
        skip_unavailable=skip_unavailable_from(env) or ns.skip_unavailable,
        spot_check=not ns.no_spot_check,
        jobs=ns.jobs,
        cmake_args=tuple(ns.define),
        as_json=ns.json,
        verbose=ns.verbose,
        workdir_as_is=ns.workdir_as_is,
        upstream_tests=ns.upstream_tests,
    )


def outcome_report(outcome: SessionOutcome) -> dict[str, Any]:
    """The ``--json`` report of a build session that ran."""
    build = outcome.build and outcome.build.as_dict()
    spot = outcome.spot.as_dict() if isinstance(outcome.spot, SpotCheckReport) else None
    upstream = outcome.upstream.as_dict() if outcome.upstream is not None else None
    report: dict[str, Any] = {
        "ok": True,
        "skipped": outcome.skipped,
        "build": build,
        "spot_check": spot,
        "upstream_tests": upstream,
    }
    if outcome.local is not None:
        # a local, unregistered tree: said at the top of the report, not only in the binary
        report["mode"] = "local"
        report["local_tree"] = outcome.local.as_dict()
    elif outcome.build is not None:
        report["mode"] = outcome.build.mode
    return report


def build_main(
    backend: str,
    env: Mapping[str, str],
    *,
    root: Path,
    args: Sequence[str] = (),
    session_fn: SessionFn | None = None,
    prog: str | None = None,
) -> tuple[int, str | None]:
    """``nox -s build-<backend>``: (exit code, skip reason). Errors are rendered here, once.

    A skip reason is returned only when the user asked to skip unavailable
    backends; the session must then call ``session.skip`` so it shows as
    skipped, never as passed.  With ``--json`` every outcome prints one JSON
    report on stdout: success, skip, a SkippyError, Ctrl-C, and an exception
    skippy did not foresee (its traceback goes to stderr).  ``session_fn``
    replaces :func:`run_build_session` (tests).
    """
    session = session_fn or run_build_session
    # known before parsing, so that even a bad option gets its JSON report
    as_json = "--json" in args
    console = Console(env=env, verbose="--verbose" in args)

    def failed(exc: SkippyError) -> tuple[int, None]:
        if as_json:
            print_json({"ok": False, **exc.as_dict()})
        console.error(exc.render())
        return exc.exit_code, None

    try:
        parsed = parse_session_args(args, env, backend, prog=prog)
        settings = Settings.load(root, env)
        sweep(settings, console)
        outcome = session(backend, settings, console, parsed)
    except SkippyError as exc:
        return failed(exc)
    except KeyboardInterrupt:
        return failed(
            Interrupted(
                "interrupted",
                untouched="the source tree; the build dir is kept (the next run reconfigures or resumes it)",
                next_step=f"rerun nox -s build-{backend}",
            )
        )
    except Exception as exc:
        # a bug, not a failure we foresaw: still one JSON report, and the traceback for the bug report
        console.error(traceback.format_exc().rstrip())
        return failed(InternalError(exc))
    if as_json:
        print_json(outcome_report(outcome))
    if outcome.skipped:
        return 0, f"{outcome.skipped} (unavailable backends skipped on request)"
    return 0, None


def build_task_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    backend: str = "",
    define: Sequence[str] = (),
    jobs: str | int | None = None,
    skip_unavailable: bool = False,
    no_spot_check: bool = False,
    workdir_as_is: bool = False,
    upstream_tests: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    """``invoke build``: the same session as ``nox -s build-<backend>``, its options spelled
    as the nox session's arguments and parsed the same way."""
    values = {
        "skip_unavailable": skip_unavailable,
        "no_spot_check": no_spot_check,
        "workdir_as_is": workdir_as_is,
        "upstream_tests": upstream_tests,
        "json": as_json,
        "verbose": verbose,
    }
    argv = [f"-D{d}" for d in define]
    argv += ["--jobs", str(jobs)] if jobs not in (None, "") else []
    argv += [o.flag for o in (*BUILD_SESSION, *COMMON) if o.kind == "flag" and values.get(o.name)]
    code, skipped = build_main(
        backend or "cpu", env, root=root or find_root(Path.cwd()), args=argv, prog="invoke build"
    )
    if skipped:
        Console(env=env).info(f"skipped: {skipped}")
    return code
