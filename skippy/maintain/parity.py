"""``invoke parity``: the queue must not silently drop arch cases.

For every switch over ``LLM_ARCH_*`` (per enclosing function) and every table
keyed by ``LLM_ARCH_*`` in the configured files, the arch cases of the
upstream tree are compared with those of the patched tree.  Every case the
queue drops must be listed, with a reason, in the allowlist beside the queue
(``<patch_dir>/parity-allowlist.toml``), or the audit fails, naming the
file, the function (or table), the case and the patch that dropped it (the
queue is applied patch by patch and each step is rescanned).

The same walk lists every hunk of the queue that deletes upstream lines
(not lines an earlier patch of the queue added; ``git blame <pin>..``
tells them apart), and the boundary lint warns about patches that only
rewrite lines earlier patches introduced (a clean-up that belongs folded
into the patches it fixes).

The configuration (``[tool.skippy.parity]``: the files to scan, where the
allowlist lives) and the allowlist itself are read by ``parity_config``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.errors import QueueError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppscan
from skippy.maintain.parity_config import (
    DEFAULT_ALLOWLIST,
    DEFAULT_FILES,
    Allowed,
    ParityConfig,
    glob_match,
    load_allowlist,
)
from skippy.queue.replay import Replay, changed_files, read_text, tracked_files

# the module's public names; the configuration's (from parity_config) are re-exported for their callers
__all__ = [
    "DEFAULT_ALLOWLIST",
    "DEFAULT_FILES",
    "Allowed",
    "BoundaryWarning",
    "Deletion",
    "Dropped",
    "Hunk",
    "Key",
    "ParityConfig",
    "ParityFailed",
    "ParityReport",
    "Summary",
    "analyse_step",
    "audit",
    "blame_lines",
    "compare",
    "failure",
    "glob_match",
    "load_allowlist",
    "merged_counts",
    "parse_hunks",
    "run_parity",
    "scan_commit",
]

Key = tuple[str, str, str]  # (kind, file, scope)


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Summary:
    files: int
    switches: int
    cases: int
    tables: int
    entries: int
    #: per file: (switches, cases, tables, entries)
    per_file: Mapping[str, tuple[int, int, int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, scans: Mapping[str, cppscan.FileScan]) -> Summary:
        per = {
            p: (len(s.switches), s.case_count, len(s.tables), s.entry_count)
            for p, s in sorted(scans.items())
            if s.switches or s.tables
        }
        return cls(
            files=len(scans),
            switches=sum(v[0] for v in per.values()),
            cases=sum(v[1] for v in per.values()),
            tables=sum(v[2] for v in per.values()),
            entries=sum(v[3] for v in per.values()),
            per_file=per,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "switches": self.switches,
            "cases": self.cases,
            "tables": self.tables,
            "entries": self.entries,
            "per_file": {
                p: dict(zip(("switches", "cases", "tables", "entries"), v, strict=True))
                for p, v in self.per_file.items()
            },
        }

    def line(self) -> str:
        return (
            f"{self.switches} arch switches ({self.cases} cases), {self.tables} arch tables "
            f"({self.entries} entries) in {self.files} files"
        )


@dataclass(frozen=True)
class Dropped:
    kind: str
    file: str
    scope: str
    case: str
    lost: int
    patch: str | None
    reason: str | None = None  # from the allowlist

    @property
    def allowed(self) -> bool:
        return self.reason is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "file": self.file,
            ("function" if self.kind == "switch" else "table"): self.scope,
            "case": self.case,
            "lost": self.lost,
            "patch": self.patch,
            "allowed": self.allowed,
            "reason": self.reason,
        }

    def render(self) -> str:
        where = f"{self.file} {'function' if self.kind == 'switch' else 'table'} {self.scope}"
        by = f" (dropped by {self.patch})" if self.patch else ""
        times = f" x{self.lost}" if self.lost > 1 else ""
        tail = f"  allowed: {self.reason}" if self.reason else ""
        return f"{where}: {self.case}{times}{by}{tail}"


@dataclass(frozen=True)
class Hunk:
    file: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    removed: tuple[str, ...]
    new_file: bool = False


@dataclass(frozen=True)
class Deletion:
    patch: str
    file: str
    old_start: int
    old_count: int
    upstream_lines: int
    preview: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "file": self.file,
            "old_start": self.old_start,
            "old_count": self.old_count,
            "upstream_lines": self.upstream_lines,
            "preview": list(self.preview),
        }

    def render(self) -> str:
        span = f"{self.old_start},{self.old_count}"
        lines = [f"{self.patch}: {self.file} -{span}: {self.upstream_lines} upstream line(s) deleted"]
        lines += [f"      -{text}" for text in self.preview]
        return "\n".join(lines)


@dataclass(frozen=True)
class BoundaryWarning:
    patch: str
    introduced_by: tuple[str, ...]
    files: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"patch": self.patch, "introduced_by": list(self.introduced_by), "files": list(self.files)}

    def render(self) -> str:
        into = "that patch" if len(self.introduced_by) == 1 else "those patches"
        return (
            f"{self.patch} only rewrites lines that {', '.join(self.introduced_by)} introduced "
            f"({', '.join(self.files)}): fold it into {into}"
        )


@dataclass(frozen=True)
class ParityReport:
    upstream_sha: str
    upstream: Summary
    patched: Summary
    dropped: tuple[Dropped, ...]
    stale_allowlist: tuple[Allowed, ...]
    deletions: tuple[Deletion, ...]
    boundary: tuple[BoundaryWarning, ...]
    patches: int

    @property
    def failures(self) -> tuple[Dropped, ...]:
        return tuple(d for d in self.dropped if not d.allowed)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "upstream_sha": self.upstream_sha,
            "patches": self.patches,
            "upstream": self.upstream.as_dict(),
            "patched": self.patched.as_dict(),
            "dropped": [d.as_dict() for d in self.dropped],
            "unlisted_drops": len(self.failures),
            "stale_allowlist": [a.as_dict() for a in self.stale_allowlist],
            "deletions": [d.as_dict() for d in self.deletions],
            "boundary_warnings": [b.as_dict() for b in self.boundary],
        }

    def render(self) -> str:
        lines = [
            f"parity against upstream {self.upstream_sha[:12]} ({self.patches} patch(es) in the queue)",
            f"  upstream: {self.upstream.line()}",
            f"  patched:  {self.patched.line()}",
        ]
        if self.failures:
            lines.append(f"arch cases dropped without an allowlist entry ({len(self.failures)}):")
            lines += ["  " + d.render() for d in self.failures]
        allowed = [d for d in self.dropped if d.allowed]
        if allowed:
            lines.append(f"arch cases dropped on purpose ({len(allowed)}):")
            lines += ["  " + d.render() for d in allowed]
        if self.stale_allowlist:
            lines.append("allowlist entries that no longer match a drop (remove them):")
            lines += [f"  {a.file} {a.scope}: {a.case}" for a in self.stale_allowlist]
        if self.deletions:
            lines.append(f"hunks deleting upstream lines ({len(self.deletions)}):")
            lines += ["  " + d.render() for d in self.deletions]
        else:
            lines.append("no hunk of the queue deletes upstream lines")
        for warning in self.boundary:
            lines.append("warning: " + warning.render())
        lines.append("parity: ok" if self.ok else f"parity: FAILED ({len(self.failures)} unlisted drop(s))")
        return "\n".join(lines)


# --------------------------------------------------------------------------- scanning trees


def scan_commit(repo: Repo, commit: str, config: ParityConfig) -> dict[str, cppscan.FileScan]:
    scans: dict[str, cppscan.FileScan] = {}
    for path in tracked_files(repo, commit):
        if config.matches(path):
            text = read_text(repo, commit, path)
            if text is not None:
                scans[path] = cppscan.scan(path, text)
    return scans


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


# --------------------------------------------------------------------------- hunks and blame

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_hunks(diff: str) -> tuple[list[Hunk], set[str]]:
    """Hunks of a ``git diff -U0`` (removed lines kept) and the files that have no text hunks."""
    hunks: list[Hunk] = []
    no_text: set[str] = set()
    file = ""
    new_file = False
    current: dict[str, Any] | None = None
    seen_hunk: dict[str, bool] = {}

    def flush() -> None:
        nonlocal current
        if current is not None:
            hunks.append(Hunk(removed=tuple(current.pop("removed")), **current))
            current = None

    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            flush()
            m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
            file = m.group(1) if m else line
            new_file = False
            seen_hunk[file] = False
        elif current is None and line.startswith("new file mode"):
            new_file = True
        elif current is None and line.startswith("+++ ") and line != "+++ /dev/null":
            file = line[len("+++ b/") :] if line.startswith("+++ b/") else file
        elif line.startswith("@@"):
            flush()
            m = _HUNK.match(line)
            if m is None:
                continue
            seen_hunk[file] = True
            current = {
                "file": file,
                "old_start": int(m.group(1)),
                "old_count": int(m.group(2)) if m.group(2) is not None else 1,
                "new_start": int(m.group(3)),
                "new_count": int(m.group(4)) if m.group(4) is not None else 1,
                "removed": [],
                "new_file": new_file,
            }
        elif current is not None and line.startswith("-"):
            current["removed"].append(line[1:])
    flush()
    no_text.update(f for f, seen in seen_hunk.items() if not seen)
    return hunks, no_text


def blame_lines(repo: Repo, since: str, commit: str, path: str, ranges: Sequence[tuple[int, int]]) -> dict[int, str]:
    """line number in ``commit:path`` -> commit that introduced it, for commits after ``since``
    (lines older than ``since`` map to ""), for the given (start, end) ranges."""
    if not ranges or since == commit:
        return {}  # nothing of the queue before this patch: every line is upstream's
    args: list[str] = []
    for start, end in ranges:
        args += ["-L", f"{start},{end}"]
    out = repo.git("blame", "--porcelain", *args, f"{since}..{commit}", "--", path).stdout
    owner: dict[int, str] = {}
    boundary: set[str] = set()
    last: str | None = None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]{40}) \d+ (\d+)(?: \d+)?$", line)
        if m:
            last = m.group(1)
            owner[int(m.group(2))] = last
        elif line == "boundary" and last is not None:
            boundary.add(last)
    return {n: ("" if sha in boundary else sha) for n, sha in owner.items()}


def _line_count(repo: Repo, commit: str, path: str) -> int:
    text = read_text(repo, commit, path)
    return 0 if text is None else len(text.splitlines())


def analyse_step(
    repo: Repo, base: str, prev: str, commit: str, *, label: str, labels: Mapping[str, str]
) -> tuple[list[Deletion], BoundaryWarning | None]:
    """The upstream deletions of one patch (``prev..commit``) and whether it only rewrites queue lines."""
    diff = repo.git("diff", "-U0", "--no-renames", "--no-ext-diff", "--no-color", "--no-textconv", prev, commit).stdout
    hunks, no_text = parse_hunks(diff)
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
        length = _line_count(repo, prev, path)
        owners = blame_lines(repo, base, prev, path, _blame_ranges(file_hunks, length))
        for h in file_hunks:
            deletion, lines, queue_only = _judge_hunk(h, owners, length, label=label, path=path)
            if deletion is not None:
                deletions.append(deletion)
            territory = territory and queue_only
            introducers += [labels.get(owners.get(n, ""), "") for n in lines]
    warning = _boundary_warning(label, labels, introducers, sorted(by_file)) if territory else None
    return deletions, warning


def _blame_ranges(hunks: Sequence[Hunk], length: int) -> list[tuple[int, int]]:
    """The old lines to blame for a file's hunks: the lines each removes, or those around a pure insertion."""
    ranges: list[tuple[int, int]] = []
    for h in hunks:
        if h.old_count > 0:
            ranges.append((h.old_start, h.old_start + h.old_count - 1))
        else:
            lo, hi = max(1, h.old_start), min(length, h.old_start + 1)
            if lo <= hi:
                ranges.append((lo, hi))
    return _merge_ranges(ranges)


def _judge_hunk(
    h: Hunk, owners: Mapping[int, str], length: int, *, label: str, path: str
) -> tuple[Deletion | None, list[int], bool]:
    """One hunk against the blame of its old lines: the upstream lines it deletes (if any), the old lines
    whose introducing patches it answers for, and whether those lines all come from the queue."""
    if h.old_count > 0:
        span = list(range(h.old_start, h.old_start + h.old_count))
        upstream = [n for n in span if not owners.get(n)]
        if not upstream:
            return None, span, True
        texts = [h.removed[n - h.old_start] for n in upstream[:3] if n - h.old_start < len(h.removed)]
        return Deletion(label, path, h.old_start, h.old_count, len(upstream), tuple(texts)), span, False
    near = [n for n in (h.old_start, h.old_start + 1) if 1 <= n <= length]
    queue_only = bool(near) and all(owners.get(n) for n in near)
    return None, near, queue_only


def _boundary_warning(
    label: str, labels: Mapping[str, str], introducers: Sequence[str], files: Sequence[str]
) -> BoundaryWarning | None:
    """The warning for a patch that only rewrites queue lines, naming the patches that introduced them."""
    order = list(dict.fromkeys(labels.values()))
    names = sorted({i for i in introducers if i}, key=order.index)
    return BoundaryWarning(label, tuple(names), tuple(files)) if names else None


def _merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


# --------------------------------------------------------------------------- the audit


def audit(
    repo: Repo, replayed: Replay, config: ParityConfig, allowlist: Sequence[Allowed], *, upstream_sha: str
) -> ParityReport:
    """Compare the arch cases of ``replayed.base`` and ``replayed.patched``, patch by patch."""
    state = scan_commit(repo, replayed.base, config)
    upstream_summary = Summary.of(state)
    upstream_counts = merged_counts(state.values())
    blame: dict[tuple[str, str, str, str], str] = {}
    labels = {commit: patch.label for patch, commit in replayed.steps}
    deletions: list[Deletion] = []
    warnings: list[BoundaryWarning] = []
    prev = replayed.base
    for patch, commit in replayed.steps:
        for path in changed_files(repo, prev, commit):
            if not config.matches(path):
                continue
            before = state.get(path)
            text = read_text(repo, commit, path)
            after = cppscan.scan(path, text) if text is not None else None
            old = before.counts() if before else {}
            new = after.counts() if after else {}
            for key, counter in old.items():
                for case, count in counter.items():
                    if new.get(key, Counter()).get(case, 0) < count:
                        blame[(*key, case)] = patch.label
            if after is None:
                state.pop(path, None)
            else:
                state[path] = after
        found, warning = analyse_step(repo, replayed.base, prev, commit, label=patch.label, labels=labels)
        deletions += found
        if warning is not None:
            warnings.append(warning)
        prev = commit
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


def run_parity(
    settings: Settings, *, console: Console, checkout: Path | None = None, offline: bool = False
) -> ParityReport:
    """``invoke parity``: load the queue, replay it on the pin aside, audit it."""
    from skippy.queue.model import load_queue
    from skippy.queue.replay import pinned_store, replay

    config = ParityConfig.from_settings(settings)
    allowlist = load_allowlist(config.allowlist, inside=settings.root)
    queue = load_queue(settings.patch_dir)
    with pinned_store(settings, console=console, checkout=checkout, offline=offline) as store:
        with console.step(f"replay the queue ({len(queue.patches)} patches) on {store.upstream_sha[:12]}"):
            replayed = replay(settings, store.repo, store.base, queue, console=console)
        with console.step("parity audit"):
            return audit(store.repo, replayed, config, allowlist, upstream_sha=store.upstream_sha)


class ParityFailed(QueueError):
    """The audit found drops the allowlist does not name; carries the report."""

    report: ParityReport | None = None

    def as_dict(self) -> dict[str, object]:
        data = super().as_dict()
        if self.report is not None:
            data["parity"] = self.report.as_dict()
        return data


def failure(report: ParityReport, settings: Settings) -> ParityFailed:
    config = ParityConfig.from_settings(settings)
    error = ParityFailed(
        f"the queue drops {len(report.failures)} arch case(s) that the allowlist does not name",
        details="\n".join(d.render() for d in report.failures),
        untouched="everything: the queue was applied in a temporary worktree only",
        next_step="restore the cases in the patches named above, or list each drop with a reason in "
        f"{settings.relative(config.allowlist)} ([[dropped]] file, function, case, reason)",
    )
    error.report = report
    return error
