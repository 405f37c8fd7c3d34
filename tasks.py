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
        "triage": "only try every patch against the target and report (nothing is applied)",
        "continue": "finish a stopped conflict session after resolving and staging",
        "skip": "leave the stopped patch out and finish the session",
        "abort": "end the stopped session and go back to the previous checkout",
        "no-interactive": "on a conflict, abort and report instead of leaving the session stopped (CI does this)",
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
    triage: bool = False,
    continue_: bool = False,
    skip: bool = False,
    abort: bool = False,
    no_interactive: bool = False,
) -> None:
    """Check out upstream llama.cpp and apply the patch queue (git am --3way, three lanes)."""
    from skippy.cli.app import prepare_main, session_action

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
            triage=triage,
            resume=session_action(continue_=continue_, skip=skip, abort=abort),
            interactive=False if no_interactive else None,
        )
    )


@task(
    help={
        "latest": "triage against upstream master (default: the pin)",
        "sha": "triage against this upstream commit",
        "offline": "never contact the upstream",
        "json": "print one JSON report on stdout",
    }
)
def triage(c: Context, latest: bool = False, sha: str = "", offline: bool = False, json: bool = False) -> None:
    """Try every patch of every lane against a target and classify each (clean/3way/conflict/...)."""
    from skippy.cli.app import prepare_main

    _done(prepare_main(os.environ, root=ROOT, latest=latest, sha=sha, offline=offline, as_json=json, triage=True))


@task(
    iterable=["backend"],
    help={
        "sha": "the upstream commit to move to (default: upstream master)",
        "backend": "build and spot-check this backend (repeatable; default cpu)",
        "dry-run": "do everything but write the pin",
        "allow-non-descendant": "allow a target that does not descend from the current pin",
        "newest-compatible": "bump to the newest upstream commit the whole queue applies to",
        "json": "print one JSON report on stdout",
    },
)
def pin_bump(
    c: Context,
    sha: str = "",
    backend: list[str] | None = None,
    dry_run: bool = False,
    allow_non_descendant: bool = False,
    newest_compatible: bool = False,
    json: bool = False,
) -> None:
    """Prepare, build, spot-check and audit a new upstream, then move the pin (atomically) and summarize."""
    from skippy.cli.app import pin_bump_main

    _done(
        pin_bump_main(
            os.environ,
            root=ROOT,
            sha=sha,
            backends=backend or (),
            dry_run=dry_run,
            allow_non_descendant=allow_non_descendant,
            newest_compatible=newest_compatible,
            as_json=json,
        )
    )


@task(help={"old": "older upstream commit", "new": "newer upstream commit", "json": "print JSON instead"})
def summary(c: Context, old: str, new: str, json: bool = False) -> None:
    """Pull-request Markdown of upstream OLD..NEW: commits, diffstat, areas, patches exposed."""
    from skippy.cli.app import summary_main

    _done(summary_main(os.environ, root=ROOT, old=old, new=new, as_json=json))


@task(help={"to": "upstream ref to search up to (default: upstream master)", "json": "print JSON instead"})
def bisect(c: Context, to: str = "", json: bool = False) -> None:
    """Newest upstream commit the whole queue applies to, and the commit that first breaks each failing patch."""
    from skippy.cli.app import bisect_main

    _done(bisect_main(os.environ, root=ROOT, to=to, as_json=json))


@task(help={"json": "print one JSON report on stdout"})
def status(c: Context, json: bool = False) -> None:
    """Pin, upstream and patched SHAs, queue digest, local work, and what prepare would do."""
    from skippy.cli.app import status_main

    _done(status_main(os.environ, root=ROOT, as_json=json))


# ---- queue maintenance (skippy/cli/maintain.py)

_MAINT_HELP = {
    "checkout": "the llama.cpp checkout to read (default: the workdir; only temporary worktrees are used)",
    "offline": "never contact the upstream; use the configured source archive",
    "json": "print one JSON report on stdout",
    "verbose": "show every git command and step timings",
}


@task(
    help={
        "core-head": "branch or commit whose commits since the pin become the core lane",
        "model-support-head": "branch or commit whose commits since --core-head become the model_support lane",
        **_MAINT_HELP,
    }
)
def regenerate(
    c: Context,
    core_head: str = "",
    model_support_head: str = "",
    checkout: str = "",
    offline: bool = False,
    json: bool = False,
    verbose: bool = False,
) -> None:
    """Rebuild the core and model_support lanes from branches on the pin (verified; backup restored on failure)."""
    from skippy.cli.maintain import regenerate_main

    _done(
        regenerate_main(
            os.environ,
            root=ROOT,
            core_head=core_head,
            model_support_head=model_support_head,
            checkout=checkout,
            offline=offline,
            as_json=json,
            verbose=verbose,
        )
    )


@task(help={"check": "only compare the checked-in lane with a fresh generation; fail on drift", **_MAINT_HELP})
def generate(
    c: Context,
    check: bool = False,
    checkout: str = "",
    offline: bool = False,
    json: bool = False,
    verbose: bool = False,
) -> None:
    """Rewrite the generated lane from generated/families.toml and the pinned tree (or --check it)."""
    from skippy.cli.maintain import generate_main

    _done(
        generate_main(
            os.environ, root=ROOT, check=check, checkout=checkout, offline=offline, as_json=json, verbose=verbose
        )
    )


@task(help=_MAINT_HELP)
def parity(c: Context, checkout: str = "", offline: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Audit the arch cases the queue drops (allowlist beside the queue) and list its upstream deletions."""
    from skippy.cli.maintain import parity_main

    _done(parity_main(os.environ, root=ROOT, checkout=checkout, offline=offline, as_json=json, verbose=verbose))


@task(help=_MAINT_HELP)
def check(c: Context, checkout: str = "", offline: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Everything a reviewer needs: validate, apply all lanes, parity, generated-lane drift, boundary lint."""
    from skippy.cli.maintain import check_main

    _done(check_main(os.environ, root=ROOT, checkout=checkout, offline=offline, as_json=json, verbose=verbose))
