"""One error hierarchy, caught once at the entry points.

Every error says what happened, what was left untouched, and the next command
to run, all given where it is raised: nothing edits an error afterwards (a caller
that knows more raises a new one ``from`` it, :meth:`SkippyError.restated`).  Each class carries its own exit
code, so scripts can tell the failures apart; :class:`SkippyError` itself is
never raised.  The table of codes in docs/housekeeping.md is made from this
module (:mod:`skippy.cli.exitcodes`).

The findings an error carries (a triage, a parity or check report, the block a
build session ends with) belong to the layers above; here they are typed by what
this layer does with them (:class:`Reported`, :class:`Shown`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, Self

from skippy.core.annotations import Annotation
from skippy.core.redact import redact_urls

if TYPE_CHECKING:
    from skippy.core.ui import Console


class Reported(Protocol):
    """A finding an error carries into its JSON report (a triage, a parity report ...)."""

    def as_dict(self) -> Mapping[str, object]: ...


class Shown(Protocol):
    """The block a run ends with (skippy.spot.report.Ending): shown before the error, its proofs
    in the JSON report."""

    def as_dict(self) -> Mapping[str, object]: ...

    def show(self, console: Console) -> None: ...


class SkippyError(Exception):
    """Base class of every failure the user can act on; never raised itself."""

    exit_code: ClassVar[int] = 1
    title: ClassVar[str] = "skippy failed"
    #: the block the run ends with, shown before the error (a build session's), when there is one
    ending: Shown | None = None

    def __init__(
        self,
        what: str,
        *,
        untouched: str | None = None,
        next_step: str | None = None,
        details: str | None = None,
        annotations: Sequence[Annotation] = (),
    ) -> None:
        if type(self) is SkippyError:
            raise TypeError("SkippyError is the base class: raise the class of that failure (skippy.core.errors)")
        super().__init__(what)
        self.what = what
        self.untouched = untouched
        self.next_step = next_step
        self.details = details
        #: findings on the files they are about (a conflicting patch ...), shown in GitHub Actions
        self.annotations = tuple(annotations)

    def restated(self, *, what: str | None = None, untouched: str | None = None, next_step: str | None = None) -> Self:
        """A new error of this class and payload, told with what a caller knows that the raise site
        could not (the queue put back after a failure ...); raise it ``from`` this one."""
        told = type(self).__new__(type(self))
        told.__dict__.update(self.__dict__)
        SkippyError.__init__(
            told,
            self.what if what is None else what,
            untouched=self.untouched if untouched is None else untouched,
            next_step=self.next_step if next_step is None else next_step,
            details=self.details,
            annotations=self.annotations,
        )
        return told

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
    """A setting, option or argument skippy refuses (pyproject.toml, a variable, the command line)."""

    exit_code = 2


class QueueError(SkippyError):
    """The patch queue is invalid or cannot be read or written (its files, lanes, regenerate, generate)."""

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
    """Something to fetch did not answer or came back wrong (the upstream, an archive, a model)."""

    exit_code = 5


class DirtyWorkdirError(SkippyError):
    """The workdir holds local work a run would lose: refused, naming it and how to keep or discard it."""

    exit_code = 6


class ConflictError(SkippyError):
    """The queue does not apply: a patch conflicts (triaged when the triage ran)."""

    exit_code = 7

    def __init__(
        self,
        what: str,
        *,
        untouched: str | None = None,
        next_step: str | None = None,
        details: str | None = None,
        annotations: Sequence[Annotation] = (),
        triage: Reported | None = None,
    ) -> None:
        super().__init__(what, untouched=untouched, next_step=next_step, details=details, annotations=annotations)
        #: the triage report (skippy.queue.triage.TriageReport) when one was made
        self.triage = triage

    def as_dict(self) -> dict[str, object]:
        data = super().as_dict()
        if self.triage is not None:
            data["triage"] = self.triage.as_dict()
        return data


class LockBusyError(SkippyError):
    """Another run holds the lock this one needs (the workdir's, a download's)."""

    exit_code = 8


class WorkdirError(SkippyError):
    """The workdir is not something skippy can safely manage."""

    exit_code = 9


class ArchiveError(SkippyError):
    """A source archive cannot be used (its digest, its contents, its mapping to a commit)."""

    exit_code = 10


class ToolchainMissing(SkippyError):
    """A program or toolkit the run needs is missing, with how to install it."""

    exit_code = 11


class BuildError(SkippyError):
    """Configuring or building llama.cpp failed, or its artifacts are not what the backend makes."""

    exit_code = 12


class SpotCheckFailed(SkippyError):
    """The spot check could not run: a stale or missing binary, a model it cannot fetch, a server that
    would not start."""

    exit_code = 13


class CIError(SkippyError):
    """A CI job's check failed (a session skipped or missing, an unreadable report)."""

    exit_code = 14


class UpstreamTestsFailed(SkippyError):
    """The queue breaks one of upstream's own tests (or a test failed with no baseline to judge it)."""

    exit_code = 15

    def __init__(
        self,
        what: str,
        *,
        untouched: str | None = None,
        next_step: str | None = None,
        details: str | None = None,
        report: Reported,
        ending: Shown | None = None,
    ) -> None:
        super().__init__(what, untouched=untouched, next_step=next_step, details=details)
        #: the report (skippy.flows.upstream_tests.report.UpstreamTestsReport)
        self.report = report
        self.ending = ending

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "upstream_tests": self.report.as_dict()}


class CarriedUpstream(SkippyError):
    """A pin move whose target already carries patches of the queue (drop candidates), found
    before any conflict."""

    exit_code = 16

    def __init__(
        self,
        what: str,
        *,
        untouched: str | None = None,
        next_step: str | None = None,
        details: str | None = None,
        annotations: Sequence[Annotation] = (),
        carried: Sequence[Reported],
    ) -> None:
        super().__init__(what, untouched=untouched, next_step=next_step, details=details, annotations=annotations)
        #: the drop candidates (skippy.maintain.carried.Carried)
        self.carried = tuple(carried)

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "drop_candidates": [c.as_dict() for c in self.carried]}


class CheckFailed(QueueError):
    """``invoke check`` found a failing step (the queue, its apply, parity, the generated lane, boundaries)."""

    exit_code = 17

    def __init__(
        self, what: str, *, untouched: str, next_step: str, details: str | None = None, report: Reported
    ) -> None:
        super().__init__(what, untouched=untouched, next_step=next_step, details=details)
        #: the check's report (skippy.maintain.review.CheckReport)
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "check": self.report.as_dict()}


class ParityFailed(QueueError):
    """The parity audit found arch cases the queue drops that the allowlist does not name."""

    exit_code = 18

    def __init__(
        self, what: str, *, untouched: str, next_step: str, details: str | None = None, report: Reported
    ) -> None:
        super().__init__(what, untouched=untouched, next_step=next_step, details=details)
        #: the audit's report (skippy.maintain.parity_report.ParityReport)
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "parity": self.report.as_dict()}


class GraphEditError(QueueError):
    """A model family whose graph code the generated lane's rewrite cannot place its hook in."""

    exit_code = 19

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"{path}: {reason}",
            untouched="the family file (nothing was written)",
            next_step="leave the family out of the generated lane's spec, or give its layer loop a "
            'cb(cur, "l_out", il) anchor in a model_support patch',
        )
        self.path = path
        self.reason = reason


class ModelCheckFailed(SpotCheckFailed):
    """The spot check ran and at least one model failed it (its answer, its numbers, its device)."""

    exit_code = 20

    def __init__(
        self,
        what: str,
        *,
        untouched: str,
        next_step: str,
        details: str | None = None,
        report: Reported,
        ending: Shown | None = None,
    ) -> None:
        super().__init__(what, untouched=untouched, next_step=next_step, details=details)
        #: the spot check's report (skippy.spot.report.SpotCheckReport)
        self.report = report
        self.ending = ending

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "report": self.report.as_dict()}


class UnsafeGitConfig(WorkdirError):
    """A repository's own git config names a program git would run (skippy.core.gitconfig)."""

    exit_code = 21


class ClusterError(SkippyError):
    """The compile cluster (``nox -s dist-cluster``) could not be started."""

    exit_code = 22


class BuildSkipped(SkippyError):
    """A build ``invoke pin-bump`` needs was skipped (this host cannot build or check that backend)."""

    exit_code = 23


class CTestError(SkippyError):
    """CTest did not report what was asked of it (an unreadable test list, no results, a test not run)."""

    exit_code = 24


class NotPrepared(SkippyError):
    """The workdir is not the prepared tree the run was started on (it moved under the run)."""

    exit_code = 25


class CleanFailed(SkippyError):
    """``invoke clean`` could not remove some of the paths it meant to (the others were removed)."""

    exit_code = 26


class InternalError(SkippyError):
    """An exception skippy did not foresee: a bug, reported with its traceback."""

    exit_code = 70

    def __init__(self, exc: BaseException) -> None:
        super().__init__(
            f"unexpected {type(exc).__name__}: {exc}",
            untouched="unknown: this is a bug in skippy, not a failure it checks for",
            next_step="report it with the traceback printed above",
        )


class Interrupted(SkippyError):
    """Ctrl-C (SIGINT): the shell's exit code for it."""

    exit_code = 130


class TerminatedError(Interrupted):
    """SIGTERM (``timeout``, a cancelled CI job), unwound as Ctrl-C is: 128 + SIGTERM, as the shell
    reports a process it ended."""

    exit_code = 143
