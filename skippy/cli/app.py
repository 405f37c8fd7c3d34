"""The actions of the queue commands (prepare, triage, status, pin-bump, summary, bisect).

Each takes its command's typed options, the settings and the console, makes one
library call and returns its report; :mod:`skippy.cli.run` parses, loads, catches
and reports for every command, once.  ``prepare_main`` and the other ``*_main``
are the same commands called from Python (tests, scripts) with the options as
keywords: the path invoke takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skippy.cli.command import Report
from skippy.cli.options import (
    BisectOptions,
    PinBumpOptions,
    PrepareOptions,
    StatusOptions,
    SummaryOptions,
    TriageOptions,
)
from skippy.core.settings import Settings
from skippy.core.ui import Console

if TYPE_CHECKING:
    from skippy.maintain.summary import Summary


def prepare(options: PrepareOptions, settings: Settings, console: Console) -> Report:
    from skippy.queue.prepare import Target
    from skippy.queue.prepare import prepare as run_prepare
    from skippy.queue.session import resume_session

    if options.triage:
        return _triage(options, settings, console)
    sha = options.sha
    target = Target.latest() if options.latest else Target.at(sha) if sha else Target.pinned()
    resume = options.resume
    if resume:
        report = resume_session(settings, resume, console=console)
    else:
        report = run_prepare(
            settings,
            target,
            console=console,
            force=options.force,
            offline=options.offline,
            interactive=False if options.no_interactive else None,
        )
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
    return Report(report.as_dict())


def _triage(options: PrepareOptions | TriageOptions, settings: Settings, console: Console) -> Report:
    from skippy.core.errors import ConflictError
    from skippy.core.ui import say
    from skippy.queue.prepare import Target, triage_target

    latest, sha = options.latest, options.sha
    target = Target.latest() if latest else Target.at(sha) if sha else Target.pinned()
    result = triage_target(settings, target, console=console, offline=options.offline)
    if not result.ok:
        if not options.json:  # the table, then the error that ends the run
            say(result.render())
        raise ConflictError(
            f"{sum(1 for v in result.verdicts if not v.ok)} patch(es) do not apply to {result.target[:12]}",
            untouched="the workdir's checkout: triage ran in a temporary worktree",
            next_step="refresh the patches marked conflict/preimage-missing, drop the already-applied ones",
            triage=result,
        )
    return Report(result.as_dict(), text=result.render())


def triage(options: TriageOptions, settings: Settings, console: Console) -> Report:
    """``invoke triage``: ``invoke prepare --triage`` under its own name."""
    return _triage(options, settings, console)


def pin_bump(options: PinBumpOptions, settings: Settings, console: Console) -> Report:
    from skippy.flows.pinbump.bump import pin_bump as run_pin_bump

    report = run_pin_bump(
        settings,
        sha=options.sha or None,
        console=console,
        backends=options.backend,
        dry_run=options.dry_run,
        allow_non_descendant=options.allow_non_descendant,
        newest_compatible=options.newest_compatible,
        offline=options.offline,
        upstream_tests=not options.no_upstream_tests,
        drop=options.drop,
        keep=options.keep,
    )
    texts = []
    if report.unverified:  # heads the pull request's body: no upstream history vouches for the new pin
        texts.append(report.provenance_markdown())
        console.summary(report.provenance_markdown())
    if report.summary is not None:
        texts.append(report.summary.markdown())
        _annotate_churn(report.summary, settings, console)
    if report.numerics:
        texts.append("\n" + report.numerics_markdown())
        console.summary(report.numerics_markdown())
    verb = "would move" if report.dry_run else "moved" if report.written else "left"
    console.info(f"pin {verb}: {report.old_pin[:12]} -> {report.new_pin[:12]}")
    return Report(report.as_dict(), text="\n".join(texts))


def summary(options: SummaryOptions, settings: Settings, console: Console) -> Report:
    from skippy.flows.pinbump.sides import run_summary

    found = run_summary(settings, options.old, options.new, console=console)
    console.summary(found.markdown())
    _annotate_churn(found, settings, console)
    return Report(found.as_dict(), text=found.markdown())


def _annotate_churn(found: Summary, settings: Settings, console: Console) -> None:
    """The most exposed patches, on their hunks, in GitHub Actions' view of the run."""
    for annotation in found.churn.annotations(settings.relative) if found.churn else ():
        console.annotate(annotation)


def bisect(options: BisectOptions, settings: Settings, console: Console) -> Report:
    from skippy.flows.pinbump.bisect import run_bisect
    from skippy.queue.model import load_queue

    report = run_bisect(settings, to=options.to or None, console=console)
    for annotation in report.annotations(load_queue(settings.patch_dir).patches, settings.relative):
        console.annotate(annotation)
    return Report(report.as_dict(), text=report.render())


def build_mode_text(build: Mapping[str, Any], settings: Settings) -> str:
    """How ``invoke status`` names the mode of a backend's newest build (and says when it has
    no binaries yet: configured, or its build failed)."""
    sha = str(build.get("patched_sha"))[:12]
    unbuilt = "" if build.get("binaries") else "; configured only, no binaries yet"
    if build.get("mode") == "local":
        source = settings.relative(Path(str(build.get("source_dir") or settings.workdir)))
        return f"local: {source} as it stood at HEAD {sha} (--workdir-as-is), queue digest local{unbuilt}"
    return f"of the prepared tree, patched {sha}{unbuilt}"


def status(options: StatusOptions, settings: Settings, console: Console) -> Report:
    from skippy.compile.builder import newest_builds
    from skippy.queue.status import build_moved_on, compute_status

    found = compute_status(settings)
    builds = newest_builds(settings.build_root, settings.workdir)
    lines = [found.render()]
    for backend, build in builds.items():
        where = settings.relative(Path(build["build_dir"]))
        moved = build_moved_on(backend, build, found)
        build["moved_on"] = moved
        lines.append(f"build {backend}: {where} ({build_mode_text(build, settings)})" + (f"; {moved}" if moved else ""))
        lines += [f"  {name}: {settings.relative(Path(path))}" for name, path in build["binaries"].items()]
    return Report({**found.as_dict(), "builds": builds}, text="\n".join(lines))
