"""Each command applies the queue once at most (issue 42, part 2), counted at the process boundary.

A ``git`` on PATH ahead of the real one records every argv it is given, then runs the real git.
From that record: the patches ``git am --3way`` applied (its mail files are named after them),
the patches ``git apply`` applied (``--check`` excluded), the commits cherry-picked (``git
cherry-pick``, or ``git merge-tree --write-tree``, the same merge made without a checkout), the
``git am`` runs and the temporary worktrees added.  The fixture queue has 30 core and 10
model_support patches, each adding its own file and a line to one shared file (so each needs the
one before it), and a generated lane of two families made by the built-in generator.

The bounds, and why each is the least the command genuinely needs:

* ``invoke check`` applies every patch exactly once: its ``apply`` step, the whole queue with
  ``git am --3way`` as prepare applies it (at most one ``git am`` per lane).  The generated step makes the
  lane again aside on the core and model_support lanes applied there (it used to apply them a
  second time, in a worktree of their own).  Two worktrees: the one the queue is applied in, and
  the generator's sandbox (a generator edits files).
* ``invoke regenerate`` applies every core and model_support patch it exports exactly once, with
  ``git am`` (the verification that the exported lanes give the branch's tree: ``format-patch``
  then ``am`` is the round trip every prepare makes, and it is where CR line endings are lost,
  which a tree-level apply of the same files would not show).  The generated lane, made again on
  those lanes when its inputs changed, is then applied once on top of their commit (the whole
  queue must apply); it used to cost two more applications of the lanes.  When the workdir's
  history names the lanes, each generated commit is proved to be its patch by the blob ids of the
  patch's full-index lines (one ``diff-tree`` for all of them), not by applying it again: no
  patch is applied more than once.  A history out
  of lane order cherry-picks only the commits from the first one out of order on, tree-level
  (``git merge-tree``, no worktree), each once.  Three worktrees: the lanes', the generated
  lane's on top of them, and the generator's sandbox (it was four, and five out of lane order).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import generate
from skippy.maintain.regenerate import regenerate
from skippy.maintain.review import run_check
from skippy.queue.model import Lane, load_queue
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env
from tests.integration.test_generate import write_spec
from tests.integration.test_parity_fixtures import arch_upstream, commit_files, edit, git_env, snapshot

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)
CORE, MODEL_SUPPORT = 30, 10

#: records its argv (each argument NUL-terminated, a newline after the last), then runs the real
#: git; ``{old}`` may make it a git older than 2.38, whose merge-tree has no --write-tree
SHIM = """#!/bin/sh
{{ printf '%s\\0' "$@"; printf '\\n'; }} >> '{log}'
{old}exec '{git}' "$@"
"""
OLD_GIT = """case " $* " in *" merge-tree --write-tree "*) echo "error: unknown option" >&2; exit 129;; esac
"""


def subcommand(argv: list[str]) -> tuple[str, list[str]]:
    """The git subcommand of ``argv`` (after ``-c k=v``, ``-C dir``, ``--no-pager``) and its arguments."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg in ("-c", "-C"):
            index += 2
        elif arg.startswith("-"):
            index += 1
        else:
            return arg, argv[index + 1 :]
    return "", []


@dataclass
class Calls:
    """What the recorded git processes did."""

    argvs: list[list[str]]
    #: patch file name -> how many times ``git am`` or ``git apply`` applied it
    applied: Counter[str] = field(default_factory=Counter)
    #: commit -> how many times it was cherry-picked
    picked: Counter[str] = field(default_factory=Counter)
    am_runs: int = 0
    worktrees: int = 0

    @classmethod
    def read(cls, log: Path) -> Calls:
        raw = log.read_bytes().decode("utf-8", errors="replace") if log.exists() else ""
        calls = cls([record.split("\0") for record in raw.split("\0\n") if record])
        for argv in calls.argvs:
            sub, rest = subcommand(argv)
            options = [a for a in rest if a.startswith("-")]
            operands = [a for a in rest if not a.startswith("-")]
            if sub == "am" and "--3way" in options:
                calls.am_runs += 1
                calls.applied.update(Path(p).name[len("0001-") :] for p in operands)  # mails: NNNN-<patch>
            elif sub == "apply" and "--check" not in options:
                calls.applied.update(Path(p).name for p in operands)
            elif sub == "cherry-pick" and "--abort" not in options:
                calls.picked.update(operands)
            elif sub == "merge-tree" and "--write-tree" in options:
                calls.picked.update(operands[-1:])
            elif sub == "worktree" and rest[:1] == ["add"]:
                calls.worktrees += 1
        return calls


@dataclass
class Counted:
    """The fixture project, seen through a recording git."""

    project: Project
    bindir: Path
    log: Path
    real_git: str

    def settings(self, *, old_git: bool = False) -> Settings:
        shim = self.bindir / "git"
        shim.write_text(SHIM.format(log=self.log, git=self.real_git, old=OLD_GIT if old_git else ""), encoding="utf-8")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
        self.log.unlink(missing_ok=True)
        return self.project.settings(PATH=f"{self.bindir}{os.pathsep}{self.project.env['PATH']}")

    def calls(self) -> Calls:
        return Calls.read(self.log)

    def queue_names(self, *lanes: Lane) -> list[str]:
        return [p.name for p in load_queue(self.project.patches).patches if not lanes or p.lane in lanes]


def chain(project: Project, base: str, steps: list[tuple[str, dict[str, tuple[str, str] | str]]]) -> list[bytes]:
    """Patches made one on top of the other from ``base`` (a value: new content, or (old, new) in the file)."""
    scratch, env = project.scratch, git_env()
    git(project.upstream.path.parent, "clone", "--quiet", str(project.upstream.path), str(scratch), env=env)
    git(scratch, "checkout", "--quiet", "--detach", base, env=env)
    out: list[bytes] = []
    for index, (subject, files) in enumerate(steps):
        content = {rel: edit(scratch, rel, *v) if isinstance(v, tuple) else v for rel, v in files.items()}
        sha = commit_files(scratch, subject, content, date=f"2024-06-01T10:{index:02d}:00+0000")
        patch = git(scratch, "format-patch", "--stdout", "--zero-commit", "--no-signature", "-1", sha, env=env)
        out.append(patch.encode("utf-8"))
    return out


def steps_of(lane: str, numbers: range) -> list[tuple[str, dict[str, tuple[str, str] | str]]]:
    return [
        (
            f"{lane}: step {i:02d}",
            {
                f"src/{lane}/part{i:02d}.cpp": f"// {lane} part {i}\n",
                "src/downstream.txt": (f"{i - 1}\n", f"{i - 1}\n{i}\n"),
            },
        )
        for i in numbers
    ]


@pytest.fixture
def counted(project: Project, tmp_path: Path) -> Counted:
    """The fixture queue (30 core, 10 model_support, 2 generated patches) and a recording git."""
    base = arch_upstream(project)
    first: list[tuple[str, dict[str, tuple[str, str] | str]]] = [("core: step 00", {"src/downstream.txt": "0\n"})]
    steps = first + steps_of("core", range(1, CORE)) + steps_of("model_support", range(CORE, CORE + MODEL_SUPPORT))
    patches = chain(project, base, steps)
    for index, data in enumerate(patches[:CORE], start=1):
        project.add_patch("core", f"{index:04d}-core-step-{index - 1:02d}.patch", data)
    for index, data in enumerate(patches[CORE:], start=1):
        project.add_patch("model_support", f"{index:04d}-model-support-step-{CORE + index - 1:02d}.patch", data)
    write_spec(project)
    generate.run_generate(project.settings(), console=QUIET)
    real = shutil.which("git")
    assert real is not None
    bindir = tmp_path / "shim"
    bindir.mkdir()
    return Counted(project, bindir, tmp_path / "git-calls.log", real)


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"]))).strip()


def test_check_applies_each_patch_once(counted: Counted) -> None:
    report = run_check(counted.settings(), console=QUIET)
    calls = counted.calls()
    assert {s.name: s.status for s in report.steps} == {
        "queue": "ok",
        "apply": "ok",
        "parity": "ok",
        "generated": "ok",  # made again on the lanes apply applied: no drift
        "boundaries": "ok",
    }
    names = counted.queue_names()
    assert len(names) == CORE + MODEL_SUPPORT + 2
    assert calls.applied == Counter(names), "every patch applied exactly once"
    assert calls.am_runs <= 3, "at most one git am per lane"
    assert calls.worktrees == 2, "the queue's worktree and the generator's sandbox"
    assert not calls.picked
    # the commits are the ones a plain apply of the queue makes
    assert report.patched_sha == prepare(counted.project.settings(), Target.pinned(), console=QUIET).patched_sha


def test_regenerate_applies_each_lane_patch_once_and_the_generated_lane_on_top(counted: Counted) -> None:
    project = counted.project
    prepare(project.settings(), Target.pinned(), console=QUIET)
    # the fixture's patches were not written by regenerate's format-patch: every lane patch is
    # rewritten, so the generated lane's inputs change and it is made again
    report = regenerate(counted.settings(), console=QUIET)
    calls = counted.calls()
    assert report.generated == "regenerated"
    assert report.history is not None and not report.history.reordered
    lanes = counted.queue_names(Lane.CORE, Lane.MODEL_SUPPORT)
    generated = counted.queue_names(Lane.GENERATED)
    assert {name: calls.applied[name] for name in lanes} == dict.fromkeys(lanes, 1)
    # once, by git am: the workdir's generated commits are known to be those patches by their blob ids
    assert {name: calls.applied[name] for name in generated} == dict.fromkeys(generated, 1)
    assert set(calls.applied) == set(lanes + generated)
    assert calls.am_runs <= 3, "at most one git am per lane: the lanes, then the generated lane on top"
    assert calls.worktrees == 3, "the lanes', the generated lane's on their commit, the generator's sandbox"
    assert not calls.picked
    # the verified commit is the one prepare makes of the new queue
    assert prepare(project.settings(), Target.pinned(), console=QUIET).patched_sha == report.patched_sha


def test_regenerate_from_heads_applies_each_patch_once(counted: Counted) -> None:
    project = counted.project
    prepare(project.settings(), Target.pinned(), console=QUIET)
    wdir = project.workdir
    core = run_git(wdir, "log", "-1", "--format=%H", "--grep=^Skippy-Patch: core/0030-")
    models = run_git(wdir, "log", "-1", "--format=%H", "--grep=^Skippy-Patch: model_support/0010-")
    report = regenerate(counted.settings(), core_head=core, model_support_head=models, console=QUIET)
    calls = counted.calls()
    assert report.generated == "regenerated"
    assert calls.applied == Counter(counted.queue_names()), "every patch applied exactly once"
    assert calls.am_runs <= 3
    assert (calls.worktrees, len(calls.picked)) == (3, 0)


def test_a_history_out_of_lane_order_picks_only_what_is_out_of_order(counted: Counted) -> None:
    project = counted.project
    prepare(project.settings(), Target.pinned(), console=QUIET)
    regenerate(project.settings(), console=QUIET)  # normalized: the generated lane is kept from now on
    prepare(project.settings(), Target.pinned(), console=QUIET)
    wdir = project.workdir
    (wdir / "src/qwen.cpp").write_text("// qwen support\n", encoding="utf-8")
    run_git(wdir, "add", "src/qwen.cpp")
    run_git(wdir, "commit", "--quiet", "-m", "qwen: model support")
    new = run_git(wdir, "rev-parse", "HEAD")
    before = snapshot(project.patches)

    report = regenerate(counted.settings(), console=QUIET)
    calls = counted.calls()
    assert report.history is not None and report.history.reordered
    assert report.generated == "regenerated"  # a new model_support patch is one of its inputs
    assert calls.picked == Counter([new]), "the 40 commits already in lane order are kept as they are"
    assert max(calls.applied.values()) == 1
    assert calls.applied["0011-qwen-model-support.patch"] == 1
    assert calls.am_runs <= 3
    assert calls.worktrees == 3, "the picks made no worktree"
    after = snapshot(project.patches)

    # a git without merge-tree --write-tree cherry-picks in a worktree: the same queue, byte for byte
    shutil.rmtree(project.patches)
    for rel, data in before.items():
        (project.patches / rel).parent.mkdir(parents=True, exist_ok=True)
        (project.patches / rel).write_bytes(data)
    old = regenerate(counted.settings(old_git=True), console=QUIET)
    calls = counted.calls()
    assert old.history is not None and old.history.reordered
    picks = [subcommand(argv)[1] for argv in calls.argvs if subcommand(argv)[0] == "cherry-pick"]
    assert [argv[-1] for argv in picks] == [new], "cherry-picked in a worktree, only the commit out of order"
    assert calls.worktrees == 4, "the picks' worktree, then as above"
    assert snapshot(project.patches) == after
    assert old.patched_sha == report.patched_sha


def test_a_core_commit_at_the_end_goes_before_the_model_support_lane(counted: Counted) -> None:
    project = counted.project
    prepare(project.settings(), Target.pinned(), console=QUIET)
    wdir = project.workdir
    (wdir / "src/late.h").write_text("#define LATE 1\n", encoding="utf-8")
    run_git(wdir, "add", "src/late.h")
    run_git(wdir, "commit", "--quiet", "-m", "core: late\n\nSkippy-Patch: core/0031-core-late.patch")
    models = run_git(wdir, "log", "--format=%H", "--grep=^Skippy-Patch: model_support/").split()

    report = regenerate(counted.settings(), console=QUIET)
    calls = counted.calls()
    assert report.history is not None and report.history.reordered
    assert sorted(calls.picked) == sorted([run_git(wdir, "rev-parse", "HEAD"), *models])
    assert set(calls.picked.values()) == {1}, "the 30 core commits at the start are kept, the rest picked once"
    assert counted.queue_names(Lane.CORE)[-1] == "0031-core-late.patch"
    assert len(counted.queue_names(Lane.MODEL_SUPPORT)) == MODEL_SUPPORT
    core_files = run_git(wdir, "ls-tree", "-r", "--name-only", report.core_head, "src").split()
    assert "src/late.h" in core_files and not any(f.startswith("src/model_support/") for f in core_files)
    # the new queue, prepared, gives the workdir's tree: nothing was lost or reordered wrongly
    assert prepare(project.settings(), Target.pinned(), console=QUIET).action == "adopted"
