"""``invoke check``: everything a reviewer needs, in one command, on a clean temporary checkout.

Steps (a failed step skips the ones that need its result):

1. ``queue``: the queue validates (lanes, names, series, mailbox headers);
2. ``apply``: all lanes apply on the pin, in a temporary worktree (the
   maintainer's workdir checkout is never touched); each patch is applied
   once: the later steps reuse these commits (:func:`skippy.maintain.replay.applied_once`);
3. ``parity``: no arch case is dropped without an allowlist entry; the hunks
   that delete upstream lines are listed;
4. ``generated``: the checked-in generated lane is what the generator makes;
5. ``boundaries``: no patch only rewrites lines earlier patches introduced
   (a warning, not a failure).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.errors import CheckFailed, SkippyError, UnsafeGitConfig
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import generate, genfiles, parity, parity_report
from skippy.maintain.replay import Replay, Store, applied_once, pinned_store, replay
from skippy.queue.model import Lane, Queue, load_queue

STATUSES = ("ok", "warning", "failed", "skipped")


@dataclass(frozen=True)
class Step:
    name: str
    status: str
    summary: str
    seconds: float = 0.0
    details: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "seconds": round(self.seconds, 3),
            "details": self.details,
            "data": self.data,
        }


@dataclass(frozen=True)
class CheckReport:
    steps: tuple[Step, ...]
    upstream_sha: str | None
    patched_sha: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.steps)

    @property
    def warnings(self) -> int:
        return sum(1 for s in self.steps if s.status == "warning")

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "upstream_sha": self.upstream_sha,
            "patched_sha": self.patched_sha,
            "seconds": round(self.seconds, 3),
            "steps": [s.as_dict() for s in self.steps],
        }

    def render(self) -> str:
        lines = []
        for s in self.steps:
            lines.append(f"[{s.status:^7}] {s.name:<11} {s.summary} ({s.seconds:.2f} s)")
            if s.details and s.status in ("failed", "warning"):
                lines += ["            " + line for line in s.details.splitlines()]
        verdict = "ok" if self.ok else "FAILED"
        failed = [s.name for s in self.steps if s.status == "failed"]
        tail = f" ({', '.join(failed)})" if failed else ""
        lines.append(f"check: {verdict}{tail}, {self.warnings} warning(s), {self.seconds:.1f} s")
        return "\n".join(lines)

    def markdown(self) -> str:
        rows = "\n".join(f"| {s.name} | {s.status} | {s.summary} |" for s in self.steps)
        return (
            f"### skippy check: {'ok' if self.ok else 'FAILED'}\n\n| step | status | summary |\n|---|---|---|\n{rows}"
        )


def _timed(name: str, action: Callable[[], Step]) -> Step:
    started = time.monotonic()
    try:
        step = action()
    except UnsafeGitConfig:
        raise  # not a step's finding: no step can run in that repository
    except SkippyError as exc:
        step = Step(name, "failed", exc.what, details=exc.render())
    return Step(step.name, step.status, step.summary, time.monotonic() - started, step.details, step.data)


def run_check(
    settings: Settings, *, console: Console, checkout: Path | None = None, offline: bool = False
) -> CheckReport:
    started = time.monotonic()
    holder: dict[str, Any] = {}  # what each step hands to the next: queue, replay, parity
    steps = [_timed("queue", lambda: _queue_step(settings, holder))]
    if "queue" not in holder:
        rest = ("apply", "parity", "generated", "boundaries")
        steps += [Step(name, "skipped", "the queue is invalid") for name in rest]
        return CheckReport(tuple(steps), None, None, time.monotonic() - started)
    upstream_sha: str | None = None
    patched: str | None = None
    try:
        with pinned_store(settings, console=console, checkout=checkout, offline=offline) as store:
            upstream_sha = store.upstream_sha
            patched = _pinned_steps(steps, settings, store, holder, console=console)
    except UnsafeGitConfig:
        raise  # the workdir's config is refused: nothing in it was checked
    except SkippyError as exc:
        # the pin itself could not be resolved: nothing past the queue can be checked
        steps.append(Step("apply", "failed", exc.what, details=exc.render()))
    done = {s.name for s in steps}
    for name in ("apply", "parity", "generated"):
        if name not in done:
            steps.append(Step(name, "skipped", "the pin could not be checked out"))
    steps.append(_boundaries_step(holder.get("parity")))
    return CheckReport(tuple(steps), upstream_sha, patched, time.monotonic() - started)


def _pinned_steps(
    steps: list[Step], settings: Settings, store: Store, holder: dict[str, Any], *, console: Console
) -> str | None:
    """The steps that need the pinned tree (apply, parity, generated), appended to ``steps``; the patched sha."""
    queue: Queue = holder["queue"]
    # one worktree, each patch applied once: the generated step's replay of the lanes reuses apply's
    with applied_once(settings, store.repo, store.base, console=console):
        steps.append(_timed("apply", lambda: _apply_step(settings, store, queue, holder, console=console)))
        patched: str | None = None
        if "replay" in holder:
            steps.append(_timed("parity", lambda: _parity_step(settings, store, holder, console=console)))
            patched = holder["replay"].patched
        else:
            steps.append(Step("parity", "skipped", "the queue does not apply"))
        steps.append(_timed("generated", lambda: _generated_step(settings, store, queue, console=console)))
    return patched


def _queue_step(settings: Settings, holder: dict[str, Any]) -> Step:
    queue = load_queue(settings.patch_dir)
    holder["queue"] = queue
    n = {lane.value: len(queue.lane(lane)) for lane in Lane}
    return Step(
        "queue",
        "ok",
        f"{n['core']} core, {n['model_support']} model_support, {n['generated']} generated "
        f"(digest {queue.digest[:12]})",
        data={"lanes": n, "digest": queue.digest},
    )


def _apply_step(settings: Settings, store: Store, queue: Queue, holder: dict[str, Any], *, console: Console) -> Step:
    with console.step(f"check: apply {len(queue.patches)} patch(es) on {store.upstream_sha[:12]}"):
        replayed = replay(settings, store.repo, store.base, queue, console=console)
    holder["replay"] = replayed
    return Step(
        "apply",
        "ok",
        f"all lanes apply on {store.upstream_sha[:12]}: patched {replayed.patched[:12]}",
        data={"patched_sha": replayed.patched, "source": store.source},
    )


def _parity_step(settings: Settings, store: Store, holder: dict[str, Any], *, console: Console) -> Step:
    replayed: Replay = holder["replay"]
    config = parity.ParityConfig.from_settings(settings)
    allowlist = parity.load_allowlist(config.allowlist, inside=settings.root)
    with console.step("check: parity audit"):
        report = parity.audit(store.repo, replayed, config, allowlist, upstream_sha=store.upstream_sha)
    holder["parity"] = report
    summary = (
        f"{report.upstream.switches} arch switches / {report.upstream.cases} cases upstream, "
        f"{len(report.dropped)} dropped ({len(report.failures)} unlisted), "
        f"{len(report.deletions)} upstream deletion hunk(s)"
    )
    status = "ok" if report.ok else "failed"
    if report.ok and report.stale_allowlist:
        status = "warning"
    return Step("parity", status, summary, details=report.render(), data=report.as_dict())


def _generated_step(settings: Settings, store: Store, queue: Queue, *, console: Console) -> Step:
    spec = generate.load_spec(settings)
    folder = generate.lane_dir(settings)
    if spec is None:
        if queue.lane(Lane.GENERATED):
            return Step(
                "generated",
                "warning",
                f"{len(queue.lane(Lane.GENERATED))} generated patch(es) but no spec "
                f"({settings.relative(generate.spec_path(settings))}): drift cannot be checked",
            )
        return Step("generated", "ok", "no generated-lane spec and no generated patches")
    with console.step("check: regenerate the generated lane aside"):
        lane = generate.generate_lane(
            settings,
            store.repo,
            store.base,
            upstream_sha=store.upstream_sha,
            queue=queue,
            spec=spec,
            console=console,
        )
    drift = genfiles.compare_lane(folder, lane, inside=settings.root)
    if drift.ok:
        return Step("generated", "ok", f"{len(spec.families)} family patch(es), up to date", data=drift.as_dict())
    return Step(
        "generated",
        "failed",
        f"drifted: {', '.join(drift.drifted) or 'inputs/series'} (run `invoke generate`)",
        details=drift.render(),
        data=drift.as_dict(),
    )


def _boundaries_step(report: parity_report.ParityReport | None) -> Step:
    if report is None:
        return Step("boundaries", "skipped", "needs the parity walk")
    if report.boundary:
        return Step(
            "boundaries",
            "warning",
            f"{len(report.boundary)} clean-up patch(es) to fold into the patches they fix",
            details="\n".join(w.render() for w in report.boundary),
            data={"warnings": [w.as_dict() for w in report.boundary]},
        )
    return Step("boundaries", "ok", "every patch changes upstream lines or adds its own")


def failure(report: CheckReport) -> CheckFailed:
    failed = [s for s in report.steps if s.status == "failed"]
    return CheckFailed(
        f"check failed: {', '.join(s.name for s in failed)}",
        details="\n\n".join(f"[{s.name}] {s.summary}" for s in failed),
        untouched="everything: the check ran in temporary worktrees; the workdir and the queue are as they were",
        next_step="fix the steps above (`invoke parity`, `invoke generate`, `invoke prepare --triage` show more)",
        report=report,
    )
