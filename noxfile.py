"""nox sessions: a menu.  Each session parses its options and makes one call
into the skippy library; no git or cmake command line is written here."""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


@nox.session(tags=["check"])
def lint(session: nox.Session) -> None:
    """ruff and mypy (strict) over the package, noxfile, tasks and tests."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session(tags=["check"])
def tests(session: nox.Session) -> None:
    """All test tiers: unit, integration and e2e (pass -m 'not e2e' to skip the slow tier)."""
    session.run("pytest", *session.posargs, env={"PYTHONHASHSEED": "0"})


# --- build sessions: see skippy.build -------------------------------------

# --- spot-check session: see skippy.spotcheck -----------------------------

# --- bench: see skippy.bench ----------------------------------------------
