"""One error hierarchy, caught once at the entry points.

Every error says what happened, what was left untouched, and the next command
to run.  Each subclass carries its own exit code so scripts can tell them apart.
"""

from __future__ import annotations

from skippy.core.annotations import Annotation
from skippy.core.redact import redact_urls


class SkippyError(Exception):
    """Base class: a failure the user can act on."""

    exit_code: int = 1
    title: str = "skippy failed"
    #: findings on the files they are about (a conflicting patch ...), shown in GitHub Actions
    annotations: tuple[Annotation, ...] = ()

    def __init__(
        self,
        what: str,
        *,
        untouched: str | None = None,
        next_step: str | None = None,
        details: str | None = None,
    ) -> None:
        super().__init__(what)
        self.what = what
        self.untouched = untouched
        self.next_step = next_step
        self.details = details

    def render(self) -> str:
        lines = [f"error: {self.what}"]
        if self.details:
            lines.append("")
            lines.extend("  " + line for line in self.details.rstrip().splitlines())
            lines.append("")
        if self.untouched:
            lines.append(f"untouched: {self.untouched}")
        if self.next_step:
            lines.append(f"next: {self.next_step}")
        return redact_urls("\n".join(lines))

    def as_dict(self) -> dict[str, object]:
        texts = {"what": self.what, "untouched": self.untouched, "next": self.next_step, "details": self.details}
        redacted = {key: None if text is None else redact_urls(text) for key, text in texts.items()}
        return {"error": type(self).__name__, "exit_code": self.exit_code, **redacted}


class SettingsError(SkippyError):
    exit_code = 2


class QueueError(SkippyError):
    exit_code = 3


class CommandError(SkippyError):
    """A subprocess failed; carries argv, exit code and the output tail."""

    exit_code = 4

    def __init__(
        self,
        what: str,
        *,
        argv: tuple[str, ...] = (),
        returncode: int | None = None,
        output_tail: str = "",
        untouched: str | None = None,
        next_step: str | None = None,
    ) -> None:
        details = f"$ {' '.join(argv)}\nexit code: {returncode}"
        if output_tail:
            details += "\n" + output_tail
        super().__init__(what, untouched=untouched, next_step=next_step, details=details)
        self.argv = argv
        self.returncode = returncode
        self.output_tail = output_tail


class NetworkError(SkippyError):
    exit_code = 5


class DirtyWorkdirError(SkippyError):
    exit_code = 6


class ConflictError(SkippyError):
    exit_code = 7
    #: the triage report (skippy.queue.triage.TriageReport) when one was made
    triage: object | None = None

    def as_dict(self) -> dict[str, object]:
        data = super().as_dict()
        as_dict = getattr(self.triage, "as_dict", None)
        if callable(as_dict):
            data["triage"] = as_dict()
        return data


class LockBusyError(SkippyError):
    exit_code = 8


class WorkdirError(SkippyError):
    """The workdir is not something skippy can safely manage."""

    exit_code = 9


class UnsafeGitConfig(WorkdirError):
    """A repository's own git config names a program git would run (skippy.core.gitconfig)."""


class ArchiveError(SkippyError):
    exit_code = 10


class ToolchainMissing(SkippyError):
    exit_code = 11


class BuildError(SkippyError):
    exit_code = 12


class SpotCheckFailed(SkippyError):
    exit_code = 13


class CIError(SkippyError):
    """A CI job's check failed (a session skipped or missing, an unreadable report)."""

    exit_code = 14


class UpstreamTestsFailed(SkippyError):
    """The queue breaks one of upstream's own tests (or a test failed with no baseline to judge it)."""

    exit_code = 15
    #: the report (skippy.flows.upstream_tests.UpstreamTestsReport)
    report: object | None = None
    #: the block the session ends with (skippy.check.report.Ending), every proof made
    ending: object | None = None

    def as_dict(self) -> dict[str, object]:
        data = super().as_dict()
        as_dict = getattr(self.report, "as_dict", None)
        if callable(as_dict):
            data["upstream_tests"] = as_dict()
        return data


class CarriedUpstream(SkippyError):
    """A pin move whose target already carries patches of the queue (drop candidates), found
    before any conflict."""

    exit_code = 16
    #: the drop candidates (skippy.maintain.carried.Carried), each with its ``as_dict``
    carried: tuple[object, ...] = ()

    def as_dict(self) -> dict[str, object]:
        data = super().as_dict()
        data["drop_candidates"] = [as_dict() for c in self.carried if callable(as_dict := getattr(c, "as_dict", None))]
        return data


class Interrupted(SkippyError):
    """Ctrl-C (SIGINT): the shell's exit code for it."""

    exit_code = 130


class InternalError(SkippyError):
    """An exception skippy did not foresee: a bug, reported with its traceback."""

    exit_code = 70

    def __init__(self, exc: BaseException) -> None:
        super().__init__(
            f"unexpected {type(exc).__name__}: {exc}",
            untouched="unknown: this is a bug in skippy, not a failure it checks for",
            next_step="report it with the traceback printed above",
        )
