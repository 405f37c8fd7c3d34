"""nox's own log, minus one line of noise.

nox looks for uv whenever it sets up a session, whatever the session's venv
backend: with ``default_venv_backend = "none"`` (our sessions run in the project's
own environment) it still asks for uv's version, and where uv is not installed it
logs "uv binary not found." before every session. The noxfile drops exactly that
record from nox's logger; every other line of nox's log is kept.
"""

from __future__ import annotations

import logging
from typing import Final

UV_NOT_FOUND: Final = "uv binary not found."


class _DropUvProbe(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != UV_NOT_FOUND


def quiet_uv_probe(logger: logging.Logger | None = None) -> None:
    """Drop nox's "uv binary not found." record (once per logger, however often called)."""
    target = logger if logger is not None else logging.getLogger("nox")
    if not any(isinstance(f, _DropUvProbe) for f in target.filters):
        target.addFilter(_DropUvProbe())
