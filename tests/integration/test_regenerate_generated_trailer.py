"""A commit whose trailer puts it in the generated lane is refused by `invoke regenerate` when its
change is not that lane's patch (regenerate never writes the generated lane, so the change used to
be dropped while regenerate said "verified"): named, with the next command, before anything is
written."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from skippy.cli.entries import prepare_main, regenerate_main
from skippy.core.errors import QueueError
from skippy.queue import workdir as wd
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def state(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``folder``: bytes, mode and mtime (a rewrite with the same bytes shows)."""
    out: dict[str, tuple[bytes, int, int]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            info = path.stat()
            out[str(path.relative_to(folder))] = (path.read_bytes(), info.st_mode, info.st_mtime_ns)
    return out


def generated_commit(wdir: Path) -> str:
    found = run_git(wdir, "log", "--format=%H", "--grep=^Skippy-Patch: generated/0001-family-llama.patch$").split()
    assert len(found) == 1
    return found[0]


def refused(project: Project, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """`invoke regenerate --json` refused: its report; nothing of the queue, the cache or the
    workdir was written."""
    settings = project.settings()
    wdir = project.workdir
    queue = state(project.patches)
    head = run_git(wdir, "rev-parse", "HEAD")
    skippy_files = sorted(p.name for p in wd.skippy_dir(wdir / ".git").iterdir())
    cache = sorted(str(p.relative_to(settings.cache_dir)) for p in settings.cache_dir.rglob("*"))
    assert regenerate_main(project.env, root=project.root, json=True) == QueueError.exit_code
    captured = capsys.readouterr()
    report: dict[str, object] = json.loads(captured.out)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "QueueError", QueueError.exit_code)
    assert "verified" not in captured.err
    assert state(project.patches) == queue, "no patch file was written"
    assert not (settings.cache_dir / "backups").exists(), "no backup: nothing was about to be written"
    assert sorted(str(p.relative_to(settings.cache_dir)) for p in settings.cache_dir.rglob("*")) == cache
    assert run_git(wdir, "rev-parse", "HEAD") == head
    assert sorted(p.name for p in wd.skippy_dir(wdir / ".git").iterdir()) == skippy_files
    assert run_git(wdir, "status", "--porcelain") == ""
    assert report["untouched"] == "everything: the queue and the workdir were not changed"
    nxt = str(report["next"])
    assert "`invoke generate`" in nxt and "re-run `invoke regenerate`" in nxt
    assert "core or model_support commit" in nxt
    return report


def test_a_fixup_squashed_into_a_generated_commit_is_refused_by_name(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    wdir = queued_project.workdir
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None
    (wdir / "src/generated/llama.inc").write_text("// generated llama\n// and my edit\n")
    run_git(wdir, "commit", "--quiet", "-a", f"--fixup={generated_commit(wdir)}")
    subprocess.run(
        ["git", "-C", str(wdir), "rebase", "--quiet", "-i", "--autosquash", stamp.base_commit],
        env={**hermetic_git_env(Path(os.environ["HOME"])), "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
        capture_output=True,
    )
    squashed = generated_commit(wdir)
    capsys.readouterr()
    report = refused(queued_project, capsys)
    assert report["what"] == (
        f"commit {squashed[:12]} (generated: family llama) carries a `Skippy-Patch: generated/...` trailer but "
        "its change is not the generated lane's patch: regenerate never writes the generated lane "
        "(`invoke generate` does), so the change would be dropped"
    )
    assert report["details"] == (
        f"- {squashed[:12]} Skippy-Patch: generated/0001-family-llama.patch: differs from 0001-family-llama.patch "
        "(applied on its parent) in src/generated/llama.inc"
    )
    assert f"`edit` {squashed[:12]}" in str(report["next"])
    assert f"rebase -i {stamp.base_commit[:12]}" in str(report["next"])


def test_a_new_commit_with_a_generated_trailer_is_refused_by_name(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    wdir = queued_project.workdir
    (wdir / "src/mine.cpp").write_text("// mine\n")
    run_git(wdir, "add", "src/mine.cpp")
    run_git(wdir, "commit", "--quiet", "-m", "mine\n\nSkippy-Patch: generated/0002-family-mine.patch")
    mine = run_git(wdir, "rev-parse", "HEAD").strip()
    capsys.readouterr()
    report = refused(queued_project, capsys)
    assert str(report["what"]).startswith(f"commit {mine[:12]} (mine) carries a `Skippy-Patch: generated/...`")
    assert report["details"] == (
        f"- {mine[:12]} Skippy-Patch: generated/0002-family-mine.patch: the generated lane holds no "
        "0002-family-mine.patch"
    )


def test_an_untouched_generated_commit_is_known_by_its_blob_ids_without_applying_the_patch(
    queued_project: Project,
) -> None:
    """Regenerate tells the generated commits it keeps from the patch's full-index lines and one
    diff-tree of all of them: a whitespace edit or a mode change still differs, and a patch without
    full blob ids (the fixture's, made by a plain format-patch) is left to the apply check."""
    from skippy.core.git import Repo
    from skippy.maintain.generated_commits import _commit_changes, _patch_changes
    from skippy.maintain.replay import export_commit

    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    wdir = queued_project.workdir
    sha = generated_commit(wdir)
    repo = Repo(wdir, hermetic_git_env(Path(os.environ["HOME"])))
    patch = export_commit(repo, sha)  # as `invoke generate` writes the lane: full blob ids
    assert _patch_changes((queued_project.patches / "generated" / "0001-family-llama.patch").read_bytes()) is None
    declared = _patch_changes(patch)
    assert declared is not None and declared == _commit_changes(repo, [sha])[sha]
    assert {path for path, *_ in declared} == {"src/generated/llama.inc"}

    (wdir / "src/generated/llama.inc").write_text("// generated llama \n")  # one trailing space
    run_git(wdir, "commit", "--quiet", "-a", "-m", "space")
    spaced = run_git(wdir, "rev-parse", "HEAD").strip()
    run_git(wdir, "update-index", "--chmod=+x", "src/generated/llama.inc")
    run_git(wdir, "commit", "--quiet", "-m", "mode")
    moded = run_git(wdir, "rev-parse", "HEAD").strip()
    changes = _commit_changes(repo, [sha, spaced, moded])
    assert changes[spaced] != declared and changes[moded] != declared
    assert [mode for _p, _o, _n, mode in changes[moded]] == ["100755"]
