"""What ``invoke parity`` reports: both sides' arch cases, the drops, the upstream deletions, the boundary warnings.

Each part renders itself as text and as the ``--json`` report's dictionary: the arch switches
and tables counted per side (:class:`Summary`), the arch cases the queue drops with the patch
blamed and the allowlist's reason (:class:`Dropped`), the hunks that delete upstream lines
(:class:`Deletion`), and the patches that only rewrite lines earlier patches introduced
(:class:`BoundaryWarning`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skippy.maintain import cppscan
from skippy.maintain.parity_config import Allowed


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
