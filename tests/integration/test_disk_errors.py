"""A read-only workdir or a full disk: the error names the real cause, the path and the next command.

The conditions are real: the command runs in its own mount namespace with the directory bound
read-only (EROFS) or its content on a full tmpfs (ENOSPC).  Where no mount namespace can be made,
a non-root run falls back to taking the write bits away (EACCES); root ignores those, so there
the test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from skippy.core.errors import WorkdirError
from skippy.core.ui import Console
from skippy.queue.disk import DiskProblem, disk_problem, oserror_problem
from skippy.queue.guard import lock_path
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env, in_mount_namespace, mount_namespace

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)

PREPARE = (
    "import json, os, sys\nfrom pathlib import Path\nfrom skippy.cli.entries import prepare_main\n"
    "sys.exit(prepare_main(os.environ, root=Path(sys.argv[1]), **json.loads(sys.argv[2])))\n"
)


def snapshot(project: Project) -> dict[str, bytes]:
    """Every file of the workdir (its .git included, objects aside) and every ref, as bytes."""
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(project.workdir):
        for name in files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(project.workdir))
            if not rel.startswith(".git/objects/"):
                out[rel] = path.read_bytes()
    env = hermetic_git_env(Path(os.environ["HOME"]))
    out["(refs)"] = git(project.workdir, "for-each-ref", env=env).encode()
    return out


def _chmod_tree(root: Path, writable: bool) -> None:
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files, None]:
            path = Path(dirpath) / name if name else Path(dirpath)
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=dict(os.environ), capture_output=True, text=True, timeout=120, check=False)


def run_prepare(
    project: Project, options: dict[str, object], *, readonly: Sequence[Path] = (), full: bool = False
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`prepare_main(**options)` in a subprocess that cannot write ``readonly`` (or, ``full``, finds
    the workdir's file system full); the result and the cause the OS gives."""
    argv = [sys.executable, "-c", PREPARE, str(project.root), json.dumps(options)]
    if mount_namespace() is not None:
        spaces = [(project.workdir, ".git/filler")] if full else []
        cause = "No space left on device" if full else "Read-only file system"
        return _run(in_mount_namespace(argv, readonly=readonly, full=spaces)), cause
    if full:
        pytest.skip("no mount namespace here (unshare --mount refused): a full file system cannot be made")
    if os.geteuid() == 0:
        pytest.skip("no mount namespace here and root ignores permission bits: no read-only directory can be made")
    for path in readonly:
        _chmod_tree(path, writable=False)
    try:
        return _run(argv), "Permission denied"
    finally:
        for path in readonly:
            _chmod_tree(path, writable=True)


@pytest.fixture
def prepared(queued_project: Project) -> Iterator[Project]:
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    yield queued_project


def assert_clean_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == WorkdirError.exit_code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "\nuntouched: " in result.stderr and "\nnext: " in result.stderr


def test_read_only_workdir_prepare_sha(prepared: Project) -> None:
    other = prepared.upstream.commits[2]
    before = snapshot(prepared)
    result, cause = run_prepare(prepared, {"sha": other}, readonly=[prepared.workdir])
    assert_clean_error(
        result,
        f"error: cannot write .deps/llama.cpp/.git/skippy/aside: {cause}",
        "untouched: .deps/llama.cpp: your files are as they were",
        "next: make .deps/llama.cpp writable for this user",
        f"then re-run `invoke prepare --sha {other}`",
    )
    assert snapshot(prepared) == before


def test_read_only_workdir_triage(prepared: Project) -> None:
    other = prepared.upstream.commits[2]
    before = snapshot(prepared)
    result, cause = run_prepare(prepared, {"sha": other, "triage": True}, readonly=[prepared.workdir])
    assert_clean_error(
        result,
        f"error: cannot write .deps/llama.cpp/.git/skippy/aside: {cause}",
        "untouched: .deps/llama.cpp: its checkout and your files (triage works in a temporary worktree)",
        f"then re-run `invoke triage --sha {other}`",
    )
    assert snapshot(prepared) == before


def test_read_only_workdir_fetch_is_not_a_network_failure(prepared: Project) -> None:
    prepared.upstream.commit("upstream: later", {"LATER.md": "later\n"})
    before = snapshot(prepared)
    result, cause = run_prepare(prepared, {"latest": True}, readonly=[prepared.workdir])
    assert_clean_error(result, f"error: cannot write .deps/llama.cpp/.git/FETCH_HEAD: {cause} (git fetch)")
    assert "could not fetch" not in result.stderr and "attempt" not in result.stderr
    assert snapshot(prepared) == before


def test_read_only_lock_directory(prepared: Project) -> None:
    lock = lock_path(prepared.settings())
    assert lock.parent.is_dir(), "the first prepare made the lock folder in the cache dir"
    lock.unlink()
    before = snapshot(prepared)
    result, cause = run_prepare(prepared, {"sha": prepared.upstream.commits[2]}, readonly=[lock.parent])
    assert_clean_error(
        result,
        f"error: cannot write .deps/cache/locks/{lock.name}: {cause}",
        "next: make .deps/cache/locks writable for this user",
    )
    assert snapshot(prepared) == before


def test_full_disk_during_fetch_is_named_not_a_network_failure(prepared: Project) -> None:
    """With an archive table configured, the old code fell back to it: "no archive mapped"."""
    pin = prepared.upstream.commits[1]
    toml = prepared.root / "pyproject.toml"
    toml.write_text(
        toml.read_text()
        + f'\n[tool.skippy.archives."{pin}"]\nurl = "file:missing.tar.gz"\nsha256 = "{"0" * 64}"\nfolder = "x"\n'
    )
    new = prepared.upstream.commit("upstream: later", {"LATER.md": "later\n" * 2000})
    before = snapshot(prepared)
    result, _cause = run_prepare(prepared, {"sha": new}, full=True)
    assert_clean_error(
        result,
        "error: No space left on device while writing in .deps/llama.cpp (git fetch)",
        # the full file system by its mount point (here the tmpfs on the workdir, in the namespace)
        f"next: free space on the file system mounted at {prepared.workdir} (it holds .deps/llama.cpp;",
        f"then re-run `invoke prepare --sha {new}`",
    )
    for wrong in ("could not fetch", "attempt", "no archive mapped", "network"):
        assert wrong not in result.stderr, result.stderr
    # the full file system was the command's own (a tmpfs in its namespace): ours is as it was
    assert snapshot(prepared) == before


def test_disk_problem_reads_git_and_os_messages() -> None:
    line = "fatal: Unable to create '/w/.git/index.lock': Read-only file system"
    assert disk_problem("warning: x\n" + line) == DiskProblem("Read-only file system", "/w/.git/index.lock", line)
    assert disk_problem("fatal: unable to write loose object file: No space left on device") == DiskProblem(
        "No space left on device", None, "fatal: unable to write loose object file: No space left on device"
    )
    # an ssh remote refusing the key is the network's problem, not the disk's
    assert disk_problem("git@example.invalid: Permission denied (publickey).") is None
    assert disk_problem("fatal: could not read from remote repository") is None
    assert disk_problem("Applying: model: say No space left on device when the cache is full") is None
    problem = oserror_problem(PermissionError(13, "Permission denied", "/w/x"))
    assert (problem.cause, problem.path, problem.full) == ("Permission denied", "/w/x", False)


def test_read_only_workdir_abort(project: Project) -> None:
    from skippy.core.errors import ConflictError
    from tests.integration.test_conflicts import session_queue

    session_queue(project)
    with pytest.raises(ConflictError):
        prepare(project.settings(), Target.latest(), console=QUIET)
    (project.workdir / "README.md").write_bytes(b"my edit\n")
    before = snapshot(project)
    result, cause = run_prepare(project, {"abort": True}, readonly=[project.workdir])
    assert_clean_error(
        result,
        cause,
        "untouched: .deps/llama.cpp: the conflict session and your files are as they were",
        "then re-run `invoke prepare --abort`",
    )
    assert snapshot(project) == before


def test_unreachable_upstream_for_an_unmapped_sha_names_the_network(prepared: Project) -> None:
    """Archives mapped for other commits do not hide the fetch's own error under "no archive mapped"."""
    from skippy.core.errors import NetworkError

    pin = prepared.upstream.commits[1]
    toml = prepared.root / "pyproject.toml"
    text = toml.read_text().replace(str(prepared.upstream.path), str(prepared.root / "missing.git"))
    toml.write_text(
        text + f'\n[tool.skippy.archives."{pin}"]\nurl = "file:missing.tar.gz"\nsha256 = "{"0" * 64}"\nfolder = "x"\n'
    )
    before = snapshot(prepared)
    with pytest.raises(NetworkError) as info:
        prepare(prepared.settings(), Target.at("1" * 40), console=QUIET, sleep=lambda _s: None)
    assert "could not fetch master from" in info.value.what
    assert "nothing was changed" in (info.value.untouched or "")
    # the origin URL follows the settings and the failed fetch leaves an empty FETCH_HEAD: git's own
    after = snapshot(prepared)
    for own in (".git/config", ".git/FETCH_HEAD"):
        after.pop(own, None)
        before.pop(own, None)
    assert after == before


def test_disk_problem_reads_a_checkout_that_filled_the_disk() -> None:
    """git checkout says only "unable to write file" and its own words for ENOSPC."""
    out = "error: unable to write file big.bin\nfatal: sha1 file '/w/.git/index.lock' write error. Out of diskspace"
    problem = disk_problem(out)
    assert problem is not None and problem.full
    assert (problem.cause, problem.path) == ("No space left on device", "/w/.git/index.lock")
    assert disk_problem("Applying: say write error. Out of diskspace here") is None
