"""The one explicit state of a prepare run, and the report it ends with.

Every step of prepare (:mod:`skippy.queue.prepare`) takes the :class:`Run`: its
inputs (settings, console, the flags) and what the steps did that the report
must say (a backup ref, notes, an interrupted run finished).  The queue is not
part of it: the steps that apply the queue take it as an argument, and the
steps that only reach the upstream (:mod:`skippy.queue.upstream`) never see one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.core.errors import SkippyError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd

#: the build of the workdir as it stands that a plain ``invoke prepare`` names
AS_IS_BUILD: Final = "nox -s build-cpu -- --workdir-as-is"


@dataclass
class Run:
    settings: Settings
    console: Console
    force: bool = False
    #: set by the clone step when the upstream does not answer and the source archive stands in
    offline: bool = False
    #: why the run went offline when ``--offline`` was not given (the clone's network error)
    unreachable: SkippyError | None = None
    #: on a conflict, leave the failed ``git am`` stopped in the workdir (default: not on CI)
    interactive: bool = False
    sleep: Callable[[float], None] = time.sleep
    backup_ref: str | None = None
    notes: list[str] = field(default_factory=list)
    #: what this run finished of an interrupted one (said when it then refuses local work)
    recovered: str | None = None
    #: files whose local content ``force`` reverted or removed (saved under ``backup_ref`` first)
    reverted: list[str] = field(default_factory=list)
    #: the command that re-runs this prepare (named in the next steps of a refusal)
    rerun: str = "invoke prepare"
    #: the build of the workdir as it stands, named in a refusal of local work (the backend of the
    #: build session that runs this prepare)
    as_is_build: str = AS_IS_BUILD

    @property
    def workdir(self) -> Path:
        return self.settings.workdir

    def repo(self, path: Path | None = None) -> Repo:
        return Repo(path or self.workdir, self.settings.env, echo=self.console.command)

    def rel(self, path: Path) -> str:
        return self.settings.relative(path)

    def report(self, action: str, stamp: wd.Stamp, changed: int | None) -> PrepareReport:
        return PrepareReport(
            action,
            stamp.upstream_sha,
            stamp.patched_sha,
            stamp.queue_digest,
            self.workdir,
            stamp.source,
            0.0,
            changed_files=changed,
            backup_ref=self.backup_ref,
            notes=tuple(self.notes),
            reverted=tuple(self.reverted),
        )

    def discarded(self, modified: Sequence[str], removed: Sequence[str], *, what: str = "--force") -> None:
        """Say (warning and note) which files ``what`` reverted and removed, and where they are kept."""
        new_modified = [p for p in modified if p not in self.reverted]
        new_removed = [p for p in removed if p not in self.reverted and p not in new_modified]
        if not (new_modified or new_removed):
            return
        self.reverted += [*new_modified, *new_removed]
        parts = []
        if new_modified:
            parts.append(f"reverted {len(new_modified)} file(s): {', '.join(new_modified)}")
        if new_removed:
            parts.append(f"removed {len(new_removed)} untracked file(s): {', '.join(new_removed)}")
        note = (
            f"{what} " + "; ".join(parts) + (f" (yours are saved under {self.backup_ref})" if self.backup_ref else "")
        )
        self.console.warn(note)
        self.notes.append(note)


@dataclass(frozen=True)
class PrepareReport:
    action: str  # "noop" | "cloned" | "applied" | "switched" | "resumed" | "aborted"
    upstream_sha: str
    patched_sha: str
    queue_digest: str
    workdir: Path
    source: str
    seconds: float
    changed_files: int | None = None
    backup_ref: str | None = None
    notes: tuple[str, ...] = field(default=())
    #: files whose local content ``--force`` reverted or removed (saved under ``backup_ref``)
    reverted: tuple[str, ...] = field(default=())
    #: what to run next, when the run leaves something to do (a finished conflict session)
    next_step: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "upstream_sha": self.upstream_sha,
            "patched_sha": self.patched_sha,
            "queue_digest": self.queue_digest,
            "workdir": str(self.workdir),
            "source": self.source,
            "seconds": round(self.seconds, 3),
            "changed_files": self.changed_files,
            "backup_ref": self.backup_ref,
            "notes": list(self.notes),
            "reverted": list(self.reverted),
            "next": self.next_step,
        }
