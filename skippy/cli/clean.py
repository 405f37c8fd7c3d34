"""``invoke clean``: the action (the work is :mod:`skippy.flows.clean`)."""

from __future__ import annotations

from skippy.cli.command import Report
from skippy.cli.options import CleanOptions
from skippy.core.settings import Settings
from skippy.core.ui import Console


def clean(options: CleanOptions, settings: Settings, console: Console) -> Report:
    from skippy.flows.clean import clean as clean_build_dirs
    from skippy.flows.clean import render_plan

    plan = clean_build_dirs(settings, console, dry_run=options.dry_run)
    text = render_plan(plan, settings, dry_run=options.dry_run)
    return Report({"dry_run": options.dry_run, **plan.as_dict()}, text=text)
