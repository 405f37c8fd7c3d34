"""``invoke clean``: the entry point (the work is :mod:`skippy.flows.clean`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skippy.cli.app import guarded, load
from skippy.core.ui import Console, say


def clean_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    dry_run: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.flows.clean import clean, render_plan

        settings = load(root, env, console)
        plan = clean(settings, console, dry_run=dry_run)
        if not as_json:
            say(render_plan(plan, settings, dry_run=dry_run))
        return {"dry_run": dry_run, **plan.as_dict()}

    return guarded(action, console=console, as_json=as_json)
