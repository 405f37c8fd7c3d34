"""``nox -s build-<backend>`` and ``invoke build``: one action, run on the one path
(:mod:`skippy.cli.run`) from either; its outcome ends with the block of proofs,
binaries and run line (:func:`skippy.flows.build_session.session_ending`)."""

from __future__ import annotations

from typing import Any

from skippy.cli.command import Report
from skippy.cli.options import BuildOptions
from skippy.compile.request import build_request
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import (
    SessionFn,
    SessionOutcome,
    SessionRequest,
    run_build_session,
    session_ending,
)
from skippy.spot.models import check_model_args
from skippy.spot.report import SpotCheckReport


def session_request(options: BuildOptions, settings: Settings) -> SessionRequest:
    """What the session is asked to do, from the command's typed options (field by field): the
    build's request (the backend, the -D values over what ``settings`` ask for, the jobs), made
    here once, and the session's own flags."""
    return SessionRequest(
        build=build_request(options.backend, settings, defines=options.define, jobs=options.jobs),
        skip_unavailable=options.skip_unavailable,
        spot_check=not options.no_spot_check,
        workdir_as_is=options.workdir_as_is,
        upstream_tests=options.upstream_tests,
        models=options.model,
        recheck=options.recheck,
    )


def outcome_report(outcome: SessionOutcome) -> dict[str, Any]:
    """The ``--json`` report of a build session that ran."""
    build = outcome.build and outcome.build.as_dict()
    spot = outcome.spot.as_dict() if isinstance(outcome.spot, SpotCheckReport) else None
    upstream = outcome.upstream.as_dict() if outcome.upstream is not None else None
    report: dict[str, Any] = {
        "skipped": outcome.skipped,
        "build": build,
        "spot_check": spot,
        "upstream_tests": upstream,
        # the model families the change touches, why, and the baseline it was measured from
        "follow": outcome.following.as_dict() if outcome.following is not None else None,
    }
    if outcome.local is not None:
        # a local, unregistered tree: said at the top of the report, not only in the binary
        report["mode"] = "local"
        report["local_tree"] = outcome.local.as_dict()
    elif outcome.build is not None:
        report["mode"] = outcome.build.mode
    return report


def build(
    options: BuildOptions, settings: Settings, console: Console, *, session_fn: SessionFn | None = None
) -> Report:
    """Run the build session (``session_fn`` replaces :func:`run_build_session` in tests); the
    spot check's --model values are checked first, not after the build."""
    check_model_args(options.model, cwd=settings.root, rerun=f"nox -s build-{options.backend}")
    session = session_fn or run_build_session
    outcome = session(session_request(options, settings), settings, console)
    report = outcome_report(outcome)
    if outcome.skipped:
        # the nox session must then call session.skip, so that it shows as skipped, never as passed
        return Report(report, skipped=f"{outcome.skipped} (unavailable backends skipped on request)")
    return Report(report, ending=session_ending(outcome, settings))
