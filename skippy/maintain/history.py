"""The lanes of a workdir's history, read from the ``Skippy-Patch`` trailers (no branch names).

prepare writes ``Skippy-Patch: <lane>/<file>`` into every commit it applies
(:mod:`skippy.queue.mail`).  A maintainer then works with plain git moves on the
workdir's HEAD: ``git commit --fixup=<commit>`` + ``git rebase -i --autosquash``
(the squashed commit keeps its trailer), a new commit anywhere (it has no trailer:
it joins the lane of the commit before it; after a generated commit, or as the
first commit, see :func:`lane_of_new`).  :func:`lanes_of` turns ``base..HEAD`` into
a core head and a model-support head for :func:`skippy.maintain.regenerate.regenerate`:
directly when the commits are already in lane order, else by cherry-picking the core and
model-support commits in lane order, tree-level (``git merge-tree``: no checkout; the generated
commits are left out: the generated lane is regenerated from its inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import CommandError, QueueError
from skippy.core.git import Repo
from skippy.queue.mail import label_of
from skippy.queue.model import LANES, Lane
from skippy.queue.triage import aside_worktree


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    #: the lane and patch file its trailer names, or None for a new commit
    label: str | None
    lane: Lane


@dataclass(frozen=True)
class Lanes:
    commits: tuple[Commit, ...]
    core_head: str
    model_support_head: str
    #: True when the core and model-support commits were replayed in lane order aside
    reordered: bool

    def new(self) -> tuple[Commit, ...]:
        return tuple(c for c in self.commits if c.label is None)


def lane_of_new(previous: Lane | None) -> Lane:
    """The lane of a commit without trailer: the lane of the commit before it; the core lane for
    the first commit; model_support after a generated commit (the generated lane is never written
    by hand)."""
    if previous is None:
        return Lane.CORE
    return Lane.MODEL_SUPPORT if previous is Lane.GENERATED else previous


def refuse_merges(repo: Repo, lower: str, upper: str, *, what: str, next_step: str) -> None:
    """Every commit of ``lower..upper`` must be one patch: merge commits are refused, named."""
    merges = repo.out("rev-list", "--merges", f"{lower}..{upper}").split()
    if merges:
        raise QueueError(
            f"{what}: {len(merges)} merge commit(s) in {lower[:12]}..{upper[:12]} "
            f"({', '.join(m[:12] for m in merges)}): every commit must be one patch",
            untouched="everything: the queue was not changed",
            next_step=next_step,
        )


def read_commits(repo: Repo, base: str, head: str, *, rerun: str) -> tuple[Commit, ...]:
    """``base..head`` oldest first, each with its lane; a merge or an unknown lane is refused."""
    refuse_merges(
        repo,
        base,
        head,
        what="the workdir's history",
        next_step=f"linearize it (`git -C {repo.path} rebase {base[:12]}`), then re-run `{rerun}`",
    )
    out = repo.out("log", "--reverse", "--format=%H%x1f%s%x1f%B%x1e", f"{base}..{head}")
    commits: list[Commit] = []
    previous: Lane | None = None
    known = {lane.value: lane for lane in LANES}
    for record in out.split("\x1e"):
        if not record.strip():
            continue
        sha, subject, body = record.strip("\n").split("\x1f", 2)
        label = label_of(body)
        if label is None:
            lane = lane_of_new(previous)
        else:
            lane_name = label.split("/", 1)[0]
            if lane_name not in known or "/" not in label:
                raise QueueError(
                    f"commit {sha[:12]} ({subject}) names an unknown lane in its trailer: Skippy-Patch: {label}",
                    untouched="everything: the queue was not changed",
                    next_step=f"reword it (`git -C {repo.path} rebase -i {base[:12]}`, `reword`) to "
                    "`Skippy-Patch: core/<file>` or `model_support/<file>`, or drop the line, then re-run "
                    f"`{rerun}`",
                )
            lane = known[lane_name]
        commits.append(Commit(sha, subject, label, lane))
        previous = lane
    return tuple(commits)


def lanes_of(repo: Repo, git_dir: Path, base: str, head: str, *, rerun: str) -> Lanes:
    """The core and model-support heads that ``base..head`` stands for (see the module docstring)."""
    commits = read_commits(repo, base, head, rerun=rerun)
    if commits and all(c.label is None for c in commits):
        raise QueueError(
            f"none of the {len(commits)} commit(s) on {base[:12]} carries a Skippy-Patch trailer, so their "
            "lanes are unknown (a tree prepared by an older skippy, or commits not made by prepare)",
            untouched="everything: the queue was not changed",
            next_step="name the lanes: `invoke regenerate --core-head <last core commit> --model-support-head "
            f"<last model_support commit>` (`git -C {repo.path} log --oneline {base[:12]}..HEAD` lists them); "
            "a tree prepared by this skippy marks its commits (`invoke prepare` re-marks a clean workdir "
            "without rewriting a file)",
        )
    hand = [c for c in commits if c.lane is not Lane.GENERATED]
    order = [LANES.index(c.lane) for c in commits]  # lane order: core, model_support, generated
    if order == sorted(order):
        core = next((c.sha for c in reversed(hand) if c.lane is Lane.CORE), base)
        ms = hand[-1].sha if hand else base
        return Lanes(commits, core, ms, reordered=False)
    core, ms = _replay_in_lane_order(repo, git_dir, base, commits, rerun=rerun)
    return Lanes(commits, core, ms, reordered=True)


def _replay_in_lane_order(
    repo: Repo, git_dir: Path, base: str, commits: tuple[Commit, ...], *, rerun: str
) -> tuple[str, str]:
    """The core commits, then the model-support ones, on ``base``; the two heads.

    The commits that already stand in lane order at the start of the history (no generated commit
    before them) are kept as they are; the rest are cherry-picked on them.  Tree-level (git 2.38+):
    each pick is ``git merge-tree --write-tree`` (the merge cherry-pick makes: base the commit's
    parent, ours the head so far, theirs the commit) and ``git commit-tree`` with the commit's
    author and message; no checkout, no index: nothing in the workdir is touched.  An older git,
    whose merge-tree has no ``--write-tree``, cherry-picks in a temporary worktree instead."""
    ordered = [c for lane in (Lane.CORE, Lane.MODEL_SUPPORT) for c in commits if c.lane is lane]
    kept = 0
    while kept < len(ordered) and commits[kept] is ordered[kept]:
        kept += 1
    head = ordered[kept - 1].sha if kept else base
    core = next((c.sha for c in reversed(ordered[:kept]) if c.lane is Lane.CORE), base)
    try:
        return _pick_tree_level(repo, base, head=head, core=core, picks=ordered[kept:], rerun=rerun)
    except _NoWriteTree:
        return _pick_in_worktree(repo, git_dir, base, head=head, core=core, picks=ordered[kept:], rerun=rerun)


#: git's exit code for an option it does not know
USAGE = 129


class _NoWriteTree(Exception):
    """This git's ``merge-tree`` has no ``--write-tree`` (before git 2.38)."""


@dataclass(frozen=True)
class _Authored:
    parent: str
    name: str
    email: str
    date: str  # git's internal form: seconds and offset
    message: str


def _authored(repo: Repo, picks: list[Commit]) -> list[_Authored]:
    """Parent, author and message of each of ``picks`` (one ``git log``)."""
    if not picks:
        return []
    out = repo.git(
        "log", "--no-walk=unsorted", "--date=raw", "--format=%P%x1f%an%x1f%ae%x1f%ad%x1f%B%x1e", *(c.sha for c in picks)
    ).stdout
    records = [r.lstrip("\n") for r in out.split("\x1e")][: len(picks)]
    found = []
    for record in records:
        parent, name, email, date, message = record.split("\x1f", 4)
        found.append(_Authored(parent.strip(), name, email, date, message))
    return found


def _pick_tree_level(
    repo: Repo, base: str, *, head: str, core: str, picks: list[Commit], rerun: str
) -> tuple[str, str]:
    tree = repo.out("rev-parse", f"{head}^{{tree}}")
    for commit, info in zip(picks, _authored(repo, picks), strict=True):
        # merge-tree merges on the merge base of its two sides: a stand-in for the head so far
        # whose parent is the commit's parent makes that parent the base, as cherry-pick does
        dated = {"GIT_AUTHOR_DATE": info.date, "GIT_COMMITTER_DATE": info.date}
        ours = repo.git("commit-tree", tree, "-p", info.parent, "-m", "stand-in", env=dated).stdout.strip()
        merged = repo.git("merge-tree", "--write-tree", "--messages", ours, commit.sha, check=False)
        if merged.returncode == USAGE:
            raise _NoWriteTree(merged.tail())
        if merged.returncode == 1:
            raise _out_of_order(repo, base, commit, merged.tail(), rerun=rerun)
        if merged.returncode != 0:
            raise CommandError(
                f"git merge-tree failed (exit code {merged.returncode})",
                argv=merged.argv,
                returncode=merged.returncode,
                output_tail=merged.tail(),
                untouched="everything: the queue and the workdir were not changed",
                next_step=f"re-run `{rerun}`; `git -C {repo.path} fsck` looks for a damaged object",
            )
        tree = merged.stdout.split("\n", 1)[0].strip()
        env = {"GIT_AUTHOR_NAME": info.name, "GIT_AUTHOR_EMAIL": info.email, **dated}
        head = repo.git("commit-tree", tree, "-p", head, input=info.message, env=env).stdout.strip()
        if commit.lane is Lane.CORE:
            core = head
    return core, head


def _out_of_order(repo: Repo, base: str, commit: Commit, output: str, *, rerun: str) -> QueueError:
    return QueueError(
        f"commit {commit.sha[:12]} ({commit.subject}) of the {commit.lane.value} lane does not apply "
        "in lane order (core commits first, then model_support): it depends on a commit of "
        "a later lane",
        details=output,
        untouched="everything: the queue and the workdir were not changed",
        next_step=f"move it with `git -C {repo.path} rebase -i {base[:12]}` (core commits "
        "first, then model_support; the generated commits are regenerated), then re-run "
        f"`{rerun}`",
    )


def _pick_in_worktree(
    repo: Repo, git_dir: Path, base: str, *, head: str, core: str, picks: list[Commit], rerun: str
) -> tuple[str, str]:
    """Cherry-pick ``picks`` on ``head`` in a temporary worktree (the workdir's checkout is not
    touched); the two heads."""
    with aside_worktree(repo, git_dir, head) as work:
        for commit in picks:
            result = work.git("cherry-pick", "--allow-empty", "--keep-redundant-commits", commit.sha, check=False)
            if not result.ok:
                work.git("cherry-pick", "--abort", check=False)
                raise _out_of_order(repo, base, commit, result.tail(), rerun=rerun)
            if commit.lane is Lane.CORE:
                core = work.out("rev-parse", "HEAD")
        return core, work.out("rev-parse", "HEAD")
