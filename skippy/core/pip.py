"""The one ``pip download`` command line the product runs (source archives, toolkit wheels)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def pip_download_argv(
    python: str, into: Path, *, attempts: int, options: Sequence[str] = (), what: Sequence[str]
) -> list[str]:
    """``python -m pip download --no-deps <options> ... -d <into> <what>`` (pure).

    Never asks (``--no-input``), never nags about pip's own version, and retries
    ``attempts - 1`` times on a network failure; ``what`` is a requirement or ``-r FILE``.
    """
    return [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        *options,
        "--disable-pip-version-check",
        "--no-input",
        "--retries",
        str(max(attempts - 1, 0)),
        "-d",
        str(into),
        *what,
    ]
