"""Why a pin move stops before the pin is written: the errors ``invoke pin-bump`` raises, each
naming what was left untouched and the command that goes on (patches upstream already carries,
a target that does not move forward or whose direction cannot be checked, ``--offline`` without
``--sha``, ``--newest-compatible`` without history, a patch both dropped and kept).
"""

from __future__ import annotations

from collections.abc import Sequence

from skippy.core.errors import CarriedUpstream, SettingsError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.flows.pinbump.bisect import carried_annotation
from skippy.flows.pinbump.sides import archive_only
from skippy.maintain.carried import Carried
from skippy.queue.model import Patch, Queue
from skippy.queue.target import read_pin
from skippy.queue.upstream import Resolved


def carried_error(
    settings: Settings, queue: Queue, carried: Sequence[Carried], new_pin: str, *, dry_run: bool
) -> CarriedUpstream:
    """The stop on patches upstream already carries at ``new_pin``: the ways on (``--drop``, a refresh, ``--keep``)."""
    labels = [c.patch for c in carried]
    again = f"invoke pin-bump --sha {new_pin}" + (" --dry-run" if dry_run else "")
    drops = " ".join(f"--drop {c.patch}" for c in carried if c.how != "partly")
    keeps = " ".join(f"--keep {c.patch}" for c in carried)
    steps = [f"`{again} {drops}` (drop what upstream carries whole)"] if drops else []
    partly = [c.patch for c in carried if c.how == "partly"]
    if partly:
        steps.append(f"refresh {', '.join(partly)} to the hunks upstream lacks (upstream has the others), or drop it")
    steps.append(f"keep them: `{again} {keeps}`")
    by_label = {p.label: p for p in queue.patches}
    return CarriedUpstream(
        f"upstream {new_pin[:12]} already carries {len(carried)} patch(es) of the queue: {', '.join(labels)}",
        details="\n".join(c.describe() for c in carried),
        untouched="the pin and the queue: nothing was prepared, built or written",
        next_step="; or ".join(steps),
        annotations=[carried_annotation(c, by_label.get(c.patch), settings.relative) for c in carried],
        carried=carried,
    )


def unchecked_descent(settings: Settings, old: Resolved, new: Resolved, *, dry_run: bool, allowed: bool) -> str:
    """The note of a bump whose direction cannot be checked; refuses a real bump not allowed."""
    why = (
        f"cannot check that {new.upstream_sha[:12]} descends from the pin {old.upstream_sha[:12]}: "
        f"{archive_only(old, new)}, without upstream history"
    )
    if allowed:
        return f"{why}; going on as --allow-non-descendant says"
    if dry_run:
        return f"{why}; the real bump will need --allow-non-descendant"
    raise SettingsError(
        f"{why}: refusing to move the pin without knowing it moves forward",
        untouched=f"{settings.relative(settings.pin_file)} and the workdir",
        next_step=f"check that {new.upstream_sha[:12]} descends from {old.upstream_sha[:12]} upstream, then "
        f"`invoke pin-bump --sha {new.upstream_sha} --allow-non-descendant`; or point LLAMA_UPSTREAM_URL at a "
        "mirror (`git clone --mirror`) and re-run without it",
    )


def no_history_for_bisect(settings: Settings, old: Resolved, new: Resolved) -> SettingsError:
    """The refusal of ``--newest-compatible`` where a side is known only from its source archive."""
    return SettingsError(
        f"--newest-compatible bisects the upstream history from the pin to the target: "
        f"{archive_only(old, new)}, without upstream history",
        untouched=f"{settings.relative(settings.pin_file)} and the workdir",
        next_step=f"`invoke pin-bump --sha {new.upstream_sha}` (the target itself), or point LLAMA_UPSTREAM_URL "
        "at a mirror (`git clone --mirror`) and re-run",
    )


def offline_needs_sha(settings: Settings) -> SettingsError:
    """``--offline`` without ``--sha``: upstream master is not known offline; name the archives there are."""
    pin = read_pin(settings)
    mapped = sorted(str(k).lower() for k in (settings.raw.get("archives") or {}) if str(k).lower() != pin)
    return SettingsError(
        "pin-bump --offline needs --sha: upstream master is not known offline",
        untouched="everything",
        next_step=f"`invoke pin-bump --offline --sha {mapped[0]}`"
        if mapped
        else "map the target to a source archive in [tool.skippy.archives], then "
        "`invoke pin-bump --offline --sha <that sha>`",
        details="commits mapped to a source archive besides the pin: " + (", ".join(m[:12] for m in mapped) or "none"),
    )


def not_forward(settings: Settings, repo: Repo, old: tuple[str, str], new: tuple[str, str]) -> SettingsError:
    """The refusal of a target that does not descend from the pin; ``old``/``new``: (pin, local base)."""
    backwards = repo.is_ancestor(new[1], old[1])
    return SettingsError(
        f"{new[0][:12]} is "
        + ("behind the pin (an ancestor of it)" if backwards else "not a descendant of the pin")
        + f" {old[0][:12]}: refusing to move the pin {'backwards' if backwards else 'sideways'}",
        untouched=f"{settings.relative(settings.pin_file)} and the workdir",
        next_step="pass --allow-non-descendant if this is really meant",
    )


def refuse_drop_and_keep(keeping: Sequence[Patch], dropping: Sequence[Patch]) -> None:
    """Refuse patches named by both ``--drop`` and ``--keep``."""
    if set(keeping) & set(dropping):
        both = ", ".join(p.label for p in keeping if p in dropping)
        raise SettingsError(
            f"--drop and --keep both name {both}",
            untouched="everything: the pin and the queue",
            next_step="name each patch in one of --drop and --keep, then re-run `invoke pin-bump`",
        )
