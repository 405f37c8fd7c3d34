"""The actions of the queue-maintenance commands (regenerate, generate, parity, check).

Like :mod:`skippy.cli.app`: each takes its command's typed options, the settings
and the console, makes one library call and returns its report; parsing, errors
and output are :mod:`skippy.cli.run`'s, once.
"""

from __future__ import annotations

from pathlib import Path

from skippy.cli.command import Report
from skippy.cli.options import AuditOptions, GenerateOptions, RegenerateOptions
from skippy.core.settings import Settings
from skippy.core.ui import Console, say


def _path(value: str) -> Path | None:
    return Path(value).expanduser().resolve() if value else None


def regenerate(options: RegenerateOptions, settings: Settings, console: Console) -> Report:
    from skippy.maintain.regenerate import regenerate as run_regenerate

    report = run_regenerate(
        settings,
        core_head=options.core_head or None,
        model_support_head=options.model_support_head or None,
        checkout=_path(options.checkout),
        console=console,
        offline=options.offline,
    )
    return Report(report.as_dict(), text=report.render())


def generate(options: GenerateOptions, settings: Settings, console: Console) -> Report:
    from skippy.maintain.generate import lane_dir, run_generate

    lane, drift = run_generate(
        settings, console=console, check=options.check, checkout=_path(options.checkout), offline=options.offline
    )
    names = [n for n in lane.files if n.endswith(".patch")]
    if options.check:
        text = drift.render()
    else:
        text = f"generated lane: {len(names)} family patch(es) written to {settings.relative(lane_dir(settings))}" + (
            "" if drift.ok else f" (was: {drift.render()})"
        )
    return Report({"check": options.check, "patches": names, "drift": drift.as_dict()}, text=text)


def parity(options: AuditOptions, settings: Settings, console: Console) -> Report:
    from skippy.maintain import parity as audit

    report = audit.run_parity(settings, console=console, checkout=_path(options.checkout), offline=options.offline)
    if not report.ok:
        if not options.json:  # the audit, then the error that ends the run
            say(report.render())
        raise audit.failure(report, settings)
    return Report(report.as_dict(), text=report.render())


def check(options: AuditOptions, settings: Settings, console: Console) -> Report:
    from skippy.maintain import review as audit

    report = audit.run_check(settings, console=console, checkout=_path(options.checkout), offline=options.offline)
    console.summary(report.markdown())
    if not report.ok:
        if not options.json:
            say(report.render())
        raise audit.failure(report)
    return Report(report.as_dict(), text=report.render())
