"""nox's own log, minus one line of noise.

nox looks for uv whenever it sets up a session, whatever the session's venv
backend: with ``default_venv_backend = "none"`` (our sessions run in the project's
own environment) it still asks for uv's version, and where uv is not installed it
logs "uv binary not found." before every session. The noxfile drops exactly that
record from nox's logger; every other line of nox's log is kept.

nox ends every failed run with exit code 1 (``session.error`` included); a session
run alone ends with skippy's own code instead (:func:`fail`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from nox import Session

UV_NOT_FOUND: Final = "uv binary not found."


class _DropUvProbe(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != UV_NOT_FOUND


def quiet_uv_probe(logger: logging.Logger | None = None) -> None:
    """Drop nox's "uv binary not found." record (once per logger, however often called)."""
    target = logger if logger is not None else logging.getLogger("nox")
    if not any(isinstance(f, _DropUvProbe) for f in target.filters):
        target.addFilter(_DropUvProbe())


def _alone(session: Session) -> bool:
    """This session is the only one nox runs (``nox -s build-cpu``, not ``nox -t build``) and
    nox writes no report (``--report``: nox writes it only when the run ends as nox ends it)."""
    # nox has no public word for either: the run's manifest and options, through the session's runner
    runner = getattr(session, "_runner", None)
    if getattr(getattr(runner, "global_config", None), "report", None) is not None:
        return False
    manifest = getattr(runner, "manifest", None)
    try:
        return manifest is not None and len(manifest) == 1
    except TypeError:
        return False


def fail(session: Session, code: int) -> NoReturn:
    """End a failed session with skippy's exit code (docs/building.md: 2 for an option refused,
    11 for a toolchain this host lacks, 130 for Ctrl-C ...).

    Run alone, the session logs its failure as nox does and exits with ``code`` (nox lets a
    SystemExit through); among several sessions, or with ``--report``, nox's summary, its
    report and its exit code 1 stand, and the failed session's own code is in its line."""
    message = f"{session.name} failed (exit code {code})"
    if _alone(session):
        logging.getLogger("nox").error(f"Session {session.name} failed: exit code {code}.")
        raise SystemExit(code)
    session.error(message)
