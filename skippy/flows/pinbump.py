"""Moving the pin: ``invoke bisect``, ``invoke summary``, ``invoke pin-bump``.

``bisect`` finds the newest upstream commit between the pin and a target on
which the whole queue still applies, and for each patch that fails at the
target the first upstream commit that breaks it.  Commits are tested in a
temporary index (``git apply --cached --3way``): nothing is checked out.

``pin-bump`` first looks for patches the target already carries (drop
candidates, :mod:`skippy.maintain.carried`): one it finds stops the bump before
any conflict, naming ``--drop`` and ``--keep``.  It then prepares the target,
builds and spot-checks it, runs the parity audit, writes the new pin atomically
and prints the summary, with the map by function (:mod:`skippy.maintain.churn`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from skippy.compile.backends import reference_backend, upstream_areas
from skippy.core.annotations import Annotation, patch_line
from skippy.core.errors import BuildSkipped, CarriedUpstream, ConflictError, SettingsError
from skippy.core.files import write_text_atomic
from skippy.core.git import Repo
from skippy.core.paths import NotSmallFile, read_small_text
from skippy.core.settings import PIN_FILE_LIMIT, Settings
from skippy.core.ui import Console
from skippy.maintain.carried import Carried, carried_patches
from skippy.maintain.summary import Summary, summarize
from skippy.queue import workdir as wd
from skippy.queue.drop import drop_patches, find_patches
from skippy.queue.imports import upstream_of
from skippy.queue.indexapply import IndexApplier
from skippy.queue.model import Patch, Queue, load_queue
from skippy.queue.prepare import prepare, resolve_target
from skippy.queue.run import PrepareReport
from skippy.queue.scratch import owned_scratch
from skippy.queue.target import Target, read_pin
from skippy.queue.upstream import Resolved


@dataclass(frozen=True)
class Breaker:
    patch: str
    subject: str
    commit: str | None  # first upstream commit after the pin where the patch no longer applies
    commit_subject: str | None


@dataclass(frozen=True)
class BisectReport:
    pin: str
    target: str
    tested: int
    candidates: int
    newest_compatible: str
    newest_compatible_subject: str
    breakers: tuple[Breaker, ...] = field(default=())
    #: patches the target already carries, all or some of their hunks (drop candidates)
    carried: tuple[Carried, ...] = field(default=())

    @property
    def target_applies(self) -> bool:
        return self.newest_compatible == self.target

    def as_dict(self) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "target": self.target,
            "commits_between": self.candidates,
            "commits_tested": self.tested,
            "newest_compatible": self.newest_compatible,
            "newest_compatible_subject": self.newest_compatible_subject,
            "target_applies": self.target_applies,
            "breakers": [
                {"patch": b.patch, "subject": b.subject, "commit": b.commit, "commit_subject": b.commit_subject}
                for b in self.breakers
            ],
            "drop_candidates": [c.as_dict() for c in self.carried],
        }

    def render(self) -> str:
        lines = [
            f"bisect {self.pin[:12]}..{self.target[:12]}: {self.candidates} upstream commit(s), {self.tested} tested",
            f"newest upstream commit the whole queue applies to: {self.newest_compatible[:12]} "
            f"{self.newest_compatible_subject}" + (" (the target itself)" if self.target_applies else ""),
        ]
        for b in self.breakers:
            where = f"{b.commit[:12]} {b.commit_subject}" if b.commit else "(no single commit found)"
            lines.append(f"  {b.patch} first breaks at {where}")
        if self.carried:
            lines.append(f"drop candidates (upstream already carries them, at {self.target[:12]}):")
            lines += [f"  {c.describe()}" for c in self.carried]
        return "\n".join(lines)

    def annotations(self, patches: Sequence[Patch], relative: Callable[[Path], str]) -> list[Annotation]:
        """The breakers (errors) and the drop candidates (warnings), on their patch files."""
        by_label = {p.label: p for p in patches}
        out: list[Annotation] = []
        for b in self.breakers:
            if b.patch in by_label:
                where = f"{b.commit[:12]} {b.commit_subject}" if b.commit else "the target"
                out.append(
                    _on_patch(by_label[b.patch], relative, "does not apply", f"first breaks at {where}", "error")
                )
        out += [carried_annotation(c, by_label.get(c.patch), relative) for c in self.carried]
        return out


def _on_patch(patch: Patch, relative: Callable[[Path], str], title: str, message: str, level: str) -> Annotation:
    """An annotation on ``patch``'s first file diff."""
    first = re.search(rb"^diff --git a/.* b/(.*)$", patch.data, re.M)
    path = first.group(1).decode("utf-8", "replace") if first else ""
    return Annotation(relative(patch.path), patch_line(patch.data, path) if first else None, title, message, level)


def carried_annotation(carried: Carried, patch: Patch | None, relative: Callable[[Path], str]) -> Annotation:
    title = "drop candidate: upstream already carries it"
    if patch is None:
        return Annotation(relative(carried.path), None, title, carried.describe())
    return _on_patch(patch, relative, title, carried.describe(), "warning")


def _first_parent_range(repo: Repo, pin: str, target: str) -> list[str]:
    out = repo.git("rev-list", "--first-parent", "--reverse", f"{pin}..{target}").stdout
    return [line for line in out.splitlines() if line]


def _subject(repo: Repo, sha: str) -> str:
    return repo.git("log", "-1", "--format=%s", sha).stdout.strip()


def _last_holding(good: int, bad: int, holds: Callable[[int], bool]) -> int:
    """The last index in ``good..bad`` where ``holds`` is true, given it holds at ``good`` and not at
    ``bad`` and never again once it stops (the bisection invariant)."""
    while bad - good > 1:
        mid = (good + bad) // 2
        if holds(mid):
            good = mid
        else:
            bad = mid
    return good


def bisect_queue(repo: Repo, queue: Queue, pin: str, target: str, *, scratch: Path) -> BisectReport:
    """Binary searches over the first-parent line ``pin..target`` (local commits).

    Assumes, as git bisect does, that once a patch stops applying it stays broken.
    """
    if not repo.is_ancestor(pin, target):
        raise SettingsError(
            f"{target[:12]} does not descend from the pin {pin[:12]}: there is no line of commits to bisect",
            untouched="everything",
            next_step="bisect towards a descendant of the pin (`invoke bisect --to <ref>`)",
        )
    applier = IndexApplier(repo, scratch, "bisect")
    patches = queue.patches
    line = [pin, *_first_parent_range(repo, pin, target)]
    at_pin = applier.verdicts(pin, patches)
    if not all(at_pin):
        failing = [p.label for p, ok in zip(patches, at_pin, strict=True) if not ok]
        raise ConflictError(
            f"the queue does not apply to the pin itself ({', '.join(failing)})",
            untouched="everything",
            next_step="fix the queue against the pin first (`invoke prepare --triage`)",
        )

    def whole(i: int) -> bool:
        return all(applier.verdicts(line[i], patches))

    def applies(index: int, i: int) -> bool:
        return applier.verdicts(line[i], patches)[index]

    last = len(line) - 1
    lo = last if whole(last) else _last_holding(0, last, whole)
    (scratch / "carried").mkdir(exist_ok=True)
    carried = carried_patches(repo, queue, pin, target, scratch=scratch / "carried")
    breakers: list[Breaker] = []
    at_target = applier.verdicts(line[-1], patches)
    for index, (patch, ok) in enumerate(zip(patches, at_target, strict=True)):
        if ok:
            continue
        commit = line[_last_holding(0, last, functools.partial(applies, index)) + 1]
        breakers.append(Breaker(patch.label, patch.subject, commit, _subject(repo, commit)))
    return BisectReport(
        pin=pin,
        target=target,
        tested=len(applier.cache),
        candidates=len(line) - 1,
        newest_compatible=line[lo],
        newest_compatible_subject=_subject(repo, line[lo]),
        breakers=tuple(breakers),
        carried=carried,
    )


# --------------------------------------------------------------------------- shared plumbing


def _repo_for(settings: Settings, console: Console, *, offline: bool = False) -> Repo:
    """The workdir repository; prepared at the pin first if there is none yet."""
    if wd.git_dir_of(settings.workdir) is None:
        prepare(settings, Target.pinned(), console=console, interactive=False, offline=offline)
    return Repo(settings.workdir, settings.env, echo=console.command)


def _target(target_sha: str | None) -> Target:
    return Target.at(target_sha) if target_sha else Target.latest()


def _upstream_pin(settings: Settings, repo: Repo, console: Console) -> tuple[str, str]:
    """(pin SHA, local commit for it in upstream history) — archive imports have no history."""
    pin = read_pin(settings)
    upstream_sha, base, source = resolve_target(settings, repo, Target.pinned(), console=console)
    if source == "archive" and not repo.has_commit(upstream_sha):
        raise SettingsError(
            f"the pin {pin[:12]} is only available from its source archive here, without upstream history",
            untouched="everything",
            next_step="run where the upstream answers (LLAMA_UPSTREAM_URL can point at a local mirror)",
        )
    return pin, base


def run_bisect(settings: Settings, *, to: str | None, console: Console) -> BisectReport:
    repo = _repo_for(settings, console)
    _pin, pin_base = _upstream_pin(settings, repo, console)
    _up, target, _src = resolve_target(settings, repo, _target(to), console=console)
    queue = load_queue(settings.patch_dir)
    with owned_scratch(settings.cache_dir / "tmp", "bisect-") as tmp:
        return bisect_queue(repo, queue, pin_base, target, scratch=tmp)


def run_summary(settings: Settings, old: str, new: str, *, console: Console) -> Summary:
    """The summary of ``old..new``; a side known only from its source archive gives the diffstat
    between the two trees and says the commit list is unavailable (:func:`summarize`)."""
    repo = _repo_for(settings, console)
    old_at = resolve_target(settings, repo, Target.at(old), console=console)
    new_at = resolve_target(settings, repo, Target.at(new), console=console)
    old_base, old_source = old_at.base, old_at.source
    if not repo.is_ancestor(old_base, new_at.base) and _in_history(old_at) and _in_history(new_at):
        raise SettingsError(
            f"{old[:12]} is not an ancestor of {new[:12]}"
            + (" (it is only known from its source archive)" if old_source == "archive" else ""),
            untouched="everything",
            next_step="summarize OLD..NEW where OLD is an upstream ancestor of NEW",
        )
    with owned_scratch(settings.cache_dir / "tmp", "summary-") as tmp:
        return summarize(
            repo,
            old_base,
            new_at.base,
            load_queue(settings.patch_dir),
            upstream_url=settings.upstream_url,
            backend_areas=upstream_areas(),
            scratch=tmp,
        )


def _in_history(at: Resolved) -> bool:
    """Whether ``at`` is an upstream commit of the repository's history (not an archive import)."""
    return at.base == at.upstream_sha


# --------------------------------------------------------------------------- pin-bump


@dataclass(frozen=True)
class BumpReport:
    old_pin: str
    new_pin: str
    written: bool
    dry_run: bool
    patched_sha: str
    backends: tuple[str, ...]
    summary: Summary | None
    parity: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    #: the CPU build's fingerprints against the committed reference: per model, the prompts whose
    #: greedy answer changed between the old and the new pin, and whether the reference was rewritten
    numerics: tuple[dict[str, Any], ...] = ()
    #: the patches ``--drop`` took out of the queue
    dropped: tuple[str, ...] = ()
    #: where the new pin came from: "git" (upstream history has it) or "archive" (its source archive alone)
    source: str = "git"
    #: why a pin from a source archive alone is unverified (what vouches for it), empty when history does
    unverified: str = ""

    def provenance_markdown(self) -> str:
        """The warning that heads the pull request of a pin no upstream history vouches for."""
        if not self.unverified:
            return ""
        verb = "would be written" if self.dry_run else "was written" if self.written else "comes"
        return (
            f"> **Unverified pin**: `{self.new_pin}` {verb} from {self.unverified}. No upstream history here "
            "shows that upstream has this commit with this tree: check it upstream (or re-run `invoke pin-bump "
            f"--sha {self.new_pin}` with LLAMA_UPSTREAM_URL pointing at a mirror) before merging.\n"
        )

    def numerics_markdown(self) -> str:
        if not self.numerics:
            return ""
        lines = ["### Numerics (greedy answers of the CPU build, old pin -> new pin)", ""]
        for n in self.numerics:
            changed = n["changed_prompts"]
            what = "unchanged" if not changed else "CHANGED for " + ", ".join(f"`{p}`" for p in changed)
            if not n["had_reference"]:
                what = "no reference before this bump"
            tail = ""
            if n["written"]:
                tail = f"; reference rewritten: `{n['reference']}`"
            elif n.get("up_to_date"):
                tail = f"; reference `{n['reference']}` already holds these answers, left as it is"
            lines.append(f"- `{n['model']}`: {what}{tail}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "old_pin": self.old_pin,
            "new_pin": self.new_pin,
            "written": self.written,
            "dry_run": self.dry_run,
            "patched_sha": self.patched_sha,
            "backends": list(self.backends),
            "summary": self.summary.as_dict() if self.summary else None,
            "parity": self.parity,
            "notes": list(self.notes),
            "numerics": list(self.numerics),
            "dropped": list(self.dropped),
            "source": self.source,
            "verified": not self.unverified,
            "unverified": self.unverified,
        }


BuildFn = Callable[[str, Settings, Console, Callable[[Settings, Console], PrepareReport]], object]
ParityFn = Callable[[Settings, Console, Repo, str, str], dict[str, Any] | None]


def _default_build(
    backend: str,
    settings: Settings,
    console: Console,
    prepare_fn: Callable[[Settings, Console], PrepareReport],
    *,
    upstream_tests: bool = True,
) -> object:
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


def _default_parity(settings: Settings, console: Console, repo: Repo, base: str, upstream_sha: str) -> dict[str, Any]:
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


def pin_text(old: str, sha: str) -> str:
    """The pin file ``old`` with its SHA line replaced by ``sha``: comment lines (``#``, as
    :func:`skippy.queue.target.read_pin` reads them), blank lines, indentation and line endings stay."""
    lines = old.splitlines(keepends=True)
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        if line.startswith("#") or not body.strip():
            continue
        indent = body[: len(body) - len(body.lstrip())]
        lines[i] = indent + sha + line[len(body) :]
        return "".join(lines)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join(lines) + sha + "\n"


def write_pin_atomic(path: Path, sha: str) -> None:
    """Write ``sha`` into the pin file atomically, keeping its comments and mode (through a link)."""
    target = path.resolve() if path.is_symlink() else path
    try:
        old = read_small_text(target, PIN_FILE_LIMIT)
    except FileNotFoundError:
        old = ""
    except NotSmallFile as exc:
        raise SettingsError(
            f"{path}: refused as a pin file: it is {exc.why}",
            untouched=f"{path}: the pin was not written",
            next_step=f"make {path} a small regular file holding one upstream commit, then re-run `invoke pin-bump`",
        ) from None
    write_text_atomic(target, pin_text(old, sha))


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
    build_fn: BuildFn | None = None,
    parity_fn: ParityFn = _default_parity,
    drop: Sequence[str] = (),
    keep: Sequence[str] = (),
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
    dropping = find_patches(queue, drop, flag="--drop")
    if set(keeping) & set(dropping):
        both = ", ".join(p.label for p in keeping if p in dropping)
        raise SettingsError(
            f"--drop and --keep both name {both}",
            untouched="everything: the pin and the queue",
            next_step="name each patch in one of --drop and --keep, then re-run `invoke pin-bump`",
        )
    dropped = drop_patches(dropping) if dropping else None
    if dropped is not None:
        moved = "".join(f"; {a.name} is now {b.name}" for a, b in dropped.renamed)
        console.info(f"dropped from the queue: {', '.join(dropped.labels)}{moved}")
    try:
        report = _bump(
            settings,
            sha=sha,
            console=console,
            backends=backends,
            dry_run=dry_run,
            allow_non_descendant=allow_non_descendant,
            newest_compatible=newest_compatible,
            offline=offline,
            upstream_tests=upstream_tests,
            build_fn=build_fn,
            parity_fn=parity_fn,
            keep=frozenset(p.label for p in keeping),
        )
    except BaseException:
        if dropped is not None:
            dropped.restore()
            console.info(f"the bump did not finish: put back in the queue: {', '.join(dropped.labels)}")
        raise
    if dropped is None:
        return report
    if dry_run:
        dropped.restore()
        return replace(report, notes=(*report.notes, f"dry run: put back in the queue: {', '.join(dropped.labels)}"))
    files = ", ".join(settings.relative(p.path) for p in dropped.patches)
    return replace(
        report,
        dropped=dropped.labels,
        notes=(*report.notes, f"dropped {', '.join(dropped.labels)} (commit the removal; git restores {files})"),
    )


def _bump(
    settings: Settings,
    *,
    sha: str | None,
    console: Console,
    backends: Sequence[str] | None,
    dry_run: bool,
    allow_non_descendant: bool,
    newest_compatible: bool,
    offline: bool,
    upstream_tests: bool,
    build_fn: BuildFn | None,
    parity_fn: ParityFn,
    keep: frozenset[str],
) -> BumpReport:
    backends = tuple(backends or (reference_backend(),))
    build = build_fn or functools.partial(_default_build, upstream_tests=upstream_tests)
    if offline and not sha:
        raise _offline_needs_sha(settings)
    repo = _repo_for(settings, console, offline=offline)
    # the target first: fetching it may bring the pin's own upstream history along
    new_at = resolve_target(settings, repo, _target(sha), console=console, offline=offline)
    old_at = resolve_target(settings, repo, Target.pinned(), console=console, offline=offline)
    (old_pin, old_base), (new_pin, new_base) = old_at[:2], new_at[:2]
    history = _in_history(old_at) and _in_history(new_at)
    notes: list[str] = []
    queue = load_queue(settings.patch_dir)
    if newest_compatible:
        if not history:
            raise _no_history_for_bisect(settings, old_at, new_at)
        with owned_scratch(settings.cache_dir / "tmp", "bisect-") as tmp:
            found = bisect_queue(repo, queue, old_base, new_base, scratch=tmp)
        console.info(found.render())
        new_pin = new_base = found.newest_compatible
        notes.append(f"newest compatible upstream commit: {new_pin[:12]}")
    if new_base == old_base:
        console.info(f"the pin is already {old_pin[:12]}: nothing to bump")
        return BumpReport(old_pin, old_pin, False, dry_run, "", (), None, notes=(*notes, "already at the target"))
    if not history:
        notes.append(_unchecked_descent(settings, old_at, new_at, dry_run=dry_run, allowed=allow_non_descendant))
        console.warn(notes[-1])
    elif not repo.is_ancestor(old_base, new_base) and not allow_non_descendant:
        raise _not_forward(settings, repo, (old_pin, old_base), (new_pin, new_base))
    notes += _drop_candidates(
        settings,
        console,
        repo,
        queue,
        (old_base, new_base),
        new_pin=new_pin,
        keep=keep,
        dry_run=dry_run,
        history=history,
    )
    unverified = _unverified(settings, console, new_at, notes)
    target = Target.at(new_pin)
    prepared = _prepare_or_bisect(
        settings, repo, queue, target, bases=(old_base, new_base), console=console, offline=offline
    )

    def prepare_new(s: Settings, c: Console) -> PrepareReport:
        return prepare(s, target, console=c, interactive=False, offline=offline)

    outcomes: dict[str, object] = {}
    for backend in backends:
        with console.step(f"build and spot-check {backend} at {new_pin[:12]}"):
            outcomes[backend] = build(backend, settings, console, prepare_new)
    with console.step("parity audit against the new upstream"):
        parity = parity_fn(settings, console, repo, new_base, new_pin)
    with owned_scratch(settings.cache_dir / "tmp", "summary-") as tmp:
        summary = summarize(
            repo,
            old_base,
            new_base,
            queue,
            upstream_url=settings.upstream_url,
            backend_areas=upstream_areas(),
            scratch=tmp,
        )
    numerics = _numerics(settings, outcomes.get(reference_backend()), write=not dry_run)
    written = False
    if not dry_run:
        notes += _write_pins(settings, new_pin)
        written = True
    console.summary(summary.markdown())
    report_numerics = tuple(numerics)
    return BumpReport(
        old_pin=old_pin,
        new_pin=new_pin,
        written=written,
        dry_run=dry_run,
        patched_sha=prepared.patched_sha,
        backends=tuple(backends),
        summary=summary,
        parity=parity,
        notes=tuple(notes),
        numerics=report_numerics,
        source="archive" if unverified else "git",
        unverified=unverified,
    )


def _drop_candidates(
    settings: Settings,
    console: Console,
    repo: Repo,
    queue: Queue,
    bases: tuple[str, str],
    *,
    new_pin: str,
    keep: frozenset[str],
    dry_run: bool,
    history: bool,
) -> list[str]:
    """Stop on the patches upstream already carries at the target (but those in ``keep``); the notes."""
    old_base, new_base = bases
    if not history or not repo.is_ancestor(old_base, new_base):
        return ["drop candidates were not looked for: there is no upstream history from the pin to the target"]
    with (
        console.step(f"patches upstream already carries at {new_pin[:12]}"),
        owned_scratch(settings.cache_dir / "tmp", "carried-") as tmp,
    ):
        carried = carried_patches(repo, queue, old_base, new_base, scratch=tmp)
    stopping = tuple(c for c in carried if c.patch not in keep)
    if stopping:
        raise _carried_error(settings, queue, stopping, new_pin, dry_run=dry_run)
    return [f"kept on purpose (--keep): {c.describe()}" for c in carried]


def _carried_error(
    settings: Settings, queue: Queue, carried: Sequence[Carried], new_pin: str, *, dry_run: bool
) -> CarriedUpstream:
    labels = [c.patch for c in carried]
    again = f"invoke pin-bump --sha {new_pin}" + (" --dry-run" if dry_run else "")
    drops = " ".join(f"--drop {c.patch}" for c in carried if c.how != "partly")
    keeps = " ".join(f"--keep {c.patch}" for c in carried)
    steps = [f"`{again} {drops}` (drop what upstream carries whole)"] if drops else []
    partly = [c.patch for c in carried if c.how == "partly"]
    if partly:
        steps.append(f"refresh {', '.join(partly)} to the hunks upstream lacks (upstream has the others), or drop it")
    steps.append(f"keep them: `{again} {keeps}`")
    by_label = {p.label: p for p in queue.patches}
    return CarriedUpstream(
        f"upstream {new_pin[:12]} already carries {len(carried)} patch(es) of the queue: {', '.join(labels)}",
        details="\n".join(c.describe() for c in carried),
        untouched="the pin and the queue: nothing was prepared, built or written",
        next_step="; or ".join(steps),
        annotations=[carried_annotation(c, by_label.get(c.patch), settings.relative) for c in carried],
        carried=carried,
    )


def _archive_only(old: Resolved, new: Resolved) -> str:
    """Which side(s) of a bump are known only from their source archive, for a message."""
    only = [at.upstream_sha[:12] for at in (old, new) if not _in_history(at)]
    what = " and ".join(only)
    return f"{what} {'is' if len(only) == 1 else 'are'} known here only from " + (
        "its source archive" if len(only) == 1 else "their source archives"
    )


def _unchecked_descent(settings: Settings, old: Resolved, new: Resolved, *, dry_run: bool, allowed: bool) -> str:
    """The note of a bump whose direction cannot be checked; refuses a real bump not allowed."""
    why = (
        f"cannot check that {new.upstream_sha[:12]} descends from the pin {old.upstream_sha[:12]}: "
        f"{_archive_only(old, new)}, without upstream history"
    )
    if allowed:
        return f"{why}; going on as --allow-non-descendant says"
    if dry_run:
        return f"{why}; the real bump will need --allow-non-descendant"
    raise SettingsError(
        f"{why}: refusing to move the pin without knowing it moves forward",
        untouched=f"{settings.relative(settings.pin_file)} and the workdir",
        next_step=f"check that {new.upstream_sha[:12]} descends from {old.upstream_sha[:12]} upstream, then "
        f"`invoke pin-bump --sha {new.upstream_sha} --allow-non-descendant`; or point LLAMA_UPSTREAM_URL at a "
        "mirror (`git clone --mirror`) and re-run without it",
    )


def _no_history_for_bisect(settings: Settings, old: Resolved, new: Resolved) -> SettingsError:
    return SettingsError(
        f"--newest-compatible bisects the upstream history from the pin to the target: "
        f"{_archive_only(old, new)}, without upstream history",
        untouched=f"{settings.relative(settings.pin_file)} and the workdir",
        next_step=f"`invoke pin-bump --sha {new.upstream_sha}` (the target itself), or point LLAMA_UPSTREAM_URL "
        "at a mirror (`git clone --mirror`) and re-run",
    )


def _unverified(settings: Settings, console: Console, new_at: Resolved, notes: list[str]) -> str:
    """For a target known only from its source archive, what alone vouches for it (noted and
    warned); empty when the upstream history has it (the target itself, so also the newest
    compatible commit bisection finds before it)."""
    if _in_history(new_at):
        return ""
    from skippy.queue import archives  # only archive users pay for it

    said = archives.provenance(settings, new_at.upstream_sha)
    notes.append(
        f"unverified pin: {new_at.upstream_sha[:12]} comes from {said}; no upstream history here vouches for it"
    )
    console.warn(notes[-1])
    return said


def _offline_needs_sha(settings: Settings) -> SettingsError:
    """``--offline`` without ``--sha``: upstream master is not known offline; name the archives there are."""
    pin = read_pin(settings)
    mapped = sorted(str(k).lower() for k in (settings.raw.get("archives") or {}) if str(k).lower() != pin)
    return SettingsError(
        "pin-bump --offline needs --sha: upstream master is not known offline",
        untouched="everything",
        next_step=f"`invoke pin-bump --offline --sha {mapped[0]}`"
        if mapped
        else "map the target to a source archive in [tool.skippy.archives], then "
        "`invoke pin-bump --offline --sha <that sha>`",
        details="commits mapped to a source archive besides the pin: " + (", ".join(m[:12] for m in mapped) or "none"),
    )


def _not_forward(settings: Settings, repo: Repo, old: tuple[str, str], new: tuple[str, str]) -> SettingsError:
    """The refusal of a target that does not descend from the pin; ``old``/``new``: (pin, local base)."""
    backwards = repo.is_ancestor(new[1], old[1])
    return SettingsError(
        f"{new[0][:12]} is "
        + ("behind the pin (an ancestor of it)" if backwards else "not a descendant of the pin")
        + f" {old[0][:12]}: refusing to move the pin {'backwards' if backwards else 'sideways'}",
        untouched=f"{settings.relative(settings.pin_file)} and the workdir",
        next_step="pass --allow-non-descendant if this is really meant",
    )


def _prepare_or_bisect(
    settings: Settings,
    repo: Repo,
    queue: Queue,
    target: Target,
    *,
    bases: tuple[str, str],
    console: Console,
    offline: bool = False,
) -> PrepareReport:
    """Prepare ``target``; when the queue does not apply, the error also names, found by bisection,
    the first upstream commit each patch breaks at and the newest one the whole queue applies to
    (between ``bases``: the local commits of the old pin and of the target)."""
    old_base, new_base = bases
    try:
        return prepare(settings, target, console=console, interactive=False, offline=offline)
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


def _write_pins(settings: Settings, new_pin: str) -> list[str]:
    """Write the pin (and its mirror, when configured); the notes to report."""
    write_pin_atomic(settings.pin_file, new_pin)
    if settings.pin_mirror is None:
        return []
    write_pin_atomic(settings.pin_mirror, new_pin)
    return [f"mirrored the pin to {settings.relative(settings.pin_mirror)}"]


def _numerics(settings: Settings, cpu_outcome: object, *, write: bool) -> list[dict[str, Any]]:
    """The CPU build's fingerprints against the committed reference; rewrite it when ``write``."""
    from skippy.spot.fingerprint import greedy_changed, read_reference, reference_path, render_reference
    from skippy.spot.proofs import reference_dir
    from skippy.spot.report import SpotCheckReport

    spot = getattr(cpu_outcome, "spot", None)
    if not isinstance(spot, SpotCheckReport):
        return []
    found: list[dict[str, Any]] = []
    refs = reference_dir(settings)
    for result in spot.results:
        fingerprint = result.compute.fingerprint
        if fingerprint is None:
            continue
        old = read_reference(refs, fingerprint.model)
        had = old is not None and old.key() == fingerprint.key()
        path = reference_path(refs, fingerprint.model)
        text = render_reference(fingerprint)
        up_to_date = _holds(path, text)
        if write and not up_to_date:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        found.append(
            {
                "model": fingerprint.model,
                "had_reference": had,
                "changed_prompts": greedy_changed(old if had else None, fingerprint) if had else [],
                "reference": settings.relative(path),
                # rewritten: its content changed (a reference that already holds these answers is left as it is)
                "written": write and not up_to_date,
                "up_to_date": up_to_date,
            }
        )
    return found


def _holds(path: Path, text: str) -> bool:
    """Whether the file at ``path`` holds exactly ``text`` (a missing or unreadable one does not)."""
    try:
        return path.read_bytes() == text.encode("utf-8")
    except OSError:
        return False
