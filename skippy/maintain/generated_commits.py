"""A commit of the workdir's history that names the generated lane must be that lane's patch.

``invoke regenerate`` never writes the generated lane (``invoke generate`` does): a commit whose
``Skippy-Patch: generated/...`` trailer puts it there but whose change is not the lane's patch
of that name would be dropped without a word, so it is refused before anything is written.
The commits are compared with the patches by blob id (one ``diff-tree --stdin``), and only a
patch without full blob ids is applied to tell.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from skippy.core import gitbulk
from skippy.core.errors import QueueError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.maintain.history import Commit, Lanes
from skippy.maintain.lanefiles import loose_items
from skippy.maintain.replay import Store
from skippy.queue import workdir as wd
from skippy.queue.model import Lane


def refuse_generated_changes(settings: Settings, store: Store, history: Lanes, rerun: str) -> None:
    """Refuse, before anything is written, a commit whose trailer puts it in the generated lane but
    whose change is not that lane's patch of the same name: regenerate never writes the generated
    lane (``invoke generate`` does), so the change would be dropped without a word."""
    generated = [c for c in history.commits if c.lane is Lane.GENERATED]
    if not generated:
        return
    repo = store.repo
    lane = {item.name: item for item in loose_items(settings.patch_dir) if item.lane == Lane.GENERATED.value}
    names = {c.sha: (c.label or "").split("/", 1)[1] for c in generated}
    changes = _commit_changes(repo, [c.sha for c in generated])
    found: list[tuple[Commit, str]] = []
    for commit in generated:
        name = names[commit.sha]
        if name not in lane:
            found.append((commit, f"the generated lane holds no {name}"))
            continue
        declared = _patch_changes(lane[name].data)
        if declared is not None and declared == changes.get(commit.sha):
            continue  # the same blobs and modes as the patch's full-index lines: exactly the patch
        why = _differs_from_patch(repo, commit.sha, settings.patch_dir / Lane.GENERATED.value / name)
        if why:
            found.append((commit, why))
    if not found:
        return
    rel = settings.relative(repo.path)
    first = found[0][0]
    named = ", ".join(f"{c.sha[:12]} ({c.subject})" for c, _ in found)
    raise QueueError(
        f"{'commit' if len(found) == 1 else 'commits'} {named} "
        f"{'carries' if len(found) == 1 else 'carry'} a `Skippy-Patch: generated/...` trailer but "
        f"{'its change is not' if len(found) == 1 else 'their changes are not'} the generated lane's patch: "
        "regenerate never writes the generated lane (`invoke generate` does), so the change would be dropped",
        details="\n".join(f"- {c.sha[:12]} Skippy-Patch: {c.label}: {why}" for c, why in found),
        untouched="everything: the queue and the workdir were not changed",
        next_step=f"move the change into a core or model_support commit: `git -C {rel} rebase -i "
        f"{store.base[:12]}`, `edit` {first.sha[:12]}, take your change out of it (the generated commit "
        "stays as the lane holds it) and commit it without a trailer after the generated commits (it joins "
        "model_support) or as a `--fixup` of a core/model_support commit; if it is the generator's change, "
        f"drop it there and run `invoke generate`; then re-run `{rerun}`",
    )


#: one file a change makes: (path, old blob, new blob, new mode); a null blob where the file is not
Changed = tuple[str, str, str, str]


def _commit_changes(repo: Repo, shas: list[str]) -> dict[str, frozenset[Changed]]:
    """The files each commit changes against its parent, by blob id (one ``diff-tree --stdin``)."""
    return {
        sha: frozenset((path, *change) for path, change in files.items())
        for sha, files in gitbulk.commit_changes(repo, shas).items()
    }


def _patch_changes(data: bytes) -> frozenset[Changed] | None:
    """The files a ``--full-index`` patch changes, by blob id, as :func:`_commit_changes` gives a
    commit's; None when a file of it carries no full blob ids (then only applying it tells)."""
    text = data.decode("utf-8", errors="replace")
    files = gitbulk.diff_files(text)
    if len(files) != text.count("\ndiff --git ") or any(len(c.old) != 40 or len(c.new) != 40 for c in files.values()):
        return None
    return frozenset((path, *change) for path, change in files.items())


def _differs_from_patch(repo: Repo, sha: str, patch: Path) -> str | None:
    """How commit ``sha`` differs from ``patch`` applied on its parent (None: it is that patch, exactly)."""
    scratch = wd.skippy_dir(repo.git_dir())
    scratch.mkdir(parents=True, exist_ok=True)
    index = scratch / "generated-check.index"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        repo.git("read-tree", f"{sha}^", env=env)
        applied = repo.git("apply", "--cached", "--whitespace=nowarn", str(patch.absolute()), env=env, check=False)
        if not applied.ok:
            return f"{patch.name} does not apply on its parent commit"
        tree = repo.git("write-tree", env=env).stdout.strip()
        differ = repo.git("diff", "--no-renames", "--name-only", tree, sha, check=False).stdout.splitlines()
    finally:
        with contextlib.suppress(FileNotFoundError):
            index.unlink()
    changed = [line for line in differ if line.strip()]
    return f"differs from {patch.name} (applied on its parent) in {', '.join(changed)}" if changed else None
