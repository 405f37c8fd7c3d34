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
allowlist lives) and the allowlist itself are read by ``parity_config``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core import gitbulk
from skippy.core.errors import ParityFailed
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
from skippy.maintain.replay import Replay, read_text

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
    "LineMap",
    "Owner",
    "ParityConfig",
    "ParityReport",
    "Summary",
    "analyse_step",
    "audit",
    "carry_owners",
    "compare",
    "failure",
    "glob_match",
    "line_count",
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
    deleted_file: bool = False
    #: the body, one character a line: "-" removed, "+" added, " " context
    ops: str = ""


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


# --------------------------------------------------------------------------- hunks and the line map

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

#: the diff of one patch step: every hunk without context, no rename pairing, no external programs
_STEP_DIFF = ("diff", "-U0", "--no-renames", "--no-ext-diff", "--no-color", "--no-textconv")

#: who added a line: None for upstream, else the label of the queue patch that added it
Owner = str | None


def parse_hunks(diff: str) -> tuple[list[Hunk], set[str]]:
    """Hunks of a ``git diff -U0`` (removed lines kept) and the files that have no text hunks."""
    hunks: list[Hunk] = []
    no_text: set[str] = set()
    file = ""
    marks: set[str] = set()  # "new", "deleted": the file's header says "new file mode" or "deleted file mode"
    current: dict[str, Any] | None = None
    left = [0, 0]  # old and new lines the current hunk has still to show
    seen_hunk: dict[str, bool] = {}

    def flush() -> None:
        nonlocal current
        if current is not None:
            hunks.append(Hunk(removed=tuple(current.pop("removed")), ops="".join(current.pop("ops")), **current))
            current = None

    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            flush()
            m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
            file = m.group(1) if m else line
            marks = set()
            seen_hunk[file] = False
        elif current is None and line.startswith(("new file mode", "deleted file mode")):
            marks.add(line.split(" ", 1)[0])
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
                "ops": [],
                "new_file": "new" in marks,
                "deleted_file": "deleted" in marks,
            }
            left = [current["old_count"], current["new_count"]]
        elif current is not None:
            _body_line(line, current, left)
    flush()
    no_text.update(f for f, seen in seen_hunk.items() if not seen)
    return hunks, no_text


def _body_line(line: str, current: dict[str, Any], left: list[int]) -> None:
    """One line of a hunk's body: every "-" line is a removed line; ``ops`` follows the body within the
    old and new lines the header announced (``left``, counted down): a "\\ No newline" line or the end
    of the diff is no line."""
    ops: list[str] = current["ops"]
    if line.startswith("-"):
        current["removed"].append(line[1:])
    if line.startswith("-") and left[0] > 0:
        ops.append("-")
        left[0] -= 1
    elif line.startswith("+") and left[1] > 0:
        ops.append("+")
        left[1] -= 1
    elif (line == "" or line.startswith(" ")) and left[0] > 0 and left[1] > 0:
        ops.append(" ")  # context, shown when diff.interHunkContext joins two hunks
        left[0] -= 1
        left[1] -= 1


def line_count(text: str | None) -> int:
    """The lines of a file as git counts them (a last line without a newline counts)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def carry_owners(owners: Sequence[Owner], hunks: Sequence[Hunk], label: str) -> list[Owner]:
    """The owners of a file's lines after ``hunks`` (one file's, in order, old side against ``owners``):
    removed lines drop out, added lines belong to ``label``, the others keep their owner.

    Raises ValueError when the hunks do not fit the file ``owners`` describes."""
    out: list[Owner] = []
    at = 0  # old lines consumed
    for h in hunks:
        before = h.old_start if h.old_count == 0 else h.old_start - 1  # old lines before the hunk's first
        ops = h.ops or "-" * h.old_count + "+" * h.new_count
        if before < at or before + h.old_count > len(owners) or ops.count("+") + ops.count(" ") != h.new_count:
            raise ValueError(
                f"{h.file}: hunk -{h.old_start},{h.old_count} +{h.new_start},{h.new_count} does not fit "
                f"a file of {len(owners)} line(s) after line {at}"
            )
        out += owners[at:before]
        at = before
        if len(out) != (h.new_start - 1 if h.new_count else h.new_start):
            raise ValueError(f"{h.file}: hunk +{h.new_start},{h.new_count} lands after line {len(out)}")
        for op in ops:
            if op == " ":
                out.append(owners[at])
                at += 1
            elif op == "-":
                at += 1
            else:
                out.append(label)
    return out + list(owners[at:])


class LineMap:
    """Who added each line of the files the queue touches, patch after patch: None for an upstream
    line, else the label of the patch that added it (what ``git blame <pin>..`` answers, without
    walking the queue's history again for every patch).

    The map follows the patches in order (:meth:`advance`); a file is read once, when a patch first
    touches it (all its lines are upstream's then)."""

    def __init__(self, repo: Repo) -> None:
        self._repo = repo
        self._files: dict[str, list[Owner]] = {}

    def owners(self, commit: str, path: str) -> list[Owner]:
        """The owner of each line of ``path`` in ``commit``, the commit the map has reached (index 0: line 1)."""
        known = self._files.get(path)
        if known is None:
            known = [None] * line_count(read_text(self._repo, commit, path))
            self._files[path] = known
        return known

    def prime(self, path: str, text: str | None) -> None:
        """``path`` as upstream left it, when the map has not met it yet: its text, read by the caller
        (with other files' in one git process) rather than by :meth:`owners`."""
        if path not in self._files:
            self._files[path] = [None] * line_count(text)

    def advance(self, prev: str, commit: str, hunks: Sequence[Hunk], no_text: Iterable[str], *, label: str) -> None:
        """Move the map from ``prev`` to ``commit`` (the step of patch ``label``), given the hunks of
        ``git diff -U0 --no-renames prev commit`` and the files of that diff without text hunks."""
        by_file: dict[str, list[Hunk]] = {}
        for hunk in hunks:
            by_file.setdefault(hunk.file, []).append(hunk)
        binary = sorted(no_text)
        if binary:  # git blame reads every file as text: so does the map (empty and mode-only changes add nothing)
            extra, _ = parse_hunks(self._repo.git(*_STEP_DIFF, "--text", prev, commit, "--", *binary).stdout)
            for hunk in extra:
                by_file.setdefault(hunk.file, []).append(hunk)
        added = {p for p, hs in by_file.items() if any(h.new_file for h in hs)}
        gone = {p for p, hs in by_file.items() if any(h.deleted_file for h in hs)} - added
        carried: dict[str, list[Owner]] = {}
        for path, file_hunks in by_file.items():
            if path in gone:
                continue
            if path not in added:
                carried[path] = carry_owners(self.owners(prev, path), file_hunks, label)
                continue
            # a new file (or a new kind of file after the old one's deletion), or the file another
            # one was renamed to: git blame follows a file to a deleted one it looks like
            followed = self._followed(prev, commit, path, label) if gone else None
            carried[path] = (
                followed if followed is not None else carry_owners([], [h for h in file_hunks if h.new_file], label)
            )
        for path in gone:
            self._files.pop(path, None)
        self._files.update(carried)

    def _followed(self, prev: str, commit: str, path: str, label: str) -> list[Owner] | None:
        """The owners of ``path``, new in ``commit``, carried from the file of ``prev`` it was renamed
        from (found as git blame finds it: ``--follow``, rename detection for this path alone); None
        when it is no rename."""
        diff = self._repo.git(
            "diff",
            "-U0",
            "-M",
            "--follow",
            "--text",
            "--no-ext-diff",
            "--no-color",
            "--no-textconv",
            prev,
            commit,
            "--",
            path,
        ).stdout
        source = next(
            (line[len("rename from ") :] for line in diff.split("\n") if line.startswith("rename from ")), None
        )
        if source is None:
            return None
        hunks, _ = parse_hunks(diff)
        return carry_owners(self.owners(prev, source), [h for h in hunks if h.file == path], label)


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
    hunks, no_text = parse_hunks(diff if diff is not None else repo.git(*_STEP_DIFF, prev, commit).stdout)
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
    return gitbulk.step_diffs(repo, steps, *_STEP_DIFF[1:])


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
