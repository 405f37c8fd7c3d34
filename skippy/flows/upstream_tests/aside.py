"""The tree beside the workdir (a shared clone moved from commit to commit) and the queue's prepared commits."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.compile.plan import workdir_key
from skippy.core.errors import CommandError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.queue.mail import label_of


class AsideTree:
    """A ``git clone --shared`` of the workdir under the cache dir, moved between commits."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        # one per workdir (keyed as build dirs are): its commits are reached through that workdir's objects
        key = workdir_key(settings, workdir) or "default"
        self.path = settings.cache_dir / "upstream-tests" / f"tree-{key}" / "llama.cpp"
        self.workdir = workdir
        self.env = settings.env

    def at(self, commit: str) -> Path:
        """The tree checked out at ``commit`` (made again when the workdir it borrows from was
        re-made, so its objects are gone)."""
        try:
            return self._checkout(commit)
        except CommandError:
            shutil.rmtree(self.path, ignore_errors=True)
            return self._checkout(commit)

    def apply(self, commits: Sequence[str]) -> str | None:
        """The changes of ``commits`` (in order) on the checked-out tree, uncommitted: a key of
        what was applied, or None (the tree left as checked out) when one does not apply."""
        repo = Repo(self.path, self.env)
        digest = hashlib.sha256()
        for sha in commits:
            diff = repo.git("diff", "--binary", f"{sha}^", sha).stdout
            digest.update(diff.encode("utf-8", errors="surrogateescape"))
            if repo.git("apply", "--whitespace=nowarn", "-", input=diff, check=False).returncode != 0:
                repo.git("checkout", "--force", "--quiet", "HEAD")
                repo.git("clean", "-fdq")
                return None
        return digest.hexdigest()

    def _checkout(self, commit: str) -> Path:
        if not (self.path / ".git").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            Repo(self.path.parent, self.env).git(
                "clone", "--shared", "--no-checkout", "--quiet", str(self.workdir), str(self.path)
            )
        repo = Repo(self.path, self.env)
        # the workdir's objects are this clone's alternates: every commit there is here
        repo.git("checkout", "--detach", "--force", "--quiet", commit)
        repo.git("clean", "-fdq")
        return self.path


@dataclass(frozen=True)
class QueueCommit:
    sha: str
    label: str


def queue_commits(repo: Repo, base: str, patched: str) -> tuple[QueueCommit, ...]:
    """The prepared commits from the base to the tip, oldest first, each with its patch label."""
    out = repo.out("log", "--reverse", "--format=%H%x00%B%x01", f"{base}..{patched}")
    commits: list[QueueCommit] = []
    for raw in out.split("\x01"):
        chunk = raw.strip("\n")
        if not chunk:
            continue
        sha, _, message = chunk.partition("\x00")
        commits.append(QueueCommit(sha=sha.strip(), label=label_of(message) or f"commit {sha.strip()[:12]}"))
    return tuple(commits)
