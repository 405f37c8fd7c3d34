"""The upstream commits of a range, as every pin-move report lists them.

Non-merge commits only, without the queue's own commits (a ``Skippy-Patch``
trailer) and without this repository's imports of source archives (a commit that
only carries such trailers, as a test-bed built from source archives does, is
upstream history here).  Each with its subject, its first parent and the files it
changed (renames as a deletion and an addition).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from skippy.core.git import Repo
from skippy.queue.imports import TRAILER_DIGEST, TRAILER_UPSTREAM, parse_trailers, upstream_of
from skippy.queue.mail import label_of

#: pathspecs are file names, never patterns
LITERAL_PATHSPECS: Final = {"GIT_LITERAL_PATHSPECS": "1"}


@dataclass(frozen=True)
class UpstreamCommit:
    sha: str
    subject: str
    paths: tuple[str, ...]
    #: its first parent (None for a root commit)
    parent: str | None = field(default=None, compare=False)


def upstream_commits(
    repo: Repo, old: str, new: str, *, oldest_first: bool = False, touching: Iterable[str] | None = None
) -> list[UpstreamCommit]:
    """The upstream commits of ``old..new`` (newest first unless ``oldest_first``); with
    ``touching``, only those that change one of these files (their whole file list kept)."""
    limit = ["--full-diff", "--", *sorted(touching)] if touching is not None else []
    log = repo.git(
        "-c",
        "core.quotePath=false",
        "log",
        *(["--reverse"] if oldest_first else []),
        "--no-merges",
        "--no-renames",
        "--name-only",
        "--format=%x01%H%x00%P%x00%s%x00%B%x02",
        f"{old}..{new}",
        *limit,
        env=LITERAL_PATHSPECS,
        what="git log",
    ).stdout
    commits: list[UpstreamCommit] = []
    for chunk in log.split("\x01")[1:]:
        sha, _, rest = chunk.partition("\0")
        parents, _, rest = rest.partition("\0")
        subject, _, rest = rest.partition("\0")
        body, _, names = rest.partition("\x02")
        if label_of(body) is not None:
            continue  # the queue's own commit
        trailers = parse_trailers(body)
        if TRAILER_UPSTREAM in trailers and TRAILER_DIGEST in trailers and upstream_of(repo, sha) is not None:
            continue  # this repository's import of a source archive
        parent = parents.split()[0] if parents.split() else None
        commits.append(UpstreamCommit(sha, subject, tuple(n for n in names.splitlines() if n), parent))
    return commits
