"""The spot check follows the change: each model family the change touches, checked with its tiny model.

The maintainers' rule: "If the change adds or touches support for a specific model family,
spot-check a model of that family as well."  A build session's spot check runs the models asked
for (the default model when none) plus ``tiny:<name>`` of every family the change touches
(:mod:`skippy.maintain.touched`; the tiny model of an arch is
:func:`skippy.spot.tinymodels.for_arch`).  A touched family with no tiny model is shown in the
ending as **not run, no tiny model for <family>**, never passed in silence.

The change is measured from a *baseline*: after a session whose spot check passed on a prepared
tree, what it certified (patched commit, upstream commit, queue digest, backend, the models
checked) is recorded in ``<cache_dir>/certified/<workdir>-<hash>-<backend>.json``, one record per
workdir and backend; the next session of that backend diffs its tree against the recorded patched
commit.  With no record, a recorded commit the workdir no longer has, or a record of another
upstream commit (a pin move), the baseline is the pin: every family the queue touches.  A
``--workdir-as-is`` build diffs the work tree as it stands (uncommitted and untracked files
included) against the same baseline, and records nothing (its tree is no queue's).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal

from skippy.core.errors import CommandError
from skippy.core.files import write_text_atomic
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain.touched import Touched, touched_between, touched_in_work_tree
from skippy.queue import workdir as wd
from skippy.spot import tinymodels
from skippy.spot.models import DEFAULT_MODEL
from skippy.spot.report import Proof, SpotCheckReport

#: the records' folder under the cache dir
RECORD_DIR: Final = "certified"
RECORD_SCHEMA: Final = 1
#: the name of the ending's line that says what the change was measured from
FOLLOWED: Final = "families touched"


@dataclass(frozen=True)
class Certified:
    """What a build session whose spot check passed certified."""

    backend: str
    patched_sha: str
    upstream_sha: str
    queue_digest: str
    models: tuple[str, ...]
    workdir: str
    schema: int = RECORD_SCHEMA

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "models": list(self.models)}


def record_path(settings: Settings, workdir: Path, backend: str) -> Path:
    """The record of ``backend``'s builds of ``workdir``: under the cache dir, named by the
    workdir's name and a hash of its resolved path (two workdirs never share one)."""
    resolved = workdir.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return settings.cache_dir / RECORD_DIR / f"{resolved.name or 'root'}-{digest}-{backend}.json"


def read_record(path: Path) -> Certified | None:
    """The record at ``path``; None when there is none, or it cannot be read (then the pin is the
    baseline, which checks more, never less)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
        return None
    try:
        models = data["models"]
        fields = {k: data[k] for k in ("backend", "patched_sha", "upstream_sha", "queue_digest", "workdir")}
        if not all(isinstance(v, str) for v in fields.values()) or not isinstance(models, list):
            return None
        return Certified(**fields, models=tuple(str(m) for m in models))
    except KeyError:
        return None


def write_record(path: Path, certified: Certified) -> None:
    write_text_atomic(path, json.dumps(certified.as_dict(), indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class Baseline:
    """The tree the change is measured from."""

    commit: str
    kind: Literal["certified", "pin"]
    #: how the ending names it
    said: str

    def as_dict(self) -> dict[str, str]:
        return {"commit": self.commit, "kind": self.kind, "said": self.said}


@dataclass(frozen=True)
class Family:
    """A family the change touches, and the tiny model that checks it (None: there is none)."""

    touched: Touched
    model: str | None

    def as_dict(self) -> dict[str, object]:
        return {**self.touched.as_dict(), "model": self.model}


@dataclass(frozen=True)
class Following:
    """The families a session's change touches, from which baseline; or why it was not followed."""

    baseline: Baseline | None = None
    families: tuple[Family, ...] = ()
    #: why the change was not followed (None: it was)
    skipped: str | None = None

    def models(self, asked: tuple[str, ...]) -> tuple[str, ...]:
        """The spot check's models: those asked for (the default model when none), then the tiny
        model of each touched family that has one and was not asked for already; ``asked`` itself
        when nothing is added."""
        given = asked or (DEFAULT_MODEL,)
        have = {_family_of(m) for m in given if m.startswith("tiny:")}
        extra = tuple(dict.fromkeys(f.model for f in self.families if f.model and _family_of(f.model) not in have))
        return (*given, *extra) if extra else asked

    def as_dict(self) -> dict[str, object]:
        return {
            "baseline": self.baseline.as_dict() if self.baseline else None,
            "families": [f.as_dict() for f in self.families],
            "skipped": self.skipped,
        }


def _family_of(model: str) -> str:
    """``tiny:qwen2:q8_0`` -> ``qwen2``."""
    return model.split(":")[1] if model.startswith("tiny:") else ""


def _baseline(
    repo: Repo, record: Certified | None, *, backend: str, upstream_sha: str, stamp: wd.Stamp | None
) -> tuple[Baseline | None, str]:
    """The baseline, or None and why there is none."""
    if record is not None and record.upstream_sha == upstream_sha and repo.has_commit(record.patched_sha):
        models = ", ".join(record.models) or "no model"
        return (
            Baseline(
                record.patched_sha,
                "certified",
                f"the last {backend} build whose spot check passed (patched {record.patched_sha[:12]}; {models})",
            ),
            "",
        )
    if record is None:
        why = f"no earlier {backend} build of this workdir passed its spot check"
    elif record.upstream_sha != upstream_sha:
        why = f"the last {backend} build that passed was of upstream {record.upstream_sha[:12]}"
    else:
        why = f"the last {backend} build that passed ({record.patched_sha[:12]}) is no longer in the workdir"
    if stamp is not None and stamp.upstream_sha == upstream_sha and repo.has_commit(stamp.base_commit):
        pin = stamp.base_commit
    elif repo.has_commit(upstream_sha):
        pin = upstream_sha
    else:
        return None, f"{why}, and no commit of the workdir stands for upstream {upstream_sha[:12]}"
    return Baseline(pin, "pin", f"the pin {upstream_sha[:12]}, every family the queue touches ({why})"), ""


def follow_change(
    settings: Settings,
    backend: str,
    workdir: Path,
    *,
    patched_sha: str,
    upstream_sha: str,
    as_is: bool = False,
) -> Following:
    """The families touched between the baseline and the tree the session builds (the work tree
    as it stands when ``as_is``); read-only."""
    git_dir = wd.git_dir_of(workdir)
    if git_dir is None:
        return Following(skipped=f"{settings.relative(workdir)} is not a git checkout: no baseline to diff")
    repo = Repo(workdir, settings.env)
    record = read_record(record_path(settings, workdir, backend))
    baseline, why = _baseline(repo, record, backend=backend, upstream_sha=upstream_sha, stamp=wd.read_stamp(git_dir))
    if baseline is None:
        return Following(skipped=why)
    try:
        if as_is:
            touched = touched_in_work_tree(repo, baseline.commit)
        elif baseline.commit == patched_sha:
            touched = ()
        else:
            touched = touched_between(repo, baseline.commit, patched_sha)
    except CommandError as exc:  # the build goes on; the ending says the change was not followed
        new = "the work tree" if as_is else patched_sha[:12]
        return Following(baseline, skipped=f"git could not compare {baseline.commit[:12]} with {new}: {exc.what}")
    families = tuple(Family(t, _tiny(t.family)) for t in touched)
    return Following(baseline, families)


def _tiny(family: str) -> str | None:
    name = tinymodels.for_arch(family)
    return None if name is None else f"tiny:{name}"


def announce(following: Following, console: Console) -> None:
    """Say before the build what the spot check will add."""
    if following.skipped is not None:
        console.info(f"the spot check does not follow the change: {following.skipped}")
        return
    assert following.baseline is not None
    if not following.families:
        console.info(f"no model family touched since {following.baseline.said}")
        return
    named = ", ".join(f"{f.touched.family} ({f.model or 'no tiny model'})" for f in following.families)
    console.info(f"model families touched since {following.baseline.said}: {named}")


def certify(
    settings: Settings,
    backend: str,
    workdir: Path,
    *,
    patched_sha: str,
    upstream_sha: str,
    queue_digest: str,
    spot: SpotCheckReport,
) -> Path | None:
    """Record a passed spot check of a prepared tree as the next session's baseline (a check that
    did not run, or failed, records nothing); the record's path, or None."""
    if not spot.ok or spot.not_run is not None or wd.git_dir_of(workdir) is None:
        return None
    path = record_path(settings, workdir, backend)
    models = tuple(r.model for r in spot.results)
    write_record(path, Certified(backend, patched_sha, upstream_sha, queue_digest, models, str(workdir.resolve())))
    return path


def proofs(following: Following, spot: SpotCheckReport | None, not_run: str | None) -> list[Proof]:
    """The ending's lines: what the change was measured from, then one line per touched family
    (its tiny model's verdict, or not run and why)."""
    if following.skipped is not None:
        return [Proof(FOLLOWED, "not run", following.skipped)]
    assert following.baseline is not None
    names = ", ".join(f.touched.family for f in following.families) or "none"
    out = [Proof(FOLLOWED, "pass", f"{names}, since {following.baseline.said}")]
    for family in following.families:
        out.append(_family_proof(family, spot, not_run))
    return out


def _family_proof(family: Family, spot: SpotCheckReport | None, not_run: str | None) -> Proof:
    name = f"family {family.touched.family}"
    why = "; ".join(family.touched.reasons)
    if family.model is None:
        return Proof(name, "not run", f"no tiny model for {family.touched.family} ({why})")
    if spot is None or spot.not_run is not None:
        reason = spot.not_run if spot is not None and spot.not_run else not_run or "the spot check did not run"
        return Proof(name, "not run", f"{family.model}: {reason}")
    result = next((r for r in spot.results if _family_of(r.model) == _family_of(family.model)), None)
    if result is None:
        return Proof(name, "not run", f"{family.model} is not in the spot check's report")
    if result.ok:
        return Proof(name, "pass", f"{result.model} answered {result.content.strip()!r} ({why})")
    return Proof(name, "fail", f"{result.model}: {result.reason} ({why})")
