"""`invoke prepare` against fixture upstreams with real git."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.core.errors import (
    ConflictError,
    DirtyWorkdirError,
    LockBusyError,
    NetworkError,
    SettingsError,
    WorkdirError,
)
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.guard import lock_path
from skippy.queue.prepare import Target, prepare
from skippy.queue.status import compute_status
from skippy.queue.target import read_pin
from tests.busy import default_interrupts
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration

#: the patched commit of `queued_project` (fixture upstream + queue are deterministic)
EXPECTED_PATCHED = "aba18d109e82b6f0a69317f97f15fac1aed5440d"

QUIET = Console(quiet=True)


def tree_state(root: Path) -> dict[str, tuple[int, bytes]]:
    """mtime and content of every file under root (the .git dir included)."""
    state: dict[str, tuple[int, bytes]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.is_symlink():
                continue
            state[str(path.relative_to(root))] = (path.stat().st_mtime_ns, path.read_bytes())
    return state


def run_git(path: Path, *args: str) -> str:
    env = hermetic_git_env(Path(os.environ["HOME"]))
    return git(path, *args, env=env)


def head(path: Path) -> str:
    return run_git(path, "rev-parse", "HEAD").strip()


# ------------------------------------------------------------------ the happy path


def test_cold_prepare_applies_three_lanes_deterministically(queued_project: Project) -> None:
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert report.action == "cloned"
    assert report.upstream_sha == queued_project.upstream.commits[1]
    assert report.patched_sha == EXPECTED_PATCHED
    wdir = queued_project.workdir
    assert head(wdir) == EXPECTED_PATCHED
    subjects = run_git(wdir, "log", "--format=%s", f"{report.upstream_sha}..HEAD").splitlines()
    assert subjects == [
        "generated: family llama",
        "gemma3: runtime adaptation",
        "core: add provenance",
        "core: add a hook point",
    ]
    # every commit names the lane and patch file it came from (the queue's files do not)
    trailers = run_git(wdir, "log", "--format=%(trailers:key=Skippy-Patch,valueonly)", f"{report.upstream_sha}..HEAD")
    assert trailers.split() == [
        "generated/0001-family-llama.patch",
        "model_support/0001-gemma3-runtime-adaptation.patch",
        "core/0002-core-add-provenance.patch",
        "core/0001-core-add-a-hook-point.patch",
    ]
    model = (wdir / "src/llama-model.cpp").read_text()
    assert "HOOK" in model
    assert "GEMMA" in model
    assert (wdir / "src/generated/llama.inc").exists()
    assert run_git(wdir, "status", "--porcelain") == ""
    # committer = author date, fixed identity
    log = run_git(wdir, "log", "-1", "--format=%an|%ad|%cn|%ce|%cd", "--date=raw", "HEAD")
    assert log.strip() == "Downstream Dev|1714636800 +0200|skippy|skippy@localhost|1714636800 +0200"
    stamp = wd.read_stamp(wdir / ".git")
    assert stamp is not None
    assert (stamp.upstream_sha, stamp.patched_sha, stamp.schema) == (report.upstream_sha, EXPECTED_PATCHED, 1)
    assert stamp.queue_digest == report.queue_digest
    link = queued_project.root / "llama.cpp"
    assert link.is_symlink()
    assert link.resolve() == wdir.resolve()


def test_same_sha_whatever_the_users_git_config_and_timezone(queued_project: Project, hermetic_seal: Path) -> None:
    (hermetic_seal / ".gitconfig").write_text(
        "[user]\n name = Someone Else\n email = else@example.invalid\n"
        "[core]\n autocrlf = true\n hooksPath = /nonexistent\n"
        "[commit]\n gpgSign = true\n[am]\n threeWay = false\n keepcr = true\n messageid = true\n"
        "[apply]\n whitespace = error\n[format]\n signature = evil\n",
        encoding="utf-8",
    )
    settings = queued_project.settings(TZ="Pacific/Kiritimati", LC_ALL="de_DE.UTF-8")
    report = prepare(settings, Target.pinned(), console=QUIET)
    assert report.patched_sha == EXPECTED_PATCHED


def test_second_run_is_a_noop_touching_no_file(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    before = tree_state(queued_project.workdir)
    report = prepare(settings, Target.pinned(), console=QUIET)
    assert report.action == "noop"
    assert report.changed_files == 0
    assert tree_state(queued_project.workdir) == before


def test_queue_change_rewrites_only_the_files_it_affects(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    before = tree_state(queued_project.workdir)
    base = queued_project.upstream.commits[1]
    gen = queued_project.patch(base, "generated: family llama", {"src/generated/llama.inc": "// generated v2\n"})
    queued_project.add_patch("generated", "0001-family-llama.patch", gen)
    report = prepare(settings, Target.pinned(), console=QUIET)
    assert report.action == "applied"
    assert report.changed_files == 1
    after = tree_state(queued_project.workdir)
    work_files = [k for k in before if not k.startswith(".git/")]
    changed = sorted(k for k in work_files if before[k] != after.get(k))
    assert changed == ["src/generated/llama.inc"]
    assert (queued_project.workdir / "src/generated/llama.inc").read_text() == "// generated v2\n"


def test_pin_move_and_sha_and_latest(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    up = queued_project.upstream
    latest = prepare(settings, Target.latest(), console=QUIET)
    assert latest.upstream_sha == up.commits[2]
    assert run_git(queued_project.workdir, "merge-base", "--is-ancestor", up.commits[2], "HEAD") == ""
    at = prepare(settings, Target.at(up.commits[1][:10]), console=QUIET)
    assert at.upstream_sha == up.commits[1]
    assert at.patched_sha == EXPECTED_PATCHED
    # upstream moves after the clone: --latest fetches it
    new = up.commit("upstream: new work", {"NEW.md": "new\n"})
    assert prepare(settings, Target.latest(), console=QUIET).upstream_sha == new


def test_pin_to_a_commit_fetched_later(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    new = queued_project.upstream.commit("later", {"LATER.md": "x\n"})
    queued_project.pin(new)
    report = prepare(settings, Target.pinned(), console=QUIET)
    assert report.upstream_sha == new
    assert (queued_project.workdir / "LATER.md").exists()


def test_empty_queue(project: Project) -> None:
    report = prepare(project.settings(), Target.pinned(), console=QUIET)
    assert report.patched_sha == report.upstream_sha == project.upstream.commits[1]


# ------------------------------------------------------------------ bad input


def snapshot_all(project: Project) -> dict[str, tuple[int, bytes]]:
    """Work tree, index, refs and stamps (git may freshen object mtimes: that is not user state)."""
    state = tree_state(project.workdir) if project.workdir.exists() else {}
    # FETCH_HEAD: a refusal of local commits first asks whether the queue on the target gives HEAD's
    # tree (prepare then takes the workdir as prepared), which may fetch the target
    state = {k: v for k, v in state.items() if not k.startswith((".git/objects/", ".git/logs/", ".git/FETCH_HEAD"))}
    queue = tree_state(project.root / "queue")
    return {**{"wd/" + k: v for k, v in state.items()}, **{"queue/" + k: v for k, v in queue.items()}}


def test_bad_pin_file(queued_project: Project) -> None:
    (queued_project.root / "queue" / "upstream.txt").write_text("main\n")
    with pytest.raises(SettingsError) as info:
        prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert "queue/upstream.txt must hold one full 40-hex commit SHA, found 'main'" in info.value.what
    assert not queued_project.workdir.exists()


def test_bad_sha_argument(queued_project: Project) -> None:
    with pytest.raises(SettingsError, match=r"--sha 'v1\.0' is not a commit SHA"):
        prepare(queued_project.settings(), Target.at("v1.0"), console=QUIET)


def test_unknown_pinned_commit(queued_project: Project) -> None:
    queued_project.pin("1" * 40)
    with pytest.raises(SettingsError, match=f"commit {'1' * 40} is not in the upstream"):
        prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert not queued_project.workdir.exists(), "a failed cold prepare leaves no workdir"
    assert not list(queued_project.workdir.parent.glob(".skippy-partial-*"))


def test_invalid_queue_touches_nothing(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    (queued_project.patches / "0009-gap.patch").write_bytes(
        (queued_project.patches / "0002-core-add-provenance.patch").read_bytes()
    )
    before = snapshot_all(queued_project)
    with pytest.raises(Exception, match=r"the patch queue .* is invalid"):
        prepare(settings, Target.pinned(), console=QUIET)
    assert snapshot_all(queued_project) == before


def test_conflict_names_the_patch_and_leaves_the_workdir(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    base = queued_project.upstream.commits[1]
    model = queued_project.upstream.read("src/llama-model.cpp", base)
    clash = queued_project.patch(base, "gemma3: clash", {"src/llama-model.cpp": model.replace("line 5\n", "CLASH\n")})
    queued_project.add_patch("model_support", "0002-gemma3-clash.patch", clash)
    before = snapshot_all(queued_project)
    with pytest.raises(ConflictError) as info:
        prepare(settings, Target.pinned(), console=QUIET, interactive=False)
    assert "model_support/0002-gemma3-clash.patch does not apply: gemma3: clash" in info.value.what
    assert re.search(r"model_support/0002-gemma3-clash\.patch +conflict", info.value.details or "")
    assert "src/llama-model.cpp" in info.value.what
    assert "no stamp was written" in (info.value.untouched or "")
    assert snapshot_all(queued_project) == before
    assert not (queued_project.workdir / ".git" / "skippy" / "aside").exists() or not any(
        (queued_project.workdir / ".git" / "skippy" / "aside").iterdir()
    )
    assert run_git(queued_project.workdir, "worktree", "list").count("\n") == 1


def test_cold_conflict_leaves_a_clean_upstream_checkout_without_stamp(queued_project: Project) -> None:
    base = queued_project.upstream.commits[1]
    model = queued_project.upstream.read("src/llama-model.cpp", base)
    clash = queued_project.patch(base, "gemma3: clash", {"src/llama-model.cpp": model.replace("line 5\n", "CLASH\n")})
    queued_project.add_patch("model_support", "0002-gemma3-clash.patch", clash)
    with pytest.raises(ConflictError):
        prepare(queued_project.settings(), Target.pinned(), console=QUIET, interactive=False)
    assert head(queued_project.workdir) == base
    assert run_git(queued_project.workdir, "status", "--porcelain") == ""
    assert wd.read_stamp(queued_project.workdir / ".git") is None


def test_unreachable_upstream_retries_then_explains(queued_project: Project) -> None:
    (queued_project.root / "pyproject.toml").write_text(
        (queued_project.root / "pyproject.toml")
        .read_text()
        .replace(str(queued_project.upstream.path), str(queued_project.root / "missing.git"))
    )
    slept: list[float] = []
    with pytest.raises(NetworkError) as info:
        prepare(queued_project.settings(), Target.pinned(), console=QUIET, sleep=slept.append)
    assert "could not clone" in info.value.what
    assert "after 2 attempt(s)" in info.value.what
    assert slept == [0.0]
    assert "--offline" in (info.value.next_step or "")
    assert not queued_project.workdir.exists()


def test_workdir_that_is_not_a_repo(queued_project: Project) -> None:
    queued_project.workdir.mkdir(parents=True)
    (queued_project.workdir / "notes.txt").write_text("mine\n")
    with pytest.raises(WorkdirError, match="exists but is not a git checkout of its own"):
        prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert (queued_project.workdir / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in queued_project.workdir.iterdir()) == ["notes.txt"]


def test_never_acts_on_an_enclosing_repository(queued_project: Project) -> None:
    run_git(queued_project.root, "init", "--quiet")
    run_git(queued_project.root, "add", "pyproject.toml")
    run_git(queued_project.root, "commit", "--quiet", "-m", "downstream project")
    queued_project.workdir.mkdir(parents=True)
    before = run_git(queued_project.root, "rev-parse", "HEAD")
    with pytest.raises(WorkdirError):
        prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert run_git(queued_project.root, "rev-parse", "HEAD") == before
    assert run_git(queued_project.root, "status", "--porcelain", "--untracked-files=no") == ""


# ------------------------------------------------------------------ local work


def prepared(project: Project) -> Path:
    prepare(project.settings(), Target.pinned(), console=QUIET)
    return project.workdir


def assert_refused(project: Project, *needles: str) -> DirtyWorkdirError:
    before = snapshot_all(project)
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(project.settings(), Target.latest(), console=QUIET)
    err = info.value
    for needle in needles:
        assert needle in (err.details or ""), err.render()
    assert "nothing was changed" in (err.untouched or "")
    assert "--force" in (err.next_step or "") and "regenerate" in (err.next_step or "")
    assert snapshot_all(project) == before
    return err


def test_refuses_uncommitted_edits(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    (wdir / "README.md").write_text("my edit\n")
    assert_refused(queued_project, "1 uncommitted change(s): README.md")


def test_refuses_staged_edits(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    (wdir / "src" / "new.cpp").write_text("staged\n")
    run_git(wdir, "add", "src/new.cpp")
    assert_refused(queued_project, "uncommitted change(s): src/new.cpp")


def test_refuses_untracked_files_but_tolerates_build_outputs(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    (wdir / "build-cpu").mkdir()
    (wdir / "build-cpu" / "CMakeCache.txt").write_text("ignored by .gitignore\n")
    (wdir / "model.gguf").write_text("tolerated\n")
    assert prepare(queued_project.settings(), Target.pinned(), console=QUIET).action == "noop"
    (wdir / "notes.md").write_text("mine\n")
    assert_refused(queued_project, "1 untracked file(s): notes.md")


def test_refuses_commits_on_top(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    (wdir / "README.md").write_text("fix\n")
    run_git(wdir, "commit", "--quiet", "-am", "my fix")
    assert_refused(queued_project, "1 commit(s) on top of the recorded patched commit aba18d109e82")


def test_refuses_moved_head(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    run_git(wdir, "checkout", "--quiet", "--detach", queued_project.upstream.commits[0])
    assert_refused(queued_project, "not the recorded patched commit")


def test_refuses_am_in_progress(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    base = queued_project.upstream.commits[1]
    model = queued_project.upstream.read("src/llama-model.cpp", base)
    clash = queued_project.patch(base, "clash", {"src/llama-model.cpp": model.replace("line 5\n", "CLASH\n")})
    mbox = queued_project.root / "clash.patch"
    mbox.write_bytes(clash)
    env = hermetic_git_env(Path(os.environ["HOME"]))
    subprocess.run(["git", "am", "--3way", str(mbox)], cwd=wdir, env=env, capture_output=True, check=False)
    assert (wdir / ".git" / "rebase-apply").exists()
    assert_refused(queued_project, "a `git am` session is in progress")


def test_refuses_unknown_history_without_stamp(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    run_git(wdir, "commit", "--quiet", "--allow-empty", "-m", "mine")
    (wdir / ".git" / "skippy" / "prepare.json").unlink()
    assert_refused(queued_project, "holds commits that no upstream ref contains (no skippy stamp)")


def test_force_backs_up_then_discards(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    (wdir / "README.md").write_text("my edit\n")
    (wdir / "notes.md").write_text("my notes\n")
    run_git(wdir, "commit", "--quiet", "--allow-empty", "-m", "my empty commit")
    (wdir / "build-x").mkdir()
    (wdir / "build-x" / "out.o").write_text("ignored build output\n")
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET, force=True)
    assert report.backup_ref is not None and report.backup_ref.startswith("refs/skippy/backups/")
    assert head(wdir) == EXPECTED_PATCHED
    assert run_git(wdir, "status", "--porcelain") == ""
    assert not (wdir / "notes.md").exists()
    assert (wdir / "build-x" / "out.o").exists(), "ignored build outputs are kept"
    # everything is in the backup
    assert run_git(wdir, "show", f"{report.backup_ref}:README.md") == "my edit\n"
    assert run_git(wdir, "show", f"{report.backup_ref}:notes.md") == "my notes\n"
    assert run_git(wdir, "log", "-1", "--format=%s", f"{report.backup_ref}^") == "my empty commit\n"


def test_force_saves_an_am_session(queued_project: Project) -> None:
    wdir = prepared(queued_project)
    base = queued_project.upstream.commits[1]
    model = queued_project.upstream.read("src/llama-model.cpp", base)
    clash = queued_project.patch(base, "clash", {"src/llama-model.cpp": model.replace("line 5\n", "CLASH\n")})
    mbox = queued_project.root / "clash.patch"
    mbox.write_bytes(clash)
    env = hermetic_git_env(Path(os.environ["HOME"]))
    subprocess.run(["git", "am", "--3way", str(mbox)], cwd=wdir, env=env, capture_output=True, check=False)
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET, force=True)
    assert report.backup_ref is not None
    saved = wdir / ".git" / "skippy" / "backups" / report.backup_ref.rsplit("/", 1)[1] / "rebase-apply"
    assert (saved / "0001").exists()
    assert not (wdir / ".git" / "rebase-apply").exists()
    assert head(wdir) == EXPECTED_PATCHED


# ------------------------------------------------------------------ shape and recovery


def test_shallow_clone_is_recloned(queued_project: Project) -> None:
    queued_project.workdir.parent.mkdir(parents=True)
    env = hermetic_git_env(Path(os.environ["HOME"]))
    git(
        queued_project.workdir.parent,
        "clone",
        "--quiet",
        "--depth=1",
        f"file://{queued_project.upstream.path}",
        str(queued_project.workdir),
        env=env,
    )
    assert run_git(queued_project.workdir, "rev-parse", "--is-shallow-repository").strip() == "true"
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert report.patched_sha == EXPECTED_PATCHED
    assert run_git(queued_project.workdir, "rev-parse", "--is-shallow-repository").strip() == "false"


def test_leftover_partial_clone_is_removed(queued_project: Project) -> None:
    leftover = queued_project.workdir.parent / ".skippy-partial-llama.cpp-deadbeef"
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("x")
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert report.patched_sha == EXPECTED_PATCHED
    assert not leftover.exists()


def test_interrupted_switch_is_finished(queued_project: Project) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    git_dir = queued_project.workdir / ".git"
    # as if Ctrl-C hit while moving to a new commit: journal present, HEAD still old, stamp gone
    wd.write_json_atomic(
        git_dir / "skippy" / "journal.json",
        {
            "op": "switch",
            "from_commit": EXPECTED_PATCHED,
            "to_commit": queued_project.upstream.commits[1],
            "upstream_sha": queued_project.upstream.commits[1],
        },
    )
    wd.clear_stamp(git_dir)
    report = prepare(settings, Target.pinned(), console=QUIET)
    assert report.patched_sha == EXPECTED_PATCHED
    assert not (git_dir / "skippy" / "journal.json").exists()
    assert run_git(queued_project.workdir, "status", "--porcelain") == ""


FAKE_GIT = """#!/bin/sh
# stands in for git: lets everything through, but interrupts the caller (our parent: skippy's
# subprocess gate execs us directly) in the middle of `git am`, as Ctrl-C would
REAL_GIT=@REAL_GIT@
for a in "$@"; do
  if [ "$a" = am ]; then
    "$REAL_GIT" "$@" >/dev/null 2>&1 &
    sleep 0.2
    kill -@SIG@ "$PPID"
    wait
    sleep 5
    exit 1
  fi
done
exec "$REAL_GIT" "$@"
"""


@pytest.mark.parametrize("sig", ["INT", "KILL"])
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_interrupted_am_is_recovered(queued_project: Project, tmp_path: Path, warm: bool, sig: str) -> None:
    """A real Ctrl-C (SIGINT: cleaned up at once) or a hard kill (SIGKILL: left behind) while
    `git am` runs: the next run recognizes the state and recovers."""
    if warm:
        prepare(queued_project.settings(), Target.pinned(), console=QUIET)
        base = queued_project.upstream.commits[1]
        gen = queued_project.patch(base, "generated: family llama", {"src/generated/llama.inc": "// v2\n"})
        queued_project.add_patch("generated", "0001-family-llama.patch", gen)
        before = tree_state(queued_project.workdir)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "git").write_text(FAKE_GIT.replace("@REAL_GIT@", shutil.which("git") or "git").replace("@SIG@", sig))
    (bindir / "git").chmod(0o755)
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from skippy.cli.entries import prepare_main\n"
        "sys.exit(prepare_main(os.environ, root=Path(sys.argv[1])))\n"
    )
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        [sys.executable, "-c", script, str(queued_project.root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # the SIGINT the stand-in sends must raise KeyboardInterrupt whatever this process inherited
        preexec_fn=default_interrupts,
    )
    leftovers = list(queued_project.workdir.parent.glob(".skippy-partial-*")) + list(
        (queued_project.workdir / ".git" / "skippy" / "aside").glob("*")
    )
    if sig == "INT":
        assert result.returncode == 130, result.stderr
        assert "interrupted" in result.stderr
        assert leftovers == []
    else:
        assert result.returncode == -9
        assert len(leftovers) == 1, "a hard kill leaves the partial clone or the temporary worktree"
        if warm:
            assert (queued_project.workdir / ".git" / "worktrees").exists()
    if warm:
        # the workdir was never touched: the am ran in a temporary worktree
        after = tree_state(queued_project.workdir)
        assert {k: v for k, v in after.items() if not k.startswith(".git/")} == {
            k: v for k, v in before.items() if not k.startswith(".git/")
        }
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert report.action in ("cloned", "applied")
    assert run_git(queued_project.workdir, "status", "--porcelain") == ""
    assert run_git(queued_project.workdir, "worktree", "list").count("\n") == 1
    if not warm:
        assert report.patched_sha == EXPECTED_PATCHED


def test_lock_serializes_and_times_out(queued_project: Project) -> None:
    import filelock

    settings = queued_project.settings()
    lock_file = lock_path(settings)
    lock_file.parent.mkdir(parents=True)
    lock = filelock.FileLock(str(lock_file))
    with lock:
        # the holder is this test; filelock's locks are per process, so probe from a subprocess
        code = (
            "import os, sys\nfrom pathlib import Path\nfrom skippy.cli.entries import prepare_main\n"
            "sys.exit(prepare_main(os.environ, root=Path(sys.argv[1])))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, str(queued_project.root)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ),
            check=False,
        )
    assert result.returncode == LockBusyError.exit_code, result.stderr
    assert "waiting for another prepare" in result.stderr
    assert "another prepare has held" in result.stderr
    assert not queued_project.workdir.exists()
    # two at once: both succeed, one clones, the other finds nothing to do
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                code.replace("root=Path(sys.argv[1])", "root=Path(sys.argv[1]), json=True"),
                str(queued_project.root),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    actions = sorted(json.loads(out)["action"] for out, _ in outs)
    assert actions == ["cloned", "noop"]
    assert settings.workdir.exists()


# ------------------------------------------------------------------ compat link, status, shim


def test_compat_link_never_replaces_a_real_directory(queued_project: Project) -> None:
    real = queued_project.root / "llama.cpp"
    real.mkdir()
    (real / "keep.txt").write_text("mine\n")
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert not real.is_symlink()
    assert (real / "keep.txt").read_text() == "mine\n"
    assert any("not a link" in n for n in report.notes)


def test_compat_link_can_be_turned_off(queued_project: Project) -> None:
    toml = queued_project.root / "pyproject.toml"
    toml.write_text(toml.read_text().replace('compat_link = "llama.cpp"', "compat_link = false"))
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert not (queued_project.root / "llama.cpp").exists()


def test_status_tells_what_prepare_would_do(queued_project: Project) -> None:
    settings = queued_project.settings()
    assert compute_status(settings).would.startswith("clone upstream")
    prepare(settings, Target.pinned(), console=QUIET)
    status = compute_status(settings)
    assert status.up_to_date and status.would == "nothing (up to date)"
    assert status.pin == read_pin(settings)
    (queued_project.workdir / "README.md").write_text("edit\n")
    status = compute_status(settings)
    assert not status.up_to_date
    assert status.would.startswith("refuse: local work")
    assert status.work is not None and status.work.modified == ("README.md",)
    run_git(queued_project.workdir, "checkout", "--", "README.md")
    queued_project.pin(queued_project.upstream.commits[2])
    assert compute_status(settings).would.startswith("move from upstream")
    data = compute_status(settings).as_dict()
    assert data["stamp"]["patched_sha"] == EXPECTED_PATCHED


def test_invoke_and_shim_entry_points(queued_project: Project) -> None:
    repo_root = Path(__file__).resolve().parents[2]
    shutil.copy(repo_root / "tasks.py", queued_project.root / "tasks.py")
    bindir = Path(sys.executable).parent
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        ["invoke", "prepare", "--json"],
        cwd=queued_project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["patched_sha"] == EXPECTED_PATCHED
    (queued_project.root / "scripts").mkdir()
    shutil.copy(repo_root / "scripts" / "prepare-llama.sh", queued_project.root / "scripts" / "prepare-llama.sh")
    shim = subprocess.run(
        ["sh", str(queued_project.root / "scripts" / "prepare-llama.sh"), "pinned", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shim.returncode == 0, shim.stderr
    assert json.loads(shim.stdout)["action"] == "noop"
    status = subprocess.run(
        ["invoke", "status", "--json"],
        cwd=queued_project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(status.stdout)["up_to_date"] is True
    bad = subprocess.run(
        ["invoke", "prepare", "--latest", "--sha", "abc1234", "--json"],
        cwd=queued_project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == SettingsError.exit_code
    assert json.loads(bad.stdout)["ok"] is False
    assert "choose one of --pinned, --latest, --sha" in bad.stderr
