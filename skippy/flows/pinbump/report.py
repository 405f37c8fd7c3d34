"""What ``invoke pin-bump`` reports: the old and new pin, whether it was written, the summary, the
parity audit, the numerics, the patches dropped, and where the new pin came from (upstream history,
or a source archive alone: an unverified pin), as JSON and as the pull request's Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skippy.maintain.summary import Summary


@dataclass(frozen=True)
class BumpReport:
    old_pin: str
    new_pin: str
    written: bool
    dry_run: bool
    patched_sha: str
    backends: tuple[str, ...]
    summary: Summary | None
    parity: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    #: the CPU build's fingerprints against the committed reference: per model, the prompts whose
    #: greedy answer changed between the old and the new pin, and whether the reference was rewritten
    numerics: tuple[dict[str, Any], ...] = ()
    #: the patches ``--drop`` took out of the queue
    dropped: tuple[str, ...] = ()
    #: where the new pin came from: "git" (upstream history has it) or "archive" (its source archive alone)
    source: str = "git"
    #: why a pin from a source archive alone is unverified (what vouches for it), empty when history does
    unverified: str = ""

    def provenance_markdown(self) -> str:
        """The warning that heads the pull request of a pin no upstream history vouches for."""
        if not self.unverified:
            return ""
        verb = "would be written" if self.dry_run else "was written" if self.written else "comes"
        return (
            f"> **Unverified pin**: `{self.new_pin}` {verb} from {self.unverified}. No upstream history here "
            "shows that upstream has this commit with this tree: check it upstream (or re-run `invoke pin-bump "
            f"--sha {self.new_pin}` with LLAMA_UPSTREAM_URL pointing at a mirror) before merging.\n"
        )

    def numerics_markdown(self) -> str:
        if not self.numerics:
            return ""
        lines = ["### Numerics (greedy answers of the CPU build, old pin -> new pin)", ""]
        for n in self.numerics:
            changed = n["changed_prompts"]
            what = "unchanged" if not changed else "CHANGED for " + ", ".join(f"`{p}`" for p in changed)
            if not n["had_reference"]:
                what = "no reference before this bump"
            tail = ""
            if n["written"]:
                tail = f"; reference rewritten: `{n['reference']}`"
            elif n.get("up_to_date"):
                tail = f"; reference `{n['reference']}` already holds these answers, left as it is"
            lines.append(f"- `{n['model']}`: {what}{tail}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "old_pin": self.old_pin,
            "new_pin": self.new_pin,
            "written": self.written,
            "dry_run": self.dry_run,
            "patched_sha": self.patched_sha,
            "backends": list(self.backends),
            "summary": self.summary.as_dict() if self.summary else None,
            "parity": self.parity,
            "notes": list(self.notes),
            "numerics": list(self.numerics),
            "dropped": list(self.dropped),
            "source": self.source,
            "verified": not self.unverified,
            "unverified": self.unverified,
        }
