"""`invoke regenerate` loses nothing and never leaves an unverified queue: a linked patch dir is
backed up and restored through its link, file-system failures are named errors (not tracebacks),
and uncommitted work in the checkout is refused instead of being left out of the queue."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.core.errors import DirtyWorkdirError, QueueError, SkippyError, WorkdirError
from skippy.core.ui import Console
from skippy.maintain.regenerate import regenerate
from tests.conftest import Project
from tests.gitfixtures import git
from tests.integration.test_parity_fixtures import arch_upstream, commit_files, git_env, snapshot
from tests.integration.test_regenerate import branch_from, lanes_v1, run

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)
RERUN = "invoke regenerate --core-head core --model-support-head models"


def refs(repo: Path) -> str:
    return git(repo, "for-each-ref", "--format=%(objectname) %(refname)", env=git_env())


def crlf_on_models(project: Project) -> None:
    """A models commit whose CR line endings `format-patch` + `git am` cannot carry: verification fails."""
    branch_from(project.workdir, "models", "models")
    commit_files(project.workdir, "crlf", {"tools/run.bat": "@echo off\r\n"}, date="2024-06-06T10:00:00+0000")


def exported(project: Project) -> tuple[Path, dict[str, bytes]]:
    """Regenerate once (the queue of lanes_v1), link the patch dir: (the real folder, its bytes)."""
    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    (settings.patch_dir / "parity-allowlist.toml").write_text("# nothing dropped\n", encoding="utf-8")
    real = project.root / "queue" / "real-patches"
    settings.patch_dir.rename(real)
    settings.patch_dir.symlink_to("real-patches")
    return real, snapshot(real)


# ------------------------------------------------------------------ item 5: a linked patch dir


def test_linked_patch_dir_is_restored_through_the_link(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    link = settings.patch_dir
    # a success writes through the link and keeps it
    again = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert link.is_symlink() and link.readlink() == Path("real-patches")
    assert snapshot(real) == before
    assert {e.status for e in again.entries} == {"unchanged"}
    # a failed verification restores the real folder byte for byte, and the link stays a link
    crlf_on_models(project)
    with pytest.raises(QueueError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert "do not give the tree" in error.what
    assert "queue/patches was restored byte for byte from .deps/cache/backups/patches-" in (error.untouched or "")
    assert link.is_symlink() and link.readlink() == Path("real-patches")
    assert snapshot(real) == before
    # the backup this run made, as the error names it (two runs in one second sort by their random suffix)
    named = re.search(r"(patches-\S+?)(?=[\s,;)]|$)", error.untouched or "")
    assert named is not None, error.untouched
    newest = settings.cache_dir / "backups" / named.group(1)
    assert snapshot(newest) == before  # the backup holds the queue's bytes, not a link


def test_linked_lane_folder_is_restored_through_its_link(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    # link the model_support lane out of the (linked) patch dir as well
    lane_home = project.root / "lanes" / "model_support"
    lane_home.parent.mkdir()
    (real / "model_support").rename(lane_home)
    (real / "model_support").symlink_to(lane_home)
    lane_before = snapshot(lane_home)
    crlf_on_models(project)
    with pytest.raises(QueueError, match="do not give the tree"):
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert (real / "model_support").is_symlink()
    assert snapshot(lane_home) == lane_before
    assert {k: v for k, v in snapshot(real).items() if not k.startswith("model_support")} == {
        k: v for k, v in before.items() if not k.startswith("model_support")
    }


# ------------------------------------------------------------------ item 7: files that cannot be written


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i``: no entry can be created, removed or renamed in ``path``, not even by root
    (unlike a chmod, which root ignores).  Skips where the file system or the user cannot set it."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr is not installed: the immutable case cannot be staged here")
    probe = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot set the immutable flag here ({probe.stderr.strip()}): needs root on ext4/xfs/btrfs")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_immutable_patch_dir_is_a_named_error_and_nothing_changes(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    # a patch the export must create (an unchanged one is not written at all)
    (real / "0004-core-readme-note.patch").unlink()
    before = snapshot(real)
    before_refs = refs(project.workdir)
    with immutable(real), pytest.raises(QueueError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what.startswith("writing the new queue failed: cannot write queue/patches/")
    assert "Operation not permitted" in error.what
    assert error.untouched is not None and "queue/patches holds exactly its previous bytes" in error.untouched
    assert error.next_step is not None and RERUN in error.next_step
    assert snapshot(real) == before
    assert refs(project.workdir) == before_refs


def test_a_file_where_a_lane_folder_belongs_is_named_and_the_queue_restored(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    shutil.rmtree(real / "model_support")
    (real / "model_support").write_bytes(b"not a folder\n")
    (real / "0004-core-readme-note.patch").unlink()  # the export writes it back before it fails
    before = snapshot(real)
    with pytest.raises(QueueError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what == (
        "writing the new queue failed: cannot write queue/patches/model_support: File exists "
        "(a file stands where a folder is expected)"
    )
    assert "queue/patches was restored byte for byte" in (error.untouched or "")
    assert RERUN in (error.next_step or "")
    assert snapshot(real) == before


def test_unwritable_backup_folder_changes_nothing(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    backups = settings.cache_dir / "backups"
    shutil.rmtree(backups)
    backups.write_bytes(b"in the way\n")
    with pytest.raises(QueueError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what.startswith("backing up the queue failed: cannot write .deps/cache/backups")
    assert "a file stands where a folder is expected" in error.what
    assert error.untouched == "the queue: nothing was changed"
    assert snapshot(real) == before
    assert backups.read_bytes() == b"in the way\n"


def test_immutable_workdir_git_dir_is_a_named_error(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    before_refs = refs(project.workdir)
    with immutable(project.workdir / ".git"), pytest.raises(SkippyError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what.startswith("git worktree failed (exit code 128): fatal: could not create")
    assert ".git/worktrees/" in error.what and "Operation not permitted" in error.what
    assert error.untouched is not None and "queue/patches holds exactly its previous bytes" in error.untouched
    assert RERUN in (error.next_step or "")
    assert snapshot(real) == before
    assert refs(project.workdir) == before_refs


def test_immutable_lock_folder_is_a_named_error(project: Project) -> None:
    from skippy.queue.guard import lock_path

    real, before = exported(project)
    settings = project.settings()
    lock = lock_path(settings)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.unlink(missing_ok=True)
    with immutable(lock.parent), pytest.raises(WorkdirError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what == (
        f"regenerate failed: cannot write {settings.relative(lock)}: Operation not permitted "
        "(an immutable file or folder, or the file system refuses it)"
    )
    assert error.untouched == "the queue: nothing was changed"
    assert RERUN in (error.next_step or "")
    assert snapshot(real) == before
    assert not lock.exists()


# ------------------------------------------------------------------ item 10: uncommitted work is refused


def test_uncommitted_work_in_the_checkout_is_refused(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    wdir = project.workdir
    run(wdir, "checkout", "--quiet", "models")
    (wdir / "src" / "gemma3-extra.cpp").write_text("// gemma3, edited but not committed\n", encoding="utf-8")
    (wdir / "src" / "new-file.cpp").write_text("// never added\n", encoding="utf-8")
    (wdir / "build").mkdir()
    (wdir / "build" / "out.o").write_bytes(b"\0")  # a tolerated build output: not named
    before_refs = refs(wdir)
    backups = sorted((settings.cache_dir / "backups").iterdir())
    with pytest.raises(DirtyWorkdirError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what == ".deps/llama.cpp holds uncommitted changes that `regenerate` would not export (2 file(s))"
    assert error.details == "M  src/gemma3-extra.cpp\nuntracked  src/new-file.cpp"
    assert error.untouched == "everything: the queue and .deps/llama.cpp were not changed"
    assert "commit" in (error.next_step or "") and "stash --include-untracked" in (error.next_step or "")
    assert snapshot(real) == before
    assert refs(wdir) == before_refs
    assert (wdir / "src" / "gemma3-extra.cpp").read_text(encoding="utf-8") == "// gemma3, edited but not committed\n"
    assert sorted((settings.cache_dir / "backups").iterdir()) == backups  # not even a backup was made
    # committed onto the branch, the same edit is exported
    commit_files(
        wdir, "gemma3: edited", {"src/gemma3-extra.cpp": "// gemma3, edited\n"}, date="2024-06-08T10:00:00+0000"
    )
    (wdir / "src" / "new-file.cpp").unlink()
    report = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert [e.status for e in report.entries].count("new") == 1


def test_a_conflict_session_in_progress_is_refused(project: Project) -> None:
    real, before = exported(project)
    settings = project.settings()
    wdir = project.workdir
    (wdir / ".git" / "MERGE_HEAD").write_text(run(wdir, "rev-parse", "HEAD") + "\n", encoding="utf-8")
    with pytest.raises(DirtyWorkdirError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert "a merge in progress" in info.value.what
    assert snapshot(real) == before


def test_a_stray_entry_in_the_patch_dir_is_refused_before_anything(project: Project) -> None:
    real, _ = exported(project)
    settings = project.settings()
    (real / "model_support").rename(real / "model-support")
    before = snapshot(real)
    backups = sorted((settings.cache_dir / "backups").iterdir())
    with pytest.raises(QueueError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert error.what == "the patch dir queue/patches holds 1 entry that belongs to no lane"
    assert "[core] model-support: unknown folder" in (error.details or "")
    assert error.untouched == "everything: the queue was not changed"
    assert snapshot(real) == before
    assert sorted((settings.cache_dir / "backups").iterdir()) == backups
