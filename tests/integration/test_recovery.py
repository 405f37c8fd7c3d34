"""Nothing lost, nothing orphaned: interrupted switches, damaged stamps, `--abort`, the compat link.

Real git throughout; kills are real signals sent by a stand-in `git` on PATH at a fixed point.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.core.errors import ConflictError, DirtyWorkdirError
from skippy.core.files import sha256_of
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare
from skippy.queue.session import resume
from skippy.queue.status import compute_status
from tests.busy import default_interrupts
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env
from tests.integration.test_conflicts import session_queue

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)

#: the patched commit of `queued_project` at its pin (same constant as test_prepare)
EXPECTED_PATCHED = "aba18d109e82b6f0a69317f97f15fac1aed5440d"


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def head(path: Path) -> str:
    return run_git(path, "rev-parse", "HEAD").strip()


def backup_refs(path: Path) -> list[str]:
    return run_git(path, "for-each-ref", "--format=%(refname)", wd.BACKUP_PREFIX).split()


def work_files(root: Path) -> dict[str, bytes]:
    """Bytes of every work-tree file (the .git dir left out)."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


# ------------------------------------------------------------------ an interrupted switch (items 1 and 3)

#: stands in for git; at the switch (`checkout --detach <sha>` without --force) it writes the
#: first changed file as git would have, then signals its parent (skippy's subprocess gate execs
#: it directly) and waits to be stopped: a kill in the middle of the checkout, at a fixed point
SWITCH_KILLER = """#!@PYTHON@
import os, signal, subprocess, sys, time
REAL = @REAL@
args = sys.argv[1:]
if "checkout" in args:
    rest = args[args.index("checkout") + 1 :]
    if "--force" not in rest and "--detach" in rest:
        repo, to = args[args.index("-C") + 1], rest[-1]
        def out(*a):
            return subprocess.run([REAL, "-C", repo, *a], capture_output=True, check=True).stdout
        changed = out("diff", "--name-only", "--diff-filter=AM", "HEAD", to).decode().split()
        with open(os.path.join(repo, changed[0]), "wb") as fh:
            fh.write(out("show", to + ":" + changed[0]))
        os.kill(os.getppid(), signal.SIG@SIG@)
        if "@SIG@" == "KILL":
            sys.exit(1)
        time.sleep(60)  # the interrupted parent stops us (SIGTERM to our process group)
        sys.exit(1)
os.execv(REAL, [REAL, *args])
"""


def interrupted_switch(project: Project, tmp_path: Path, sig: str) -> tuple[str, list[str]]:
    """Prepare the pin, then `--sha NEW` killed half-way through the switch; (NEW, changed paths)."""
    settings = project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    up = project.upstream
    new = up.commit(
        "upstream: touch two files",
        {"CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(llama CXX)\n", "NEW.md": "new\n"},
    )
    bindir = tmp_path / "killer-bin"
    bindir.mkdir()
    fake = bindir / "git"
    fake.write_text(
        SWITCH_KILLER.replace("@PYTHON@", sys.executable)
        .replace("@REAL@", repr(shutil.which("git")))
        .replace("@SIG@", sig)
    )
    fake.chmod(0o755)
    script = (
        "import os, sys\nfrom pathlib import Path\nfrom skippy.cli.entries import prepare_main\n"
        "sys.exit(prepare_main(os.environ, root=Path(sys.argv[1]), sha=sys.argv[2]))\n"
    )
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        [sys.executable, "-c", script, str(project.root), new],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # the SIGINT the stand-in sends must raise KeyboardInterrupt whatever this process inherited
        preexec_fn=default_interrupts,
    )
    if sig == "INT":
        assert result.returncode == 130, result.stderr
    else:
        assert result.returncode == -9, result.stderr
    wdir = project.workdir
    journal = wd.read_journal(wdir / ".git")
    assert journal is not None and journal.op == "switch", "the kill hit the switch"
    assert head(wdir) == EXPECTED_PATCHED, "git never finished the checkout"
    # the stand-in wrote the first changed file, as a half-done checkout leaves it
    assert (wdir / "CMakeLists.txt").read_text() == up.read("CMakeLists.txt", new)
    assert not (wdir / "NEW.md").exists()
    return new, ["CMakeLists.txt", "NEW.md", "src/llama-arch.cpp"]


@pytest.mark.parametrize("sig", ["INT", "KILL"])
def test_interrupted_switch_then_an_edit_is_refused_and_kept(queued_project: Project, tmp_path: Path, sig: str) -> None:
    new, _changed = interrupted_switch(queued_project, tmp_path, sig)
    wdir = queued_project.workdir
    assert compute_status(queued_project.settings()).would.startswith("finish the interrupted move to")
    # the maintainer edits a file the switch does not change
    (wdir / "README.md").write_bytes(b"my edit after the interruption\n")
    before = work_files(wdir)
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(queued_project.settings(), Target.at(new), console=QUIET)
    err = info.value
    assert f"interrupted while moving .deps/llama.cpp from {EXPECTED_PATCHED[:12]} to" in err.what
    assert "README.md: neither the old nor the new version" in (err.details or "")
    assert "CMakeLists.txt" not in (err.details or ""), "the file git wrote is skippy's own"
    assert "nothing was changed" in (err.untouched or "")
    assert "invoke prepare --force" in (err.next_step or "") and "checkout <backup ref> --" in (err.next_step or "")
    assert work_files(wdir) == before, "not a byte changed"
    assert head(wdir) == EXPECTED_PATCHED
    assert backup_refs(wdir) == []
    assert wd.read_journal(wdir / ".git") is not None, "the next run still knows the switch is unfinished"
    # --force: saved first, then the switch is finished
    report = prepare(queued_project.settings(), Target.at(new), console=QUIET, force=True)
    assert report.backup_ref is not None and backup_refs(wdir) == [report.backup_ref]
    assert run_git(wdir, "show", f"{report.backup_ref}:README.md") == "my edit after the interruption\n"
    assert "skippy backup before invoke prepare --force" in run_git(wdir, "log", "-1", "--format=%B", report.backup_ref)
    assert report.upstream_sha == new
    assert run_git(wdir, "merge-base", "--is-ancestor", new, "HEAD") == ""
    assert run_git(wdir, "status", "--porcelain") == ""
    assert (wdir / "NEW.md").read_text() == "new\n"
    assert wd.read_journal(wdir / ".git") is None


@pytest.mark.parametrize("sig", ["INT", "KILL"])
def test_interrupted_switch_is_finished_and_stamped_without_force(
    queued_project: Project, tmp_path: Path, sig: str
) -> None:
    new, _changed = interrupted_switch(queued_project, tmp_path, sig)
    wdir = queued_project.workdir
    (wdir / "build-cpu").mkdir()
    (wdir / "build-cpu" / "out.o").write_bytes(b"build output\n")
    report = prepare(queued_project.settings(), Target.at(new), console=QUIET)
    # the journal said what the interrupted run was making: finished and stamped, nothing re-applied
    assert report.action == "noop"
    assert any(n.startswith("finished the interrupted move") for n in report.notes)
    assert report.backup_ref is None and backup_refs(wdir) == []
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.upstream_sha == new and stamp.patched_sha == head(wdir)
    assert run_git(wdir, "status", "--porcelain") == ""
    assert (wdir / "build-cpu" / "out.o").read_bytes() == b"build output\n"
    assert wd.read_journal(wdir / ".git") is None
    # and back to the pin: a plain switch
    assert prepare(queued_project.settings(), Target.pinned(), console=QUIET).patched_sha == EXPECTED_PATCHED


@pytest.mark.parametrize("path", ["NEW.md", "src/llama-arch.cpp"])
def test_a_file_the_interrupted_switch_was_writing_is_saved_then_the_switch_is_finished(
    queued_project: Project, tmp_path: Path, path: str
) -> None:
    """A file of the switch holding neither version (a write cut short, or an edit made since:
    they cannot be told apart) is saved under a backup ref, and the switch is finished, saying so."""
    new, _changed = interrupted_switch(queued_project, tmp_path, "KILL")
    wdir = queued_project.workdir
    (wdir / path).write_bytes(b"neither version\n")
    report = prepare(queued_project.settings(), Target.at(new), console=QUIET)
    assert report.backup_ref is not None and backup_refs(wdir) == [report.backup_ref]
    assert run_git(wdir, "show", f"{report.backup_ref}:{path}") == "neither version\n"
    said = next(n for n in report.notes if "held neither version" in n)
    assert path in said and report.backup_ref in said
    assert f"git -C .deps/llama.cpp checkout {report.backup_ref} -- <path>" in said
    assert (wdir / path).read_text() == queued_project.upstream.read(path, new) or path != "NEW.md"
    assert run_git(wdir, "status", "--porcelain") == ""
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.upstream_sha == new


# ------------------------------------------------------------------ a missing or damaged stamp (item 3)


@pytest.mark.parametrize("damage", ["missing", "garbage", "wrong schema"])
def test_own_patched_commit_is_recognized_without_a_stamp(queued_project: Project, damage: str) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    path = wdir / ".git" / "skippy" / wd.STAMP_NAME
    good = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(good[: len(good) // 2])
    else:
        path.write_bytes(good.replace(b'"schema": 1', b'"schema": 99'))
    before = work_files(wdir)
    assert "replaying the queue" in compute_status(settings).would
    report = prepare(settings, Target.pinned(), console=QUIET)
    assert report.action == "noop"
    assert any("recognized HEAD" in n for n in report.notes)
    assert path.read_bytes() == good, "the same stamp as the run that made the commit"
    assert work_files(wdir) == before
    assert backup_refs(wdir) == []
    # with the stamp gone again, another target is a plain switch, no --force needed
    path.unlink()
    report = prepare(settings, Target.latest(), console=QUIET)
    assert report.action == "applied" and report.upstream_sha == queued_project.upstream.commits[2]


def test_local_commit_without_a_stamp_is_still_refused(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    wdir = queued_project.workdir
    (wdir / "README.md").write_bytes(b"fix\n")
    run_git(wdir, "commit", "--quiet", "-am", "my fix")
    mine = head(wdir)
    (wdir / ".git" / "skippy" / wd.STAMP_NAME).unlink()
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.latest(), console=QUIET)
    assert "holds commits that no upstream ref contains (no skippy stamp)" in (info.value.details or "")
    assert "nothing was changed" in (info.value.untouched or "")
    assert head(wdir) == mine
    assert (wdir / "README.md").read_bytes() == b"fix\n"


# ------------------------------------------------------------------ `--abort` loses nothing (item 2)


def test_abort_backs_up_and_keeps_unrelated_edits(project: Project) -> None:
    session_queue(project)
    settings = project.settings()
    wdir = project.workdir
    before = head(wdir)
    old_model = (wdir / "src/llama-model.cpp").read_bytes()
    with pytest.raises(ConflictError):
        prepare(settings, Target.latest(), console=QUIET)
    # a half-done resolution, an unrelated edit, a new file
    (wdir / "src/llama-model.cpp").write_bytes(b"half resolved\n")
    (wdir / "README.md").write_bytes(b"my readme edit\n")
    (wdir / "notes.txt").write_bytes(b"my notes\n")
    report = resume(settings, "abort", console=QUIET)
    assert report.action == "aborted"
    assert head(wdir) == before
    assert wd.in_progress(wdir / ".git") is None
    # kept as `git am --abort` keeps them: the unrelated edit and the new file
    assert (wdir / "README.md").read_bytes() == b"my readme edit\n"
    assert (wdir / "notes.txt").read_bytes() == b"my notes\n"
    # the file the session touched is back at the previous checkout; the resolution is in the backup
    assert (wdir / "src/llama-model.cpp").read_bytes() == old_model
    ref = report.backup_ref
    assert ref is not None and backup_refs(wdir) == [ref]
    assert run_git(wdir, "show", f"{ref}:src/llama-model.cpp") == "half resolved\n"
    assert run_git(wdir, "show", f"{ref}:README.md") == "my readme edit\n"
    assert run_git(wdir, "show", f"{ref}:notes.txt") == "my notes\n"
    assert "skippy backup before invoke prepare --abort" in run_git(wdir, "log", "-1", "--format=%B", ref)
    # the am session's own state is kept beside the ref, as --force does
    assert (wdir / ".git" / "skippy" / "backups" / ref.rsplit("/", 1)[1] / "rebase-apply").is_dir()
    assert any("src/llama-model.cpp" in n and ref in n for n in report.notes)
    assert any("README.md" in n and "kept" in n for n in report.notes)
    # the kept edits are local work: the next prepare refuses rather than walking over them
    with pytest.raises(DirtyWorkdirError):
        prepare(settings, Target.pinned(), console=QUIET)


def test_abort_saves_the_stopped_conflict_too(project: Project) -> None:
    """The conflicted file of the stopped patch is saved too (it may hold a resolution): one ref."""
    session_queue(project)
    settings = project.settings()
    with pytest.raises(ConflictError):
        prepare(settings, Target.latest(), console=QUIET)
    report = resume(settings, "abort", console=QUIET)
    assert run_git(project.workdir, "status", "--porcelain") == ""
    assert report.backup_ref is not None
    assert "<<<<<<<" in run_git(project.workdir, "show", f"{report.backup_ref}:src/llama-model.cpp")
    assert prepare(settings, Target.pinned(), console=QUIET).action == "noop"


# ------------------------------------------------------------------ the compat link (item 11)


def test_other_workdir_leaves_the_compat_link_alone(queued_project: Project, tmp_path: Path) -> None:
    link = queued_project.root / "llama.cpp"
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert link.is_symlink() and link.resolve() == queued_project.workdir.resolve()
    pointed = link.readlink()
    scratch = tmp_path / "scratch-workdir"
    report = prepare(queued_project.settings(LLAMA_WORKDIR=str(scratch)), Target.pinned(), console=QUIET)
    assert report.workdir == scratch and (scratch / ".git").is_dir()
    assert link.readlink() == pointed, "the link still names the configured workdir"
    assert any("left as it is" in n and "LLAMA_WORKDIR" in n for n in report.notes)
    shutil.rmtree(scratch)
    assert link.resolve() == queued_project.workdir.resolve() and link.exists(), "nothing dangles"
    # the same path given through LLAMA_WORKDIR is the configured workdir: the link is kept
    report = prepare(queued_project.settings(LLAMA_WORKDIR=str(queued_project.workdir)), Target.pinned(), console=QUIET)
    assert link.readlink() == pointed


def test_other_workdir_creates_no_link(queued_project: Project, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch-workdir"
    prepare(queued_project.settings(LLAMA_WORKDIR=str(scratch)), Target.pinned(), console=QUIET)
    assert not (queued_project.root / "llama.cpp").is_symlink()
    assert not (queued_project.root / "llama.cpp").exists()


# ------------------------------------------------------------------ other paths that overwrite files (item 1)


def test_skip_backs_up_a_half_done_resolution(project: Project) -> None:
    session_queue(project)
    settings = project.settings()
    wdir = project.workdir
    with pytest.raises(ConflictError):
        prepare(settings, Target.latest(), console=QUIET)
    (wdir / "src/llama-model.cpp").write_bytes(b"half resolved\n")
    report = resume(settings, "skip", console=QUIET)
    refs = backup_refs(wdir)
    assert len(refs) == 1
    assert run_git(wdir, "show", f"{refs[0]}:src/llama-model.cpp") == "half resolved\n"
    assert "skippy backup before invoke prepare --skip" in run_git(wdir, "log", "-1", "--format=%B", refs[0])
    assert any(refs[0] in n for n in report.notes)
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.resolved == ("core/0002-core-line-5.patch (skipped)",)


def test_force_on_a_shallow_clone_keeps_its_backup_after_the_reclone(queued_project: Project) -> None:
    wdir = queued_project.workdir
    wdir.parent.mkdir(parents=True)
    run_git(wdir.parent, "clone", "--quiet", "--depth=1", f"file://{queued_project.upstream.path}", str(wdir))
    (wdir / "README.md").write_bytes(b"my edit in the shallow clone\n")
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET, force=True)
    assert report.patched_sha == EXPECTED_PATCHED
    assert run_git(wdir, "rev-parse", "--is-shallow-repository").strip() == "false"
    assert report.backup_ref is not None and backup_refs(wdir) == [report.backup_ref]
    assert run_git(wdir, "show", f"{report.backup_ref}:README.md") == "my edit in the shallow clone\n"
    assert sorted(p.name for p in wdir.parent.iterdir()) == ["cache", "llama.cpp"]


def test_a_killed_reclone_puts_the_old_checkout_back(queued_project: Project) -> None:
    """What a hard kill during a re-clone leaves: the old checkout under its replaced name, no workdir."""
    wdir = queued_project.workdir
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    run_git(wdir, "update-ref", "refs/skippy/backups/20240101T000000Z", "HEAD")
    moved = wdir.parent / ".skippy-replaced-llama.cpp-deadbeef"
    wdir.rename(moved)
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert report.action == "noop"
    assert not moved.exists()
    assert backup_refs(wdir) == ["refs/skippy/backups/20240101T000000Z"]


def test_foreign_changes_sees_ignored_files_in_the_way(tmp_path: Path) -> None:
    """An ignored file where the new commit has one would be overwritten by a forced checkout."""
    from skippy.core.git import Repo

    env = hermetic_git_env(Path(os.environ["HOME"]))
    root = tmp_path / "r"
    root.mkdir()
    git(root, "init", "--quiet", env=env)
    (root / ".gitignore").write_text("*.o\n")
    (root / "a.txt").write_text("old\n")
    git(root, "add", ".", env=env)
    git(root, "commit", "--quiet", "-m", "old", env=env)
    old = git(root, "rev-parse", "HEAD", env=env).strip()
    (root / "a.txt").write_text("new\n")
    (root / "lib.o").write_text("shipped object\n")
    git(root, "add", "--force", ".", env=env)
    git(root, "commit", "--quiet", "-m", "new", env=env)
    new = git(root, "rev-parse", "HEAD", env=env).strip()
    git(root, "checkout", "--quiet", "--detach", old, env=env)
    repo = Repo(root, {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]})
    assert wd.foreign_changes(repo, old, new) == []
    (root / "a.txt").write_text("new\n")  # where an interrupted checkout got to: skippy's own
    (root / "lib.o").write_text("my own build output\n")  # ignored, in the way of the new commit
    (root / "other.o").write_text("ignored, in no commit\n")
    assert wd.foreign_changes(repo, old, new) == ["lib.o"]
    # what --force saves before finishing the switch holds the ignored file too
    ref = wd.save_backup(repo, root / ".git", wd.LocalWork(), "invoke prepare --force", also=("lib.o",))
    assert git(root, "show", f"{ref}:lib.o", env=env) == "my own build output\n"
    assert git(root, "show", f"{ref}:a.txt", env=env) == "new\n"
    assert (root / "lib.o").read_text() == "my own build output\n"
    (root / "lib.o").write_text("shipped object\n")
    (root / "a.txt").write_text("edited\n")
    assert wd.foreign_changes(repo, old, new) == ["a.txt"]


def test_archive_based_patched_commit_is_recognized_without_a_stamp(queued_project: Project) -> None:
    from tests.integration.test_archives_prepare import archive_of, configure

    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    configure(
        queued_project,
        (queued_project.root / "missing.git").as_uri(),
        {pin: (archive, sha256_of(archive))},
    )
    settings = queued_project.settings()
    first = prepare(settings, Target.pinned(), console=QUIET, offline=True)
    assert first.source == "archive"
    path = queued_project.workdir / ".git" / "skippy" / wd.STAMP_NAME
    good = path.read_bytes()
    path.unlink()
    report = prepare(settings, Target.pinned(), console=QUIET, offline=True)
    assert report.action == "noop" and report.source == "archive" and report.upstream_sha == pin
    assert path.read_bytes() == good


def test_refusal_after_finishing_a_switch_says_what_the_run_did(queued_project: Project, tmp_path: Path) -> None:
    new, _changed = interrupted_switch(queued_project, tmp_path, "KILL")
    wdir = queued_project.workdir
    (wdir / "notes.md").write_bytes(b"my notes\n")  # untracked, in neither commit: the switch cannot touch it
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert "1 untracked file(s): notes.md" in (info.value.details or "")
    untouched = info.value.untouched or ""
    assert "nothing was changed" not in untouched
    assert f"your work was not changed (this run only finished the interrupted move from {EXPECTED_PATCHED[:12]}" in (
        untouched
    )
    assert (wdir / "notes.md").read_bytes() == b"my notes\n"
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None and stamp.upstream_sha == new and head(wdir) == stamp.patched_sha


def test_a_stale_index_lock_is_removed_but_a_held_one_is_kept(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from skippy.queue import workdir as wd_

    git_dir = tmp_path / ".git"
    git_dir.mkdir()
    lock = git_dir / "index.lock"
    lock.write_bytes(b"half-written index")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1], 'rb'); print('open', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        assert wd_.held_open(lock) is True
        assert wd_.remove_stale_index_lock(git_dir) is None
        assert lock.read_bytes() == b"half-written index"  # a git still running keeps its lock
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    deadline = time.monotonic() + 5
    while wd_.held_open(lock) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wd_.remove_stale_index_lock(git_dir) == lock
    assert not lock.exists()
    assert wd_.held_open(lock, proc_root=tmp_path / "no-proc") is None
