"""``nox -s build-<backend>``: run a build session and render its outcome, once."""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from skippy.check.report import SpotCheckReport
from skippy.core.errors import InternalError, Interrupted, SkippyError
from skippy.core.settings import Settings
from skippy.core.ui import Console, print_json
from skippy.flows.build_session import SessionFn, parse_session_args, run_build_session


def build_main(
    backend: str,
    env: Mapping[str, str],
    *,
    root: Path,
    args: Sequence[str] = (),
    session_fn: SessionFn | None = None,
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
        parse_session_args(args, env, backend)
        settings = Settings.load(root, env)
        outcome = session(backend, settings, console, args)
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
        spot = outcome.spot.as_dict() if isinstance(outcome.spot, SpotCheckReport) else None
        build = outcome.build and outcome.build.as_dict()
        print_json({"ok": True, "skipped": outcome.skipped, "build": build, "spot_check": spot})
    if outcome.skipped:
        return 0, f"{outcome.skipped} (unavailable backends skipped on request)"
    return 0, None
