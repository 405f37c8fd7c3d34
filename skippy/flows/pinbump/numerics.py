"""The new upstream's numbers: the CPU build's fingerprints held against the committed reference
(the prompts whose greedy answer changed), and the reference rewritten by a real bump when its
content changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skippy.core.files import write_text_atomic
from skippy.core.settings import Settings


def numerics_of(settings: Settings, cpu_outcome: object, *, write: bool) -> list[dict[str, Any]]:
    """The CPU build's fingerprints against the committed reference; rewrite it when ``write``."""
    from skippy.spot.fingerprint import greedy_changed, read_reference, reference_path, render_reference
    from skippy.spot.proofs import reference_dir
    from skippy.spot.report import SpotCheckReport

    spot = getattr(cpu_outcome, "spot", None)
    if not isinstance(spot, SpotCheckReport):
        return []
    found: list[dict[str, Any]] = []
    refs = reference_dir(settings)
    for result in spot.results:
        fingerprint = result.compute.fingerprint
        if fingerprint is None:
            continue
        old = read_reference(refs, fingerprint.model)
        had = old is not None and old.key() == fingerprint.key()
        path = reference_path(refs, fingerprint.model)
        text = render_reference(fingerprint)
        up_to_date = _holds(path, text)
        if write and not up_to_date:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        found.append(
            {
                "model": fingerprint.model,
                "had_reference": had,
                "changed_prompts": greedy_changed(old if had else None, fingerprint) if had else [],
                "reference": settings.relative(path),
                # rewritten: its content changed (a reference that already holds these answers is left as it is)
                "written": write and not up_to_date,
                "up_to_date": up_to_date,
            }
        )
    return found


def _holds(path: Path, text: str) -> bool:
    """Whether the file at ``path`` holds exactly ``text`` (a missing or unreadable one does not)."""
    try:
        return path.read_bytes() == text.encode("utf-8")
    except OSError:
        return False
