"""Glue for the queue-maintenance tasks (regenerate, generate, parity, check).

Like :mod:`skippy.cli.app`: each function loads the settings, makes one library
call, prints the human report (stdout) or one JSON report (``--json``), and
maps errors to exit codes through :func:`skippy.cli.app.guarded`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from skippy.cli.app import guarded, load
from skippy.core.settings import Settings
from skippy.core.ui import Console, say


def _path(value: str) -> Path | None:
    return Path(value).expanduser().resolve() if value else None


def regenerate_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    core_head: str = "",
    model_support_head: str = "",
    checkout: str = "",
    offline: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.core.errors import SettingsError
        from skippy.maintain.regenerate import regenerate

        if bool(core_head) != bool(model_support_head):
            flags = ("--core-head", "--model-support-head")
            given, missing = flags if core_head else flags[::-1]
            raise SettingsError(
                f"regenerate got {given} without {missing}: name both branches, or neither",
                untouched="everything: the queue was not changed",
                next_step="`invoke regenerate` (the lanes from the prepared workdir's history), or "
                "`invoke regenerate --core-head BRANCH --model-support-head BRANCH`",
            )
        settings = load(root, env, console)
        report = regenerate(
            settings,
            core_head=core_head or None,
            model_support_head=model_support_head or None,
            checkout=_path(checkout),
            console=console,
            offline=offline,
        )
        if not as_json:
            say(report.render())
        return report.as_dict()

    return guarded(action, console=console, as_json=as_json)


def generate_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    check: bool = False,
    checkout: str = "",
    offline: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.maintain.generate import lane_dir, run_generate

        settings = load(root, env, console)
        lane, drift = run_generate(settings, console=console, check=check, checkout=_path(checkout), offline=offline)
        names = [n for n in lane.files if n.endswith(".patch")]
        if not as_json:
            if check:
                say(drift.render())
            else:
                say(
                    f"generated lane: {len(names)} family patch(es) written to "
                    f"{settings.relative(lane_dir(settings))}" + ("" if drift.ok else f" (was: {drift.render()})")
                )
        return {"check": check, "patches": names, "drift": drift.as_dict()}

    return guarded(action, console=console, as_json=as_json)


#: one read-only audit: (settings, console, checkout, offline, as_json) -> the JSON report
Audit = Callable[[Settings, Console, Path | None, bool, bool], dict[str, Any]]


def _audit_main(
    env: Mapping[str, str],
    audit: Audit,
    *,
    root: Path | None,
    checkout: str,
    offline: bool,
    as_json: bool,
    verbose: bool,
) -> int:
    console = Console(env=env, verbose=verbose)
    return guarded(
        lambda: audit(load(root, env, console), console, _path(checkout), offline, as_json),
        console=console,
        as_json=as_json,
    )


def _parity(
    settings: Settings, console: Console, checkout: Path | None, offline: bool, as_json: bool
) -> dict[str, Any]:
    from skippy.maintain import parity

    report = parity.run_parity(settings, console=console, checkout=checkout, offline=offline)
    if not as_json:
        say(report.render())
    if not report.ok:
        raise parity.failure(report, settings)
    return report.as_dict()


def _check(settings: Settings, console: Console, checkout: Path | None, offline: bool, as_json: bool) -> dict[str, Any]:
    from skippy.maintain import check

    report = check.run_check(settings, console=console, checkout=checkout, offline=offline)
    if not as_json:
        say(report.render())
    console.summary(report.markdown())
    if not report.ok:
        raise check.failure(report)
    return report.as_dict()


def parity_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    checkout: str = "",
    offline: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    return _audit_main(env, _parity, root=root, checkout=checkout, offline=offline, as_json=as_json, verbose=verbose)


def check_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    checkout: str = "",
    offline: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    return _audit_main(env, _check, root=root, checkout=checkout, offline=offline, as_json=as_json, verbose=verbose)
