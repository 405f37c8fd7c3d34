"""Re-prepare after a patch changed applies from the first changed patch (issue 42, part 3).

The commits before the first changed patch are reused from the last prepare (its stamp records
each patch's commit); the result must be the very commit a whole apply gives, on a fixture queue
of three patches in each lane, for a change in the first, a middle and the last patch of each
lane, a patch removed and one inserted.  The refusals of local work still come first, and a
conflict is reported as a whole apply reports it, with nothing half-applied.
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path

import pytest

from skippy.core.errors import ConflictError, DirtyWorkdirError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.apply import touched_paths
from skippy.queue.checkout import is_shallow_or_partial
from skippy.queue.model import load_queue
from skippy.queue.prepare import Target, prepare
from tests.conftest import MODEL_CPP, Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration

LANES = ("core", "model_support", "generated")
POSITIONS = {"first": 0, "middle": 1, "last": 2}


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def head(path: Path) -> str:
    return run_git(path, "rev-parse", "HEAD").strip()


def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(env={}, stream=out), out


def quiet() -> Console:
    return Console(quiet=True)


def name(lane: str, pos: int) -> str:
    return f"{pos + 1:04d}-{lane}-{pos + 1}.patch"


def make(project: Project, lane: str, pos: int, version: int, *, clash: bool = False, near: bool = False) -> bytes:
    """Patch ``pos`` of ``lane``: its own header file, one line of the model file (line 4, 8, ...
    by its place in the queue: far enough apart that every patch applies after the others) and,
    for the middle generated one, the README deleted.  ``clash``: it also rewrites the line the
    next patch of the queue edits; ``near``: it adds a line inside that patch's context (which
    then applies only by its 3-way merge)."""
    base = project.upstream.commits[1]
    g = LANES.index(lane) * 3 + pos
    line = 4 * (g + 1)
    model = MODEL_CPP.replace(f"// model line {line}\n", f"// patch {g} v{version}\n")
    if clash:
        model = model.replace(f"// model line {line + 4}\n", f"// clash from {g}\n")
    if near:
        model = model.replace(f"// model line {line + 2}\n", f"// model line {line + 2}\n// near from {g}\n")
    files: dict[str, str | None] = {
        "src/llama-model.cpp": model,
        f"src/{lane}-{pos}.h": f"// {lane} {pos} v{version}\n",
    }
    if (lane, pos) == ("generated", 1):
        files["README.md"] = None
    return project.patch(base, f"{lane}: patch {pos + 1} (v{version})", files)


def queue_of_nine(project: Project) -> None:
    for lane in LANES:
        for pos in range(3):
            project.add_patch(lane, name(lane, pos), make(project, lane, pos, 1))


def rewrite_lane(project: Project, lane: str, patches: list[tuple[str, bytes]]) -> None:
    """The lane's patches replaced by ``(subject part of the name, bytes)``, numbered in order."""
    folder = project.patches / lane
    for old in folder.glob("*.patch"):
        old.unlink()
    names = [f"{i:04d}-{stem}.patch" for i, (stem, _data) in enumerate(patches, start=1)]
    for file_name, (_stem, data) in zip(names, patches, strict=True):
        (folder / file_name).write_bytes(data)
    (folder / "series").write_text("".join(n + "\n" for n in names), encoding="utf-8")


def full_apply(project: Project, tmp: Path) -> tuple[str, Settings]:
    """HEAD of a cold prepare of the queue as it is now, in a workdir of its own (a whole apply)."""
    settings = project.settings(LLAMA_WORKDIR=str(tmp / "whole" / "llama.cpp"))
    report = prepare(settings, Target.pinned(), console=quiet(), interactive=False)
    assert report.action == "cloned"
    return report.patched_sha, settings


def work_files(root: Path) -> dict[str, tuple[int, bytes]]:
    state: dict[str, tuple[int, bytes]] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for f in files:
            path = Path(dirpath) / f
            state[str(path.relative_to(root))] = (path.stat().st_mtime_ns, path.read_bytes())
    return state


@pytest.fixture
def nine(project: Project) -> Project:
    queue_of_nine(project)
    return project


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("where", list(POSITIONS))
def test_a_changed_patch_is_applied_from_there_with_the_whole_apply_sha(
    nine: Project, tmp_path: Path, lane: str, where: str
) -> None:
    settings = nine.settings()
    first = prepare(settings, Target.pinned(), console=quiet())
    pos = POSITIONS[where]
    changed_at = LANES.index(lane) * 3 + pos
    nine.add_patch(lane, name(lane, pos), make(nine, lane, pos, 2))
    before = work_files(nine.workdir)

    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)

    expected, _ = full_apply(nine, tmp_path)
    assert report.action == "applied"
    assert report.patched_sha == expected != first.patched_sha
    assert head(nine.workdir) == expected
    said = out.getvalue()
    if changed_at:
        assert f"reusing the commits of the {changed_at} unchanged patch(es)" in said
    else:
        assert "reusing" not in said
    assert "check out the files the patches touch" in said
    # only the changed patch's files were rewritten in the checkout
    after = work_files(nine.workdir)
    rewritten = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert rewritten == sorted(["src/llama-model.cpp", f"src/{lane}-{pos}.h"])
    assert run_git(nine.workdir, "worktree", "list").count("\n") == 1
    stamp = wd.read_stamp(nine.workdir / ".git")
    assert stamp is not None and [e[2] for e in stamp.applied][-1] == expected


def test_a_removed_patch(nine: Project, tmp_path: Path) -> None:
    settings = nine.settings()
    prepare(settings, Target.pinned(), console=quiet())
    gen = nine.patches / "generated"
    kept = [
        ("generated-1", (gen / name("generated", 0)).read_bytes()),
        ("generated-3", (gen / name("generated", 2)).read_bytes()),
    ]
    rewrite_lane(nine, "generated", kept)
    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)
    expected, _ = full_apply(nine, tmp_path)
    assert report.patched_sha == head(nine.workdir) == expected
    assert "reusing the commits of the 7 unchanged patch(es)" in out.getvalue()
    assert (nine.workdir / "README.md").is_file()  # the removed patch deleted it


def test_the_last_patches_removed_reuse_a_commit_as_it_is(nine: Project, tmp_path: Path) -> None:
    settings = nine.settings()
    prepare(settings, Target.pinned(), console=quiet())
    stamp = wd.read_stamp(nine.workdir / ".git")
    assert stamp is not None
    rewrite_lane(nine, "generated", [("generated-1", (nine.patches / "generated" / name("generated", 0)).read_bytes())])
    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)
    assert report.patched_sha == stamp.applied[6][2]  # the commit of the seventh patch, as it was
    assert "git am" not in out.getvalue()
    expected, _ = full_apply(nine, tmp_path)
    assert report.patched_sha == expected


def test_an_inserted_patch(nine: Project, tmp_path: Path) -> None:
    settings = nine.settings()
    prepare(settings, Target.pinned(), console=quiet())
    base = nine.upstream.commits[1]
    extra = nine.patch(base, "model_support: a new one", {"src/inserted.h": "// inserted\n"})
    ms = nine.patches / "model_support"
    old = [(f"model_support-{pos + 1}", (ms / name("model_support", pos)).read_bytes()) for pos in range(3)]
    rewrite_lane(nine, "model_support", [old[0], ("inserted", extra), *old[1:]])
    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)
    expected, _ = full_apply(nine, tmp_path)
    assert report.patched_sha == head(nine.workdir) == expected
    assert "reusing the commits of the 4 unchanged patch(es)" in out.getvalue()
    assert "git am --3way: 6 patches (model_support 3 of 4, from 0002-inserted.patch; generated 3)" in out.getvalue()


def test_a_later_patch_merged_three_way_in_the_sparse_worktree(nine: Project, tmp_path: Path) -> None:
    settings = nine.settings()
    prepare(settings, Target.pinned(), console=quiet())
    nine.add_patch("core", name("core", 1), make(nine, "core", 1, 2, near=True))
    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)
    expected, _ = full_apply(nine, tmp_path)
    assert report.patched_sha == head(nine.workdir) == expected
    said = out.getvalue()
    assert "reusing the commits of the 1 unchanged patch(es)" in said
    assert "applying again in a full checkout" not in said
    assert "// near from 1\n// model line 11\n// patch 2 v1\n" in (nine.workdir / "src/llama-model.cpp").read_text()


def test_a_later_patch_that_conflicts_is_reported_as_a_whole_apply_reports_it(nine: Project, tmp_path: Path) -> None:
    settings = nine.settings()
    first = prepare(settings, Target.pinned(), console=quiet())
    # model_support 2 now rewrites the line model_support 3 edits: the third one conflicts
    nine.add_patch("model_support", name("model_support", 1), make(nine, "model_support", 1, 2, clash=True))
    before = work_files(nine.workdir)
    stamp_before = (nine.workdir / ".git" / "skippy" / "prepare.json").read_bytes()
    out_console, out = console()
    with pytest.raises(ConflictError) as incremental:
        prepare(settings, Target.pinned(), console=out_console, interactive=False)
    assert "applying again in a full checkout, to say what does not apply" in out.getvalue()
    with pytest.raises(ConflictError) as whole:
        full_apply(nine, tmp_path)
    failing = f"model_support/{name('model_support', 2)} does not apply"
    assert incremental.value.what.startswith(failing)
    assert incremental.value.what == whole.value.what
    assert "src/llama-model.cpp" in incremental.value.what
    # nothing half-applied: the checkout, HEAD and the stamp are as they were, no worktree left
    assert head(nine.workdir) == first.patched_sha
    assert work_files(nine.workdir) == before
    assert (nine.workdir / ".git" / "skippy" / "prepare.json").read_bytes() == stamp_before
    assert run_git(nine.workdir, "worktree", "list").count("\n") == 1


def test_uncommitted_work_is_refused_before_anything_is_applied(nine: Project) -> None:
    settings = nine.settings()
    first = prepare(settings, Target.pinned(), console=quiet())
    nine.add_patch("generated", name("generated", 2), make(nine, "generated", 2, 2))
    mine = nine.workdir / "src" / "core-0.h"
    mine.write_text("// my unsaved edit\n", encoding="utf-8")
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.pinned(), console=quiet())
    assert "src/core-0.h" in (info.value.details or "")
    assert mine.read_text(encoding="utf-8") == "// my unsaved edit\n"
    assert head(nine.workdir) == first.patched_sha


def test_a_local_commit_is_refused_before_anything_is_applied(nine: Project) -> None:
    settings = nine.settings()
    prepare(settings, Target.pinned(), console=quiet())
    nine.add_patch("core", name("core", 1), make(nine, "core", 1, 2))
    (nine.workdir / "src" / "mine.c").write_text("// mine\n", encoding="utf-8")
    run_git(nine.workdir, "add", "src/mine.c")
    run_git(nine.workdir, "commit", "--quiet", "-m", "local work")
    mine = head(nine.workdir)
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.pinned(), console=quiet())
    assert "1 commit(s) on top of the recorded patched commit" in (info.value.details or "")
    assert head(nine.workdir) == mine
    assert (nine.workdir / "src" / "mine.c").read_text(encoding="utf-8") == "// mine\n"


def test_a_stamp_without_the_commits_applies_the_whole_queue(nine: Project, tmp_path: Path) -> None:
    """A stamp of an older skippy (no ``applied`` list) or one whose commits are gone: the whole
    queue is applied again, to the same commit."""
    settings = nine.settings()
    prepare(settings, Target.pinned(), console=quiet())
    path = nine.workdir / ".git" / "skippy" / "prepare.json"
    stamp = wd.read_stamp(nine.workdir / ".git")
    assert stamp is not None and len(stamp.applied) == 9
    wd.write_stamp(nine.workdir / ".git", dataclasses.replace(stamp, applied=()))
    assert '"applied": []' in path.read_text(encoding="utf-8")
    nine.add_patch("generated", name("generated", 2), make(nine, "generated", 2, 2))
    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)
    assert "reusing" not in out.getvalue()
    expected, _ = full_apply(nine, tmp_path)
    assert report.patched_sha == expected
    assert len(wd.read_stamp(nine.workdir / ".git").applied) == 9  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["plain", "shallow", "promisor", "partial"])
def test_shallow_or_partial_is_told_by_one_git_command(nine: Project, how: str) -> None:
    """The check that runs on every prepare (a shallow or partial clone is re-cloned first)."""
    prepare(nine.settings(), Target.pinned(), console=quiet())
    git_dir = nine.workdir / ".git"
    if how == "shallow":
        (git_dir / "shallow").write_text(head(nine.workdir) + "\n", encoding="ascii")
    elif how == "promisor":
        run_git(nine.workdir, "config", "remote.origin.promisor", "true")
    elif how == "partial":
        run_git(nine.workdir, "config", "extensions.partialClone", "origin")
    repo = Repo(nine.workdir, nine.env)
    assert is_shallow_or_partial(repo, git_dir) is (how != "plain")


def test_a_quoted_path_is_checked_out_in_the_sparse_worktree(project: Project, tmp_path: Path) -> None:
    """A file name git quotes in a patch (non-ASCII, a space) made by one patch and edited by the
    next: re-applying the second checks the file out from the first one's commit by its real name."""
    base = project.upstream.commits[1]
    odd = "src/café à.h"
    made = project.patch(base, "core: an odd name", {odd: "// one\n"})
    assert b'diff --git "a/src/caf\\303\\251 \\303\\240.h" "b/src/caf\\303\\251 \\303\\240.h"' in made
    project.add_patch("core", "0001-core-an-odd-name.patch", made)
    scratch = project.scratch  # make_patch left it at the commit of the first patch

    def edit(text: str) -> bytes:
        (scratch / odd).write_text(text, encoding="utf-8")
        run_git(scratch, "commit", "--quiet", "-am", "core: edit the odd one")
        out = run_git(scratch, "format-patch", "--stdout", "--zero-commit", "--no-signature", "-1", "HEAD")
        run_git(scratch, "checkout", "--quiet", "--detach", "HEAD~1")
        return out.encode("utf-8")

    project.add_patch("core", "0002-core-edit-the-odd-one.patch", edit("// one\n// two\n"))
    settings = project.settings()
    # the sparse worktree checks the file out by the name git quoted in the patch
    assert touched_paths(load_queue(settings.patch_dir).patches) == {odd}
    prepare(settings, Target.pinned(), console=quiet())
    project.add_patch("core", "0002-core-edit-the-odd-one.patch", edit("// one\n// two, again\n"))
    out_console, out = console()
    report = prepare(settings, Target.pinned(), console=out_console)
    said = out.getvalue()
    assert "reusing the commits of the 1 unchanged patch(es)" in said
    assert "applying again in a full checkout" not in said
    assert (project.workdir / odd).read_text(encoding="utf-8") == "// one\n// two, again\n"
    expected, _ = full_apply(project, tmp_path)
    assert report.patched_sha == expected
