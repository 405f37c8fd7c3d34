"""Building the workdir as it stands (``--workdir-as-is``): what names its state.

A maintainer edits or commits in the llama.cpp workdir and builds that, without a
prepare.  Such a build gets a build dir of its own, keyed by the workdir's state:
its HEAD, the diff of the work tree against HEAD (staged or not, binary files
included) and the untracked files git does not ignore (path, mode and content).
The same state gives the same dir (a second build is Ninja's no-op); any edit,
commit or new source file gives another one, so the prepared tree's build dir is
never reconfigured by a local experiment.

The binary of such a build reports the queue digest :data:`LOCAL_QUEUE_DIGEST`:
it comes from no registered queue.  Reading the state runs only read-only git
commands (``GIT_OPTIONAL_LOCKS=0``: not even the index's stat cache is written).
"""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippy.core.errors import BuildError
from skippy.core.git import Repo

#: the queue digest a binary built from the workdir as it stands reports
LOCAL_QUEUE_DIGEST: Final = "local"
#: the build modes a stamp records (``mode``): a prepared tree, or the workdir as it stands
MODE_PREPARED: Final = "prepared"
MODE_LOCAL: Final = "local"

_DIFF_ARGS: Final = (
    "diff",
    "HEAD",
    "--binary",
    "--full-index",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
    "--no-renames",
)


@dataclass(frozen=True)
class WorkdirState:
    """The workdir as it stands: HEAD, and whether anything differs from it."""

    head: str
    #: sha256 of the diff against HEAD and of the untracked, not ignored files
    key: str
    #: tracked files that differ from HEAD, and untracked files that count
    changed: tuple[str, ...] = ()

    @property
    def short(self) -> str:
        """The part of a build dir's name: 12 hex digits of HEAD + changes."""
        return self.key[:12]


def untracked_digest(mode: int, content: bytes) -> bytes:
    """One untracked file's part of the key: executable or not, and its bytes."""
    kind = b"x" if mode & stat.S_IXUSR else b"f"
    return kind + hashlib.sha256(content).digest()


def state_key(head: str, diff: str, untracked: Iterable[tuple[str, bytes]]) -> str:
    """The workdir's state as one digest (pure): HEAD, the diff against it, and each
    untracked file's path and :func:`untracked_digest`, in path order."""
    h = hashlib.sha256()
    h.update(b"head\0" + head.encode() + b"\0")
    h.update(b"diff\0" + hashlib.sha256(diff.encode("utf-8", "surrogateescape")).digest())
    for path, digest in sorted(untracked):
        h.update(b"untracked\0" + path.encode("utf-8", "surrogateescape") + b"\0" + digest)
    return h.hexdigest()


def local_dir_name(backend: str, flags_digest: str, state: WorkdirState) -> str:
    """``<backend>-<flags digest>-local-<state>``: beside the prepared ``<backend>-<flags digest>``."""
    return f"{backend}-{flags_digest}-{MODE_LOCAL}-{state.short}"


def _file_digest(path: Path) -> bytes:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return b"l" + hashlib.sha256(str(path.readlink()).encode("utf-8", "surrogateescape")).digest()
    return untracked_digest(info.st_mode, path.read_bytes())


def read_workdir_state(workdir: Path, env: Mapping[str, str], *, skip: Callable[[str], bool]) -> WorkdirState:
    """The state of ``workdir`` (read-only git commands). ``skip`` names untracked paths
    that are build outputs, not sources (``tolerated_untracked``): they do not count."""
    repo = Repo(workdir, env)
    head = repo.head() if (workdir / ".git").exists() else None
    if head is None:
        raise BuildError(
            f"{workdir} is not a llama.cpp checkout with a commit: there is nothing to build as it is",
            untouched="everything: nothing was configured or built",
            next_step="invoke prepare (then edit or commit there), or drop --workdir-as-is",
        )
    diff = repo.git(*_DIFF_ARGS).stdout
    names = repo.git("diff", "HEAD", "--name-only", "--no-renames", "-z").stdout.split("\0")
    listed = repo.git("ls-files", "--others", "--exclude-standard", "-z").stdout.split("\0")
    untracked = [p for p in listed if p and not skip(p)]
    entries = [(p, _file_digest(workdir / p)) for p in untracked]
    changed = tuple(sorted({n for n in names if n} | set(untracked)))
    return WorkdirState(head=head, key=state_key(head, diff, entries), changed=changed)


__all__ = [
    "LOCAL_QUEUE_DIGEST",
    "MODE_LOCAL",
    "MODE_PREPARED",
    "WorkdirState",
    "local_dir_name",
    "read_workdir_state",
    "state_key",
    "untracked_digest",
]
