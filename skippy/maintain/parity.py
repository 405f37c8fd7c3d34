"""``invoke parity``: the queue must not silently drop arch cases.

For every switch over ``LLM_ARCH_*`` (per enclosing function) and every table
keyed by ``LLM_ARCH_*`` in the configured files, the arch cases of the
upstream tree are compared with those of the patched tree.  Every case the
queue drops must be listed, with a reason, in the allowlist beside the queue
(``<patch_dir>/parity-allowlist.toml``), or the audit fails, naming the
file, the function (or table), the case and the patch that dropped it (the
queue is applied patch by patch and each step is rescanned).

The same walk lists every hunk of the queue that deletes upstream lines
(not lines an earlier patch of the queue added: a map of who added each
line, carried from patch to patch through their hunks, tells them apart, as
``git blame <pin>..`` would without walking the queue again for every
patch), and the boundary lint warns about patches that only rewrite lines
earlier patches introduced (a clean-up that belongs folded into the patches
it fixes).

The configuration (``[tool.skippy.parity]``: the files to scan, where the
allowlist lives) and the allowlist itself are read by ``parity_config``; the
map of who added each line is :mod:`skippy.maintain.linemap`'s, the report's
parts are :mod:`skippy.maintain.parity_report`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from skippy.core import gitbulk
from skippy.core.errors import ParityFailed
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppscan
from skippy.maintain.linemap import STEP_DIFF, Hunk, LineMap, Owner, parse_hunks
from skippy.maintain.parity_config import (
    DEFAULT_ALLOWLIST,
    DEFAULT_FILES,
    Allowed,
    ParityConfig,
    glob_match,
    load_allowlist,
)
from skippy.maintain.parity_report import BoundaryWarning, Deletion, Dropped, ParityReport, Summary
from skippy.maintain.replay import Replay

# the module's public names; the configuration's (from parity_config) are re-exported for their callers
__all__ = [
    "DEFAULT_ALLOWLIST",
    "DEFAULT_FILES",
    "Allowed",
    "Key",
    "ParityConfig",
    "analyse_step",
    "audit",
    "compare",
    "failure",
    "glob_match",
    "load_allowlist",
    "merged_counts",
    "run_parity",
    "scan_commit",
]

Key = tuple[str, str, str]  # (kind, file, scope)


# --------------------------------------------------------------------------- scanning trees


def scan_commit(repo: Repo, commit: str, config: ParityConfig) -> dict[str, cppscan.FileScan]:
    """The arch switches and tables of every file of ``commit`` the audit reads (two git processes)."""
    blobs = {path: blob for path, blob in gitbulk.tree_blobs(repo, commit).items() if config.matches(path)}
    texts = gitbulk.read_blobs(repo, blobs.values())
    return {path: cppscan.scan(path, texts[blob]) for path, blob in blobs.items() if blob in texts}


def merged_counts(scans: Iterable[cppscan.FileScan]) -> dict[Key, Counter[str]]:
    out: dict[Key, Counter[str]] = {}
    for scan in scans:
        for key, counter in scan.counts().items():
            out.setdefault(key, Counter()).update(counter)
    return out


def compare(
    upstream: Mapping[Key, Counter[str]],
    patched: Mapping[Key, Counter[str]],
    blame: Mapping[tuple[str, str, str, str], str],
    allowlist: Sequence[Allowed],
) -> tuple[tuple[Dropped, ...], tuple[Allowed, ...]]:
    """Drops (upstream count above the patched count), with their blamed patch and allowlist reason;
    and the allowlist entries that match no drop."""
    reasons = {a.key(): a.reason for a in allowlist}
    dropped: list[Dropped] = []
    for key in sorted(upstream):
        kind, file, scope = key
        after = patched.get(key, Counter())
        for case, count in sorted(upstream[key].items()):
            lost = count - after.get(case, 0)
            if lost > 0:
                full = (kind, file, scope, case)
                dropped.append(Dropped(kind, file, scope, case, lost, blame.get(full), reasons.get(full)))
    matched = {(d.kind, d.file, d.scope, d.case) for d in dropped}
    stale = tuple(a for a in allowlist if a.key() not in matched)
    return tuple(dropped), stale


# --------------------------------------------------------------------------- the queue's deletions and boundaries


def analyse_step(
    repo: Repo,
    prev: str,
    commit: str,
    *,
    label: str,
    order: Sequence[str],
    lines: LineMap,
    diff: str | None = None,
) -> tuple[list[Deletion], BoundaryWarning | None]:
    """The upstream deletions of one patch (``prev..commit``) and whether it only rewrites queue lines;
    ``lines`` (at ``prev``) tells upstream lines from the queue's, and is moved on to ``commit``.
    ``order``: the labels of the queue's patches, in order; ``diff``: the step's ``-U0`` diff when
    the caller has it (:func:`step_diffs`), else it is asked of git."""
    hunks, no_text = parse_hunks(diff if diff is not None else repo.git(*STEP_DIFF, prev, commit).stdout)
    by_file: dict[str, list[Hunk]] = {}
    for hunk in hunks:
        by_file.setdefault(hunk.file, []).append(hunk)
    deletions: list[Deletion] = []
    territory = bool(hunks) and not no_text  # so far, the patch only touches lines the queue introduced
    introducers: list[str] = []
    for path, file_hunks in by_file.items():
        if any(h.new_file for h in file_hunks):
            territory = False
            continue
        owners = lines.owners(prev, path)
        for h in file_hunks:
            deletion, span, queue_only = _judge_hunk(h, owners, label=label, path=path)
            if deletion is not None:
                deletions.append(deletion)
            territory = territory and queue_only
            introducers += [_owner(owners, n) or "" for n in span]
    lines.advance(prev, commit, hunks, no_text, label=label)
    warning = _boundary_warning(label, order, introducers, sorted(by_file)) if territory else None
    return deletions, warning


def _owner(owners: Sequence[Owner], line: int) -> Owner:
    return owners[line - 1] if 1 <= line <= len(owners) else None


def _judge_hunk(h: Hunk, owners: Sequence[Owner], *, label: str, path: str) -> tuple[Deletion | None, list[int], bool]:
    """One hunk against the owners of its file's old lines: the upstream lines it deletes (if any), the
    old lines whose introducing patches it answers for, and whether those lines all come from the queue."""
    if h.old_count > 0:
        span = list(range(h.old_start, h.old_start + h.old_count))
        upstream = [n for n in span if not _owner(owners, n)]
        if not upstream:
            return None, span, True
        texts = [h.removed[n - h.old_start] for n in upstream[:3] if n - h.old_start < len(h.removed)]
        return Deletion(label, path, h.old_start, h.old_count, len(upstream), tuple(texts)), span, False
    near = [n for n in (h.old_start, h.old_start + 1) if 1 <= n <= len(owners)]  # the lines around an insertion
    queue_only = bool(near) and all(_owner(owners, n) for n in near)
    return None, near, queue_only


def _boundary_warning(
    label: str, order: Sequence[str], introducers: Sequence[str], files: Sequence[str]
) -> BoundaryWarning | None:
    """The warning for a patch that only rewrites queue lines, naming the patches that introduced them."""
    rank = {name: i for i, name in enumerate(dict.fromkeys(order))}
    names = sorted({i for i in introducers if i}, key=rank.__getitem__)
    return BoundaryWarning(label, tuple(names), tuple(files)) if names else None


# --------------------------------------------------------------------------- the audit


def step_diffs(repo: Repo, steps: Sequence[tuple[str, str]]) -> list[str]:
    """The ``-U0`` diff of every step ``(prev, commit)``, with full blob ids, in one git process."""
    return gitbulk.step_diffs(repo, steps, *STEP_DIFF[1:])


#: the patches whose files are read in one git process: enough to spare the processes, few enough
#: that a queue editing one large file many times does not hold every version of it at once
_READ_AHEAD = 32


def audit(
    repo: Repo, replayed: Replay, config: ParityConfig, allowlist: Sequence[Allowed], *, upstream_sha: str
) -> ParityReport:
    """Compare the arch cases of ``replayed.base`` and ``replayed.patched``, patch by patch.

    The whole walk asks git a handful of questions, whatever the number of patches: the base's
    files, every step's diff (one ``diff-tree --stdin``) and the files those diffs name, read
    :data:`_READ_AHEAD` patches at a time (one ``cat-file --batch`` each)."""
    state = scan_commit(repo, replayed.base, config)
    upstream_summary = Summary.of(state)
    upstream_counts = merged_counts(state.values())
    blame: dict[tuple[str, str, str, str], str] = {}
    order = [patch.label for patch, _commit in replayed.steps]
    lines = LineMap(repo)
    deletions: list[Deletion] = []
    warnings: list[BoundaryWarning] = []
    chain: list[tuple[str, str]] = []
    for _patch, commit in replayed.steps:
        chain.append((chain[-1][1] if chain else replayed.base, commit))
    diffs = step_diffs(repo, chain)
    blobs = [gitbulk.diff_files(diff) for diff in diffs]
    met: set[str] = set()  # the files whose upstream text the line map has been given
    texts: dict[str, str] = {}
    for at, ((patch, commit), (prev, _), diff) in enumerate(zip(replayed.steps, chain, diffs, strict=True)):
        if at % _READ_AHEAD == 0:
            texts = gitbulk.read_blobs(repo, _wanted(blobs[at : at + _READ_AHEAD], config, met))
        for path, change in blobs[at].items():
            if path not in met:
                met.add(path)
                lines.prime(path, texts.get(change.old))
            if config.matches(path):
                _rescan(state, blame, path, texts.get(change.new), label=patch.label)
        found, warning = analyse_step(repo, prev, commit, label=patch.label, order=order, lines=lines, diff=diff)
        deletions += found
        if warning is not None:
            warnings.append(warning)
    dropped, stale = compare(upstream_counts, merged_counts(state.values()), blame, allowlist)
    return ParityReport(
        upstream_sha=upstream_sha,
        upstream=upstream_summary,
        patched=Summary.of(state),
        dropped=dropped,
        stale_allowlist=stale,
        deletions=tuple(deletions),
        boundary=tuple(warnings),
        patches=len(replayed.steps),
    )


def _rescan(
    state: dict[str, cppscan.FileScan],
    blame: dict[tuple[str, str, str, str], str],
    path: str,
    text: str | None,
    *,
    label: str,
) -> None:
    """Scan ``path`` again after patch ``label`` changed it to ``text`` (None: deleted); blame the
    patch for every arch case the file lost."""
    before = state.get(path)
    after = cppscan.scan(path, text) if text is not None else None
    old_counts = before.counts() if before else {}
    new_counts = after.counts() if after else {}
    for key, counter in old_counts.items():
        for case, count in counter.items():
            if new_counts.get(key, Counter()).get(case, 0) < count:
                blame[(*key, case)] = label
    if after is None:
        state.pop(path, None)
    else:
        state[path] = after


def _wanted(steps: Sequence[Mapping[str, gitbulk.FileChange]], config: ParityConfig, met: set[str]) -> list[str]:
    """The blobs a run of steps reads: each audited file's new version, and the upstream version of
    each file the line map meets for the first time."""
    wanted: list[str] = []
    seen = set(met)
    for step in steps:
        for path, change in step.items():
            if path not in seen:
                seen.add(path)
                wanted.append(change.old)
            if config.matches(path):
                wanted.append(change.new)
    return wanted


def run_parity(
    settings: Settings, *, console: Console, checkout: Path | None = None, offline: bool = False
) -> ParityReport:
    """``invoke parity``: load the queue, replay it on the pin aside, audit it."""
    from skippy.maintain.replay import pinned_store, replay
    from skippy.queue.model import load_queue

    config = ParityConfig.from_settings(settings)
    allowlist = load_allowlist(config.allowlist, inside=settings.root)
    queue = load_queue(settings.patch_dir)
    with pinned_store(settings, console=console, checkout=checkout, offline=offline) as store:
        with console.step(f"replay the queue ({len(queue.patches)} patches) on {store.upstream_sha[:12]}"):
            replayed = replay(settings, store.repo, store.base, queue, console=console)
        with console.step("parity audit"):
            return audit(store.repo, replayed, config, allowlist, upstream_sha=store.upstream_sha)


def failure(report: ParityReport, settings: Settings) -> ParityFailed:
    config = ParityConfig.from_settings(settings)
    return ParityFailed(
        f"the queue drops {len(report.failures)} arch case(s) that the allowlist does not name",
        details="\n".join(d.render() for d in report.failures),
        untouched="everything: the queue was applied in a temporary worktree only",
        next_step="restore the cases in the patches named above, or list each drop with a reason in "
        f"{settings.relative(config.allowlist)} ([[dropped]] file, function, case, reason)",
        report=report,
    )
