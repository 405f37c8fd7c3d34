"""Archive import commits as a user should read them: the upstream SHA they stand for.

A workdir prepared from a source archive has a local, parentless "import" commit standing for
the upstream commit (:mod:`skippy.queue.archives` makes it).  Work uses that local commit; what
a user reads (triage, summaries, pin-bump) is the upstream SHA.  Kept apart from the import
itself, so reading a commit costs no archive machinery.
"""

from __future__ import annotations

import re
from typing import Final

from skippy.core.git import Repo

#: refs under which imported archive commits are recorded
REF_PREFIX: Final = "refs/skippy/archive/"
TRAILER_UPSTREAM: Final = "Upstream-Commit"
TRAILER_DIGEST: Final = "Archive-SHA256"
TRAILER_FOLDER: Final = "Archive-Folder"


def parse_trailers(message: str) -> dict[str, str]:
    """``Key: value`` lines of a commit message's last paragraph."""
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return {}
    found: dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        key, sep, value = line.partition(": ")
        if sep and re.match(r"^[A-Za-z0-9-]+$", key):
            found[key] = value.strip()
    return found


def archive_ref(upstream_sha: str) -> str:
    return REF_PREFIX + upstream_sha


def upstream_of(repo: Repo, commit: str) -> str | None:
    """The upstream SHA ``commit`` stands for when it is the import of a source archive (its
    ``Upstream-Commit`` trailer, recorded under ``refs/skippy/archive/<that sha>``), else None.

    What a user reads is the upstream SHA; the import commit is a local stand-in for it."""
    full = repo.rev_parse(commit + "^{commit}")
    found = repo.git("cat-file", "commit", full, check=False) if full else None
    if found is None or not found.ok:
        return None
    trailers = parse_trailers(found.stdout.partition("\n\n")[2])
    upstream = trailers.get(TRAILER_UPSTREAM)
    if not upstream or TRAILER_DIGEST not in trailers:
        return None
    return upstream if repo.rev_parse(archive_ref(upstream) + "^{commit}") == full else None


def shown_sha(repo: Repo, commit: str) -> str:
    """``commit`` as a user should read it: the upstream SHA of an archive import, else itself."""
    return upstream_of(repo, commit) or commit
