"""``invoke summary OLD NEW``: what upstream changed between two commits, as pull-request Markdown.

Sections: the commit list (with links when the upstream is on GitHub), the
diffstat, counts per area, "review these": the functions, types and tables each
patch changes that upstream changed too, and what upstream did there
(:mod:`skippy.maintain.churn`), and the bump risk: the files the queue touches
crossed with the files upstream changed (which patches are exposed, by which
upstream commits).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.core.git import Repo
from skippy.maintain.churn import ChurnMap, churn_map
from skippy.maintain.upstream_log import UpstreamCommit, upstream_commits
from skippy.queue.imports import upstream_of
from skippy.queue.model import Queue
from skippy.queue.triage import touched_paths

#: area -> path patterns (fnmatch; a trailing / means "anything below").  Each backend's own
#: area comes from its registry entry (``BackendSpec.upstream_areas``), passed in by the flows:
#: queue maintenance never imports the build
CORE_AREAS: Final[Mapping[str, tuple[str, ...]]] = {
    "runtime": ("src/", "include/", "common/", "tools/server/"),
    "GGUF": ("gguf-py/", "ggml/src/gguf.cpp", "ggml/include/gguf.h"),
}
AREAS: Final[Mapping[str, tuple[str, ...]]] = {
    "tokenizer": ("src/llama-vocab.*", "src/unicode*", "models/ggml-vocab-*"),
    "build": ("CMakeLists.txt", "*/CMakeLists.txt", "cmake/", "*.cmake", "Makefile", ".github/", "ci/"),
    "tests": ("tests/",),
}


def in_area(path: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        if pattern.endswith("/"):
            if path.startswith(pattern):
                return True
        elif fnmatch.fnmatchcase(path, pattern):
            return True
    return False


@dataclass(frozen=True)
class Exposure:
    patch: str
    files: tuple[str, ...]
    commits: tuple[UpstreamCommit, ...]


@dataclass(frozen=True)
class Summary:
    old: str
    new: str
    commits: tuple[UpstreamCommit, ...]
    shortstat: str
    top_files: tuple[tuple[str, int], ...]
    areas: Mapping[str, int]
    exposures: tuple[Exposure, ...] = field(default=())
    link_base: str | None = None
    #: why the commit list (and the counts per area) are not given, when they are not: a side
    #: known here only from its source archive has no upstream history
    no_history: str | None = None
    #: the map by function (None when it was not asked for)
    churn: ChurnMap | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "commits": None
            if self.no_history
            else [{"sha": c.sha, "subject": c.subject, "paths": list(c.paths)} for c in self.commits],
            "commits_unavailable": self.no_history,
            "diffstat": self.shortstat,
            "top_files": [{"path": p, "lines": n} for p, n in self.top_files],
            "areas": dict(self.areas),
            "exposed_patches": [
                {"patch": e.patch, "files": list(e.files), "commits": [c.sha for c in e.commits]}
                for e in self.exposures
            ],
            "churn": self.churn.as_dict() if self.churn else None,
        }

    def _link(self, sha: str) -> str:
        if self.link_base:
            return f"[`{sha[:12]}`]({self.link_base}/commit/{sha})"
        return f"`{sha[:12]}`"

    def markdown(self) -> str:
        out = [f"## llama.cpp {self.old[:12]} → {self.new[:12]}", ""]
        if self.link_base:
            out += [f"Compare: {self.link_base}/compare/{self.old}...{self.new}", ""]
        if self.no_history:
            out += ["### Upstream commits", "", f"Unavailable: {self.no_history}.", ""]
        else:
            out += [f"### Upstream commits ({len(self.commits)})", ""]
            out += [f"- {self._link(c.sha)} {c.subject}" for c in self.commits] or ["(none)"]
            out.append("")
        out += ["### Diffstat", "", self.shortstat or "(no changes)", ""]
        if self.top_files:
            out += ["| file | lines changed |", "| --- | ---: |"]
            out += [f"| `{p}` | {n} |" for p, n in self.top_files]
            out.append("")
        if not self.no_history:
            out += ["### Commits per area", "", "| area | commits |", "| --- | ---: |"]
            out += [f"| {area} | {n} |" for area, n in self.areas.items()]
            out.append("")
        if self.churn is not None:
            out += [*self.churn.markdown(self._link), ""]
        out += ["### Bump risk (by file)", ""]
        if not self.exposures:
            out.append("No file the queue touches changed upstream.")
        for e in self.exposures:
            files = ", ".join(f"`{f}`" for f in e.files)
            out.append(f"- **{e.patch}** is exposed through {files}" + (":" if e.commits else ""))
            out += [f"  - {self._link(c.sha)} {c.subject}" for c in e.commits]
        return "\n".join(out) + "\n"


def github_base(url: str) -> str | None:
    """``https://github.com/org/repo`` for a GitHub clone URL, else None."""
    match = re.match(r"^(?:https://|git@|ssh://git@)github\.com[:/]([^/]+)/([^/]+?)(?:\.git)?/?$", url)
    return f"https://github.com/{match[1]}/{match[2]}" if match else None


def summarize(
    repo: Repo,
    old: str,
    new: str,
    queue: Queue,
    *,
    upstream_url: str,
    top: int = 15,
    backend_areas: Mapping[str, tuple[str, ...]] | None = None,
    scratch: Path | None = None,
) -> Summary:
    """The summary of ``old..new`` (local commits; ``old`` an ancestor of ``new``, unless one of them is
    the import of a source archive: then there is no history between them, and the summary gives the
    diffstat between the two trees and says its commit list is unavailable).

    The summary names the upstream SHAs the commits stand for (an import's ``Upstream-Commit``), and
    its commit list holds upstream commits only: never the queue's own (``Skippy-Patch`` trailer) nor
    an archive import.  ``backend_areas`` are the backends' own areas (from the build's registry),
    counted after the runtime's and GGUF's.  With ``scratch`` (a private directory for a temporary
    index), the summary holds the map by function too (:func:`skippy.maintain.churn.churn_map`)."""
    old_up, new_up = upstream_of(repo, old), upstream_of(repo, new)
    no_history = _archive_only(old_up, new_up)
    commits = [] if no_history else upstream_commits(repo, old, new)
    shortstat = repo.git("diff", "--shortstat", old, new).stdout.strip()
    sizes = _lines_changed(repo, old, new)
    every = {**CORE_AREAS, **(backend_areas or {}), **AREAS}
    areas = {area: sum(1 for c in commits if any(in_area(p, pats) for p in c.paths)) for area, pats in every.items()}
    # without history, the files that differ between the two trees are what upstream changed
    changed = {p for p, _n in sizes} if no_history else {p for c in commits for p in c.paths}
    exposures = _exposures(queue, commits, changed)
    churn = None if scratch is None else churn_map(repo, queue, old, new, scratch=scratch, history=not no_history)
    return Summary(
        old=old_up or old,
        new=new_up or new,
        commits=tuple(commits),
        shortstat=shortstat,
        top_files=tuple(sizes[:top]),
        areas=areas,
        exposures=exposures,
        link_base=github_base(upstream_url),
        no_history=no_history,
        churn=churn,
    )


def _archive_only(old_up: str | None, new_up: str | None) -> str | None:
    """Why there is no commit list: the upstream SHAs of the sides known only from a source archive
    (None: both sides are upstream history)."""
    only = [sha[:12] for sha in (old_up, new_up) if sha is not None]
    if not only:
        return None
    return (
        f"{' and '.join(only)} {'is' if len(only) == 1 else 'are'} known here only from "
        f"{'its' if len(only) == 1 else 'their'} source archive{'s' if len(only) > 1 else ''}, without upstream "
        "history (run where the upstream answers, or point LLAMA_UPSTREAM_URL at a mirror, for the commit list)"
    )


def _lines_changed(repo: Repo, old: str, new: str) -> list[tuple[str, int]]:
    """``(path, lines added + deleted)`` of every file that differs, the largest first (binary: 0)."""
    sizes: list[tuple[str, int]] = []
    for line in repo.git("diff", "--numstat", "--no-renames", old, new).stdout.splitlines():
        added, _, rest = line.partition("\t")
        deleted, _, path = rest.partition("\t")
        lines = (int(added) if added.isdigit() else 0) + (int(deleted) if deleted.isdigit() else 0)
        sizes.append((path, lines))
    sizes.sort(key=lambda item: (-item[1], item[0]))
    return sizes


def _exposures(queue: Queue, commits: Sequence[UpstreamCommit], changed: set[str]) -> tuple[Exposure, ...]:
    """The bump risk: each patch that touches a file upstream changed, with those files and the
    upstream commits that changed them."""
    exposures: list[Exposure] = []
    for patch in queue.patches:
        files = tuple(sorted(set(touched_paths(patch)) & changed))
        if files:
            by = tuple(c for c in commits if set(c.paths) & set(files))
            exposures.append(Exposure(patch.label, files, by))
    return tuple(exposures)
