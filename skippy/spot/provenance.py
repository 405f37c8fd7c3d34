"""The provenance rule: which queue digest a binary must report, and what to do when it
reports another.

A binary built from the workdir as it stands (``--workdir-as-is``) reports the queue
digest ``local``: it comes from no registered queue.  That is accepted only where it
was asked for (the build session of that mode, or ``nox -s spot-check --
--workdir-as-is``); everywhere else a ``local`` binary is refused like a stale one,
and a prepared build is refused where a local one is expected.
"""

from __future__ import annotations

from skippy.compile.localtree import LOCAL_QUEUE_DIGEST


def expected_queue_digest(prepared_digest: str, *, workdir_as_is: bool) -> str:
    """The queue digest the binary must report: the prepared queue's, or ``local``."""
    return LOCAL_QUEUE_DIGEST if workdir_as_is else prepared_digest


def stale_next_step(expected_digest: str, reported_digest: str | None, backend: str) -> str:
    """The next command for a binary whose provenance is not the expected one."""
    if reported_digest == LOCAL_QUEUE_DIGEST and expected_digest != LOCAL_QUEUE_DIGEST:
        return (
            "it was built from the workdir as it stood (a local, unregistered tree): check it as such with "
            f"`nox -s spot-check -- --backend {backend} --workdir-as-is`, or build the prepared tree: "
            f"nox -s build-{backend}"
        )
    if expected_digest == LOCAL_QUEUE_DIGEST and reported_digest != LOCAL_QUEUE_DIGEST:
        return f"it is not a build of the workdir as it stands: nox -s build-{backend} -- --workdir-as-is"
    return f"rebuild it: nox -s build-{backend}"
