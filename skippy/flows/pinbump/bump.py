"""``invoke pin-bump``: the pin moved to a new upstream commit, as a maintainer moves it by hand.

First the patches the target already carries (drop candidates, :mod:`skippy.maintain.carried`):
one it finds stops the bump before any conflict, naming ``--drop`` and ``--keep``.  Then the
target is prepared (on a conflict: prepare's triage and the bisection), built and spot-checked,
the parity audit runs against the new upstream, the new pin is written atomically and the summary
printed, with the map by function (:mod:`skippy.maintain.churn`).  The build and the parity audit
are the move's :class:`Collaborators`: the real ones by default, tests pass others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from skippy.compile.backends import reference_backend
from skippy.core.errors import BuildSkipped, ConflictError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump import refusals
from skippy.flows.pinbump.bisect import bisect_queue
from skippy.flows.pinbump.numerics import numerics_of
from skippy.flows.pinbump.pinfile import write_pins
from skippy.flows.pinbump.report import BumpReport
from skippy.flows.pinbump.sides import in_history, repo_for, summarize_move, target_of
from skippy.maintain.carried import carried_patches
from skippy.queue.drop import Dropped, drop_patches, find_patches
from skippy.queue.imports import upstream_of
from skippy.queue.model import Patch, Queue, load_queue
from skippy.queue.prepare import prepare, resolve_target
from skippy.queue.run import PrepareReport
from skippy.queue.scratch import owned_scratch
from skippy.queue.target import Target
from skippy.queue.upstream import Resolved

#: prepares the new target with the build's settings and console (each backend's build calls it)
PrepareFn = Callable[[Settings, Console], PrepareReport]
#: the parity audit of the queue on the new upstream: (settings, console, repo, local base, upstream SHA)
Parity = Callable[[Settings, Console, Repo, str, str], dict[str, Any] | None]


class Build(Protocol):
    """Build and spot-check one backend at the new target, prepared by the given ``PrepareFn``; its
    outcome (the reference backend's spot check is what :mod:`.numerics` reads).  ``upstream_tests``:
    the reference backend's build also runs upstream's tests."""

    def __call__(
        self, backend: str, settings: Settings, console: Console, prepare_fn: PrepareFn, /, *, upstream_tests: bool
    ) -> object: ...


def default_build(
    backend: str, settings: Settings, console: Console, prepare_fn: PrepareFn, *, upstream_tests: bool
) -> object:
    """The build session of ``backend`` at the new target (``nox -s build-<backend>``'s, with its
    spot check), ended with its block; a skipped build raises BuildSkipped: the pin stays."""
    from skippy.compile.request import build_request
    from skippy.flows import build_session
    from skippy.flows.build_session import SessionRequest, run_build_session, session_ending

    # upstream's tests on the CPU build: a test the queue breaks raises, and the pin stays;
    # the new upstream's numbers may move on purpose: compared with the reference and reported, not failed
    upstream = upstream_tests and backend == reference_backend()
    request = SessionRequest(build_request(backend, settings), upstream_tests=upstream, numerics_must_match=False)
    calls = build_session.Collaborators(prepare=lambda s, c, _backend: prepare_fn(s, c))
    outcome = run_build_session(request, settings, console, calls)
    if outcome.skipped:
        raise BuildSkipped(
            f"build-{backend} was skipped: {outcome.skipped}",
            untouched=f"{settings.relative(settings.pin_file)}: the pin was not changed",
            next_step=f"make build-{backend} possible here (`nox -s build-{backend}` says what it needs), "
            "then run `invoke pin-bump` again",
        )
    session_ending(outcome, settings).show(console)  # each backend's build ends with its block, as nox's does
    return outcome


def default_parity(settings: Settings, console: Console, repo: Repo, base: str, upstream_sha: str) -> dict[str, Any]:
    """The parity audit of the queue replayed on the new upstream; raises ParityFailed on unlisted drops."""
    from skippy.maintain import parity
    from skippy.maintain.replay import replay

    config = parity.ParityConfig.from_settings(settings)
    allowlist = parity.load_allowlist(config.allowlist)
    queue = load_queue(settings.patch_dir)
    replayed = replay(settings, repo, base, queue, console=console)
    report = parity.audit(repo, replayed, config, allowlist, upstream_sha=upstream_sha)
    if not report.ok:
        raise parity.failure(report, settings)
    return report.as_dict()


@dataclass(frozen=True)
class Collaborators:
    """What a pin move calls beyond the repository and the queue: each backend's build (with its
    spot check) and the parity audit.  The defaults are the real ones; tests pass others."""

    build: Build = default_build
    parity: Parity = default_parity


#: the real collaborators
REAL_COLLABORATORS = Collaborators()


@dataclass(frozen=True)
class _Request:
    """What the bump was asked: the target, the backends, how far it may go."""

    sha: str | None
    backends: tuple[str, ...]
    dry_run: bool
    allow_non_descendant: bool
    newest_compatible: bool
    offline: bool
    upstream_tests: bool
    #: the drop candidates kept on purpose (``--keep``)
    keep: frozenset[str]


@dataclass(frozen=True)
class _Move:
    """The two sides of the move in the workdir's repository, as resolved, and where the pin goes:
    the target, or the newest compatible commit before it."""

    repo: Repo
    old: Resolved
    new: Resolved
    new_pin: str
    new_base: str

    @property
    def old_pin(self) -> str:
        return self.old.upstream_sha

    @property
    def old_base(self) -> str:
        return self.old.base

    @property
    def history(self) -> bool:
        """Whether upstream history holds both sides (neither is a source archive alone)."""
        return in_history(self.old) and in_history(self.new)


def pin_bump(
    settings: Settings,
    *,
    sha: str | None,
    console: Console,
    backends: Sequence[str] | None = None,
    dry_run: bool = False,
    allow_non_descendant: bool = False,
    newest_compatible: bool = False,
    offline: bool = False,
    upstream_tests: bool = True,
    drop: Sequence[str] = (),
    keep: Sequence[str] = (),
    collaborators: Collaborators = REAL_COLLABORATORS,
) -> BumpReport:
    """Move the pin to ``sha`` (default: upstream master); see the module docstring.

    ``drop``: patches taken out of the queue first (put back, byte for byte, when the bump fails
    or is a dry run).  ``keep``: drop candidates kept on purpose (the bump goes on; a note says so).

    Offline (``offline``, or an upstream that does not answer), a target mapped to a source archive
    comes from it, as prepare does; what needs upstream history degrades with a note: the
    descendant check cannot be made (a real bump then needs ``allow_non_descendant``; a dry run
    goes on and says so), the summary gives the diffstat without a commit list, and there is no
    bisection (``newest_compatible`` is refused).  ``backends`` default to the reference one (the CPU).

    ``upstream_tests``: the reference backend's build also runs upstream's tests, and a test the
    queue breaks (traced to its patch) leaves the pin where it was."""
    queue = load_queue(settings.patch_dir)
    keeping = find_patches(queue, keep, flag="--keep")
    dropped = _take_out(queue, drop, keeping, console)
    request = _Request(
        sha=sha,
        backends=tuple(backends or (reference_backend(),)),
        dry_run=dry_run,
        allow_non_descendant=allow_non_descendant,
        newest_compatible=newest_compatible,
        offline=offline,
        upstream_tests=upstream_tests,
        keep=frozenset(p.label for p in keeping),
    )
    try:
        report = _bump(settings, request, console, collaborators)
    except BaseException:
        if dropped is not None:
            dropped.restore()
            console.info(f"the bump did not finish: put back in the queue: {', '.join(dropped.labels)}")
        raise
    return report if dropped is None else _with_dropped(settings, report, dropped)


def _take_out(queue: Queue, drop: Sequence[str], keeping: Sequence[Patch], console: Console) -> Dropped | None:
    """``--drop``: the patches taken out of the queue for the bump (None: it names none)."""
    dropping = find_patches(queue, drop, flag="--drop")
    refusals.refuse_drop_and_keep(keeping, dropping)
    if not dropping:
        return None
    dropped = drop_patches(dropping)
    moved = "".join(f"; {a.name} is now {b.name}" for a, b in dropped.renamed)
    console.info(f"dropped from the queue: {', '.join(dropped.labels)}{moved}")
    return dropped


def _with_dropped(settings: Settings, report: BumpReport, dropped: Dropped) -> BumpReport:
    """The report of a bump that dropped patches: put back after a dry run, else named for the commit."""
    if report.dry_run:
        dropped.restore()
        return replace(report, notes=(*report.notes, f"dry run: put back in the queue: {', '.join(dropped.labels)}"))
    files = ", ".join(settings.relative(p.path) for p in dropped.patches)
    return replace(
        report,
        dropped=dropped.labels,
        notes=(*report.notes, f"dropped {', '.join(dropped.labels)} (commit the removal; git restores {files})"),
    )


def _bump(settings: Settings, request: _Request, console: Console, calls: Collaborators) -> BumpReport:
    """The move with the queue as asked: the two sides, what may stop it before anything is
    prepared, then prepare, build and spot-check, audit, summarize, and write the pin."""
    move = _sides(settings, request, console)
    queue = load_queue(settings.patch_dir)
    notes: list[str] = []
    if request.newest_compatible:
        move = _to_newest_compatible(settings, move, queue, console)
        notes.append(f"newest compatible upstream commit: {move.new_pin[:12]}")
    if move.new_base == move.old_base:
        console.info(f"the pin is already {move.old_pin[:12]}: nothing to bump")
        return BumpReport(
            move.old_pin, move.old_pin, False, request.dry_run, "", (), None, notes=(*notes, "already at the target")
        )
    notes += _direction(settings, move, request, console)
    notes += _drop_candidates(settings, console, move, queue, request)
    unverified = _unverified(settings, console, move.new, notes)
    prepared = _prepare_or_bisect(settings, move, queue, console=console, offline=request.offline)
    outcomes = _build_each(settings, move, request, console, calls.build)
    with console.step("parity audit against the new upstream"):
        parity = calls.parity(settings, console, move.repo, move.new_base, move.new_pin)
    summary = summarize_move(settings, move.repo, move.old_base, move.new_base, queue)
    numerics = numerics_of(settings, outcomes.get(reference_backend()), write=not request.dry_run)
    if not request.dry_run:
        notes += write_pins(settings, move.new_pin)
    console.summary(summary.markdown())
    return BumpReport(
        old_pin=move.old_pin,
        new_pin=move.new_pin,
        written=not request.dry_run,
        dry_run=request.dry_run,
        patched_sha=prepared.patched_sha,
        backends=request.backends,
        summary=summary,
        parity=parity,
        notes=tuple(notes),
        numerics=tuple(numerics),
        source="archive" if unverified else "git",
        unverified=unverified,
    )


def _sides(settings: Settings, request: _Request, console: Console) -> _Move:
    """The pin and the target resolved in the workdir's repository (prepared at the pin when there
    is none); upstream master is not known offline, so ``--offline`` needs ``--sha``."""
    if request.offline and not request.sha:
        raise refusals.offline_needs_sha(settings)
    repo = repo_for(settings, console, offline=request.offline)
    # the target first: fetching it may bring the pin's own upstream history along
    new = resolve_target(settings, repo, target_of(request.sha), console=console, offline=request.offline)
    old = resolve_target(settings, repo, Target.pinned(), console=console, offline=request.offline)
    return _Move(repo, old, new, new_pin=new.upstream_sha, new_base=new.base)


def _to_newest_compatible(settings: Settings, move: _Move, queue: Queue, console: Console) -> _Move:
    """``--newest-compatible``: the move shortened to the newest upstream commit the whole queue
    applies to, bisected between the pin and the target (which needs the history of both)."""
    if not move.history:
        raise refusals.no_history_for_bisect(settings, move.old, move.new)
    with owned_scratch(settings.cache_dir / "tmp", "bisect-") as tmp:
        found = bisect_queue(move.repo, queue, move.old_base, move.new_base, scratch=tmp)
    console.info(found.render())
    return replace(move, new_pin=found.newest_compatible, new_base=found.newest_compatible)


def _direction(settings: Settings, move: _Move, request: _Request, console: Console) -> list[str]:
    """The pin moves forward: checked in upstream history (a target that does not descend from the
    pin is refused unless ``--allow-non-descendant``); without history, a note that it could not be
    checked (and a real bump refused unless allowed)."""
    if not move.history:
        note = refusals.unchecked_descent(
            settings, move.old, move.new, dry_run=request.dry_run, allowed=request.allow_non_descendant
        )
        console.warn(note)
        return [note]
    if not move.repo.is_ancestor(move.old_base, move.new_base) and not request.allow_non_descendant:
        raise refusals.not_forward(settings, move.repo, (move.old_pin, move.old_base), (move.new_pin, move.new_base))
    return []


def _drop_candidates(settings: Settings, console: Console, move: _Move, queue: Queue, request: _Request) -> list[str]:
    """Stop on the patches upstream already carries at the target (but those in ``--keep``); the notes."""
    if not move.history or not move.repo.is_ancestor(move.old_base, move.new_base):
        return ["drop candidates were not looked for: there is no upstream history from the pin to the target"]
    with (
        console.step(f"patches upstream already carries at {move.new_pin[:12]}"),
        owned_scratch(settings.cache_dir / "tmp", "carried-") as tmp,
    ):
        carried = carried_patches(move.repo, queue, move.old_base, move.new_base, scratch=tmp)
    stopping = tuple(c for c in carried if c.patch not in request.keep)
    if stopping:
        raise refusals.carried_error(settings, queue, stopping, move.new_pin, dry_run=request.dry_run)
    return [f"kept on purpose (--keep): {c.describe()}" for c in carried]


def _unverified(settings: Settings, console: Console, new_at: Resolved, notes: list[str]) -> str:
    """For a target known only from its source archive, what alone vouches for it (noted and
    warned); empty when the upstream history has it (the target itself, so also the newest
    compatible commit bisection finds before it)."""
    if in_history(new_at):
        return ""
    from skippy.queue import archives  # only archive users pay for it

    said = archives.provenance(settings, new_at.upstream_sha)
    notes.append(
        f"unverified pin: {new_at.upstream_sha[:12]} comes from {said}; no upstream history here vouches for it"
    )
    console.warn(notes[-1])
    return said


def _prepare_or_bisect(
    settings: Settings, move: _Move, queue: Queue, *, console: Console, offline: bool
) -> PrepareReport:
    """Prepare the new pin; when the queue does not apply, the error also names, found by bisection,
    the first upstream commit each patch breaks at and the newest one the whole queue applies to
    (between the local commits of the old pin and of the target)."""
    repo, old_base, new_base = move.repo, move.old_base, move.new_base
    try:
        return prepare(settings, Target.at(move.new_pin), console=console, interactive=False, offline=offline)
    except ConflictError as exc:
        details, annotations, next_step = exc.details or "", exc.annotations, exc.next_step
        if upstream_of(repo, old_base) is not None or upstream_of(repo, new_base) is not None:
            details += (
                "\n\nno bisection: the pin or the target is known here only from its source archive, without "
                "upstream history (point LLAMA_UPSTREAM_URL at a mirror to find the commit each patch breaks at)"
            )
        elif repo.is_ancestor(old_base, new_base):
            with owned_scratch(settings.cache_dir / "tmp", "bisect-") as tmp:
                found = bisect_queue(repo, queue, old_base, new_base, scratch=tmp)
            details += "\n\n" + found.render()
            shown = {a.file for a in annotations}
            more = [a for a in found.annotations(queue.patches, settings.relative) if a.file not in shown]
            annotations = (*annotations, *more)
            next_step = (
                f"refresh the patches named above, or bump to the newest compatible commit "
                f"{found.newest_compatible[:12]} with `invoke pin-bump --newest-compatible`"
            )
        # the pin move's own account of the conflict: prepare's, with the bisection and what pin-bump left
        raise ConflictError(
            exc.what,
            details=details or None,
            annotations=annotations,
            next_step=next_step,
            untouched=f"{settings.relative(settings.pin_file)}: the pin was not changed",
            triage=exc.triage,
        ) from exc


def _build_each(
    settings: Settings, move: _Move, request: _Request, console: Console, build: Build
) -> dict[str, object]:
    """Each backend built and spot-checked at the new pin; their outcomes by backend."""
    target = Target.at(move.new_pin)

    def prepare_new(s: Settings, c: Console) -> PrepareReport:
        return prepare(s, target, console=c, interactive=False, offline=request.offline)

    outcomes: dict[str, object] = {}
    for backend in request.backends:
        with console.step(f"build and spot-check {backend} at {move.new_pin[:12]}"):
            outcomes[backend] = build(backend, settings, console, prepare_new, upstream_tests=request.upstream_tests)
    return outcomes
