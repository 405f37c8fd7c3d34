"""Glue between the entry points (tasks.py, noxfile.py, scripts/) and the library.

Errors are caught once, here: rendered for humans (stderr) or as JSON
(stdout, with ``--json``), and turned into the error's exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from skippy.core.errors import SettingsError, SkippyError
from skippy.core.settings import Settings, find_root
from skippy.core.ui import Console, print_json, say


def load(root: Path | None, env: Mapping[str, str], console: Console | None = None) -> Settings:
    """The settings; with ``console``, first what killed runs left is told and swept."""
    settings = Settings.load(root if root is not None else find_root(Path.cwd()), env)
    if console is not None:
        from skippy.queue.leftovers import sweep

        sweep(settings, console)
    return settings


def guarded(
    action: Callable[[], dict[str, Any]],
    *,
    console: Console,
    as_json: bool,
) -> int:
    """Run ``action``; print its report as JSON when asked; map SkippyError to its exit code."""
    try:
        report = action()
    except SkippyError as exc:
        if as_json:
            print_json({"ok": False, **exc.as_dict()})
        console.error(exc.render())
        return exc.exit_code
    except KeyboardInterrupt:
        console.error("interrupted: the next run recognizes and recovers what this one left")
        return 130
    if as_json:
        print_json({"ok": True, **report})
    return 0


def prepare_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    pinned: bool = False,
    latest: bool = False,
    sha: str = "",
    force: bool = False,
    offline: bool = False,
    as_json: bool = False,
    verbose: bool = False,
    triage: bool = False,
    continue_: bool = False,
    skip: bool = False,
    abort: bool = False,
    no_interactive: bool = False,
) -> int:
    console = Console(env=env, verbose=verbose)
    interactive = False if no_interactive else None

    def action() -> dict[str, Any]:
        from skippy.queue.prepare import Target, prepare, triage_target
        from skippy.queue.session import resume_session

        chosen = [name for name, on in (("--pinned", pinned), ("--latest", latest), ("--sha", bool(sha))) if on]
        if len(chosen) > 1:
            raise SettingsError(
                f"choose one of --pinned, --latest, --sha (got {' and '.join(chosen)})",
                untouched="everything",
                next_step="invoke prepare --pinned",
            )
        target = Target.latest() if latest else Target.at(sha) if sha else Target.pinned()
        settings = load(root, env, console)
        resume = session_action(continue_=continue_, skip=skip, abort=abort)
        if resume:
            if chosen or triage or force:
                raise SettingsError(
                    f"--{resume} drives the stopped session: it takes no target, --triage or --force",
                    untouched="everything",
                    next_step=f"invoke prepare --{resume}",
                )
            report = resume_session(settings, resume, console=console)
        elif triage:
            result = triage_target(settings, target, console=console, offline=offline)
            if not as_json:
                say(result.render())
            if not result.ok:
                from skippy.core.errors import ConflictError

                error = ConflictError(
                    f"{sum(1 for v in result.verdicts if not v.ok)} patch(es) do not apply to {result.target[:12]}",
                    untouched="the workdir's checkout: triage ran in a temporary worktree",
                    next_step="refresh the patches marked conflict/preimage-missing, drop the already-applied ones",
                )
                error.triage = result
                raise error
            return result.as_dict()
        else:
            report = prepare(settings, target, console=console, force=force, offline=offline, interactive=interactive)
        verb = {
            "noop": "up to date",
            "cloned": "cloned and patched",
            "applied": "patched",
            "resumed": "session finished and patched",
            "aborted": "session aborted, back",
        }.get(report.action, report.action)
        extra = f", {report.changed_files} file(s) rewritten" if report.changed_files else ""
        console.info(
            f"{settings.relative(report.workdir)}: {verb} at {report.patched_sha[:12]} "
            f"(upstream {report.upstream_sha[:12]}, queue {report.queue_digest[:12]}{extra}) "
            f"in {report.seconds:.2f} s"
        )
        for note in report.notes:
            if not console.already_said(note):  # a warning or line of the run said it already
                console.info(f"note: {note}")
        return report.as_dict()

    return guarded(action, console=console, as_json=as_json)


def pin_bump_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    sha: str = "",
    backends: Sequence[str] = (),
    dry_run: bool = False,
    allow_non_descendant: bool = False,
    newest_compatible: bool = False,
    offline: bool = False,
    no_upstream_tests: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.flows.pinbump import pin_bump

        settings = load(root, env, console)
        report = pin_bump(
            settings,
            sha=sha or None,
            console=console,
            backends=tuple(backends) or ("cpu",),
            dry_run=dry_run,
            allow_non_descendant=allow_non_descendant,
            newest_compatible=newest_compatible,
            offline=offline,
            upstream_tests=not no_upstream_tests,
        )
        if report.summary is not None and not as_json:
            say(report.summary.markdown())
        if report.numerics and not as_json:
            say("\n" + report.numerics_markdown())
        if report.numerics:
            console.summary(report.numerics_markdown())
        verb = "would move" if report.dry_run else "moved" if report.written else "left"
        console.info(f"pin {verb}: {report.old_pin[:12]} -> {report.new_pin[:12]}")
        return report.as_dict()

    return guarded(action, console=console, as_json=as_json)


def summary_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    old: str,
    new: str,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.flows.pinbump import run_summary

        summary = run_summary(load(root, env, console), old, new, console=console)
        if not as_json:
            say(summary.markdown())
        console.summary(summary.markdown())
        return summary.as_dict()

    return guarded(action, console=console, as_json=as_json)


def bisect_main(
    env: Mapping[str, str], *, root: Path | None = None, to: str = "", as_json: bool = False, verbose: bool = False
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.flows.pinbump import run_bisect

        report = run_bisect(load(root, env, console), to=to or None, console=console)
        if not as_json:
            say(report.render())
        return report.as_dict()

    return guarded(action, console=console, as_json=as_json)


def session_action(*, continue_: bool, skip: bool, abort: bool) -> Literal["continue", "skip", "abort", ""]:
    flags: tuple[tuple[Literal["continue", "skip", "abort"], bool], ...] = (
        ("continue", continue_),
        ("skip", skip),
        ("abort", abort),
    )
    chosen = [name for name, on in flags if on]
    if len(chosen) > 1:
        raise SettingsError(
            f"choose one of --continue, --skip, --abort (got {', '.join('--' + c for c in chosen)})",
            untouched="everything: the stopped session is as it was",
            next_step="invoke prepare --continue (or --skip, or --abort)",
        )
    return chosen[0] if chosen else ""


def triage_main(
    env: Mapping[str, str],
    *,
    root: Path | None = None,
    latest: bool = False,
    sha: str = "",
    offline: bool = False,
    as_json: bool = False,
    verbose: bool = False,
) -> int:
    """``invoke triage``: ``invoke prepare --triage`` under its own name."""
    return prepare_main(
        env, root=root, latest=latest, sha=sha, offline=offline, as_json=as_json, verbose=verbose, triage=True
    )


def build_mode_text(build: Mapping[str, Any], settings: Settings) -> str:
    """How ``invoke status`` names the mode of a backend's newest build (and says when it has
    no binaries yet: configured, or its build failed)."""
    sha = str(build.get("patched_sha"))[:12]
    unbuilt = "" if build.get("binaries") else "; configured only, no binaries yet"
    if build.get("mode") == "local":
        source = settings.relative(Path(str(build.get("source_dir") or settings.workdir)))
        return f"local: {source} as it stood at HEAD {sha} (--workdir-as-is), queue digest local{unbuilt}"
    return f"of the prepared tree, patched {sha}{unbuilt}"


def status_main(
    env: Mapping[str, str], *, root: Path | None = None, as_json: bool = False, verbose: bool = False
) -> int:
    console = Console(env=env, verbose=verbose)

    def action() -> dict[str, Any]:
        from skippy.build.builder import newest_builds
        from skippy.queue.status import compute_status

        settings = load(root, env, console)
        status = compute_status(settings)
        builds = newest_builds(settings.build_root, settings.workdir)
        if not as_json:
            say(status.render())
            for backend, build in builds.items():
                where = settings.relative(Path(build["build_dir"]))
                say(f"build {backend}: {where} ({build_mode_text(build, settings)})")
                for name, path in build["binaries"].items():
                    say(f"  {name}: {settings.relative(Path(path))}")
        return {**status.as_dict(), "builds": builds}

    return guarded(action, console=console, as_json=as_json)
