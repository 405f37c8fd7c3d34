"""Invoke tasks: a menu.  Each task parses its options and makes one call into skippy."""

from __future__ import annotations

import os
from pathlib import Path

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

ROOT = Path(__file__).resolve().parent


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


@task(
    help={
        "pinned": "prepare the commit in the pin file (default)",
        "latest": "prepare upstream master",
        "sha": "prepare this upstream commit",
        "force": "discard local work in the workdir (saved under a backup ref first)",
        "offline": "never contact the upstream; use the configured source archive",
        "json": "print one JSON report on stdout",
        "verbose": "show every git command and step timings",
    }
)
def prepare(
    c: Context,
    pinned: bool = False,
    latest: bool = False,
    sha: str = "",
    force: bool = False,
    offline: bool = False,
    json: bool = False,
    verbose: bool = False,
) -> None:
    """Check out upstream llama.cpp and apply the patch queue (git am --3way, three lanes)."""
    from skippy.cli import prepare_main

    _done(
        prepare_main(
            os.environ,
            root=ROOT,
            pinned=pinned,
            latest=latest,
            sha=sha,
            force=force,
            offline=offline,
            as_json=json,
            verbose=verbose,
        )
    )


@task(help={"json": "print one JSON report on stdout"})
def status(c: Context, json: bool = False) -> None:
    """Pin, upstream and patched SHAs, queue digest, local work, and what prepare would do."""
    from skippy.cli import status_main

    _done(status_main(os.environ, root=ROOT, as_json=json))
