"""A cold workdir costs a clone, not an import (issue 42, part 4).

The import of a source archive is made once, in a bare repository under the cache dir; a new
workdir (or a temporary store of ``invoke check``) takes its objects from there, hard-linked as a
local ``git clone`` does.  No alternates: removing the cache never breaks a workdir.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy.core.files import sha256_of
from skippy.core.ui import Console
from skippy.maintain.replay import pinned_store
from skippy.queue import archives
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env, mount_namespace
from tests.integration.test_archives_prepare import archive_of, configure

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


class Counting:
    """Wraps a function of :mod:`skippy.queue.archives`, counting its calls."""

    def __init__(self, wrapped: Callable[..., Any]) -> None:
        self.wrapped = wrapped
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.wrapped(*args, **kwargs)


@pytest.fixture
def archived(queued_project: Project) -> Project:
    """The queued project whose pin comes from a source archive (the upstream unreachable)."""
    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    missing = (queued_project.root / "missing.git").as_uri()
    configure(queued_project, missing, {pin: (archive, sha256_of(archive))})
    return queued_project


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> Counting:
    counting = Counting(archives.commit_folder)
    monkeypatch.setattr(archives, "commit_folder", counting)
    return counting


def store_of(project: Project) -> Path:
    return archives.shared_store(project.settings())


def workdir(project: Project, name: str) -> dict[str, str]:
    return {"LLAMA_WORKDIR": str(project.root / name / "llama.cpp")}


def test_a_second_cold_workdir_is_linked_from_the_store_not_imported(archived: Project, imports: Counting) -> None:
    pin = archived.upstream.commits[1]
    first = prepare(archived.settings(**workdir(archived, "a")), Target.pinned(), console=QUIET, offline=True)
    assert imports.calls == 1
    store = store_of(archived)
    base = run_git(store, "rev-parse", f"refs/skippy/archive/{pin}").strip()
    # neither the archive nor its download is needed any more
    for cached in (archived.settings().cache_dir / "archives").glob("*.archive"):
        cached.unlink()
    (archived.root / "archives" / f"{pin[:12]}.tar.gz").unlink()

    second = prepare(archived.settings(**workdir(archived, "b")), Target.pinned(), console=QUIET, offline=True)

    assert imports.calls == 1, "the second workdir imported the archive again"
    assert second.action == "cloned" and second.source == "archive"
    assert second.patched_sha == first.patched_sha
    wdir = archived.root / "b" / "llama.cpp"
    assert run_git(wdir, "rev-parse", f"refs/skippy/archive/{pin}").strip() == base
    assert run_git(wdir, "rev-parse", "HEAD~4").strip() == base
    # its objects are its own files, hard links of the store's (no alternates)
    assert not (wdir / ".git" / "objects" / "info" / "alternates").exists()
    tree = run_git(wdir, "rev-parse", f"{base}^{{tree}}").strip()
    mine, theirs = (root / "objects" / tree[:2] / tree[2:] for root in (wdir / ".git", store))
    assert mine.stat().st_ino == theirs.stat().st_ino


def test_removing_the_store_leaves_a_workdir_working(archived: Project) -> None:
    settings = archived.settings()
    first = prepare(settings, Target.pinned(), console=QUIET, offline=True)
    wdir = archived.workdir
    shutil.rmtree(store_of(archived))
    shutil.rmtree(settings.cache_dir / "archives")

    run_git(wdir, "fsck", "--full", "--no-dangling")
    assert run_git(wdir, "status", "--porcelain") == ""
    assert prepare(settings, Target.pinned(), console=QUIET, offline=True).action == "noop"
    # a change of the queue applies on the import this workdir holds by itself
    base = archived.upstream.commits[1]
    gen = archived.patch(base, "generated: family llama", {"src/generated/llama.inc": "// generated v2\n"})
    archived.add_patch("generated", "0001-family-llama.patch", gen)
    again = prepare(settings, Target.pinned(), console=QUIET, offline=True)
    assert again.action == "applied" and again.patched_sha != first.patched_sha
    assert (wdir / "src/generated/llama.inc").read_text(encoding="utf-8") == "// generated v2\n"


def test_a_store_removed_is_made_again_by_the_next_cold_workdir(archived: Project, imports: Counting) -> None:
    first = prepare(archived.settings(**workdir(archived, "a")), Target.pinned(), console=QUIET, offline=True)
    shutil.rmtree(store_of(archived))
    second = prepare(archived.settings(**workdir(archived, "b")), Target.pinned(), console=QUIET, offline=True)
    assert imports.calls == 2
    assert second.patched_sha == first.patched_sha
    assert store_of(archived).is_dir()
    assert not list(store_of(archived).parent.glob(".new-*")), "the store's scratch folder is gone"


def test_a_store_missing_an_object_is_mended_by_importing_again(archived: Project, imports: Counting) -> None:
    pin = archived.upstream.commits[1]
    first = prepare(archived.settings(**workdir(archived, "a")), Target.pinned(), console=QUIET, offline=True)
    store = store_of(archived)
    blob = run_git(store, "rev-parse", f"refs/skippy/archive/{pin}:README.md").strip()
    (store / "objects" / blob[:2] / blob[2:]).unlink()

    said = io.StringIO()
    settings = archived.settings(**workdir(archived, "b"))
    second = prepare(settings, Target.pinned(), console=Console(env={}, stream=said), offline=True)

    assert imports.calls == 2
    assert second.patched_sha == first.patched_sha
    assert f"lacks objects of upstream {pin[:12]} (removed by hand?): importing the archive there again" in (
        said.getvalue()
    )
    run_git(archived.root / "b" / "llama.cpp", "fsck", "--full", "--no-dangling")
    run_git(store, "fsck", "--full", "--no-dangling")


def test_a_packed_store_still_serves(archived: Project, imports: Counting) -> None:
    first = prepare(archived.settings(**workdir(archived, "a")), Target.pinned(), console=QUIET, offline=True)
    store = store_of(archived)
    run_git(store, "gc", "--quiet", "--prune=now")
    assert not [p for p in (store / "objects").iterdir() if len(p.name) == 2]
    second = prepare(archived.settings(**workdir(archived, "b")), Target.pinned(), console=QUIET, offline=True)
    assert imports.calls == 1
    assert second.patched_sha == first.patched_sha
    run_git(archived.root / "b" / "llama.cpp", "fsck", "--full", "--no-dangling")


def test_the_temporary_store_of_a_check_takes_the_import_from_the_store(archived: Project, imports: Counting) -> None:
    pin = archived.upstream.commits[1]
    prepare(archived.settings(**workdir(archived, "a")), Target.pinned(), console=QUIET, offline=True)
    settings = archived.settings(**workdir(archived, "none"))  # no workdir: check makes a store of its own
    with pinned_store(settings, console=QUIET, offline=True) as held:
        assert not held.shared
        assert held.base == run_git(store_of(archived), "rev-parse", f"refs/skippy/archive/{pin}").strip()
        assert held.repo.has_commit(held.base)
    assert imports.calls == 1


#: prepares a workdir with the shared store on a tmpfs of its own (mounted first, in the child's own
#: mount namespace): the store and the workdir are on two file systems
ON_ANOTHER_FS = r"""
import json, os, subprocess, sys
from pathlib import Path
mount_point, root, workdir = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mount_point], check=True)
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.prepare import Target, prepare
env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
env["LLAMA_WORKDIR"] = workdir
report = prepare(Settings.load(Path(root), env), Target.pinned(), console=Console(quiet=True), offline=True)
objects = Path(workdir) / ".git" / "objects"
store = Path(mount_point) / "llama.cpp.git"
print(json.dumps({
    "patched": report.patched_sha,
    "links": sorted({p.stat().st_nlink for p in objects.glob("??/*")}),
    "store_objects": sum(1 for _ in (store / "objects").glob("??/*")),
    "devices": [os.stat(store).st_dev, os.stat(workdir).st_dev],
}))
"""


def test_a_store_on_another_file_system_is_copied_not_linked(archived: Project) -> None:
    prefix = mount_namespace()
    if prefix is None:
        pytest.skip("no mount namespace here (unshare --mount refused): no second file system can be made")
    reference = prepare(archived.settings(**workdir(archived, "ref")), Target.pinned(), console=QUIET, offline=True)
    mount_point = store_of(archived).parent  # hidden under the child's tmpfs: the child makes a store there
    wdir = archived.root / "other" / "llama.cpp"
    result = subprocess.run(
        [*prefix, sys.executable, "-c", ON_ANOTHER_FS, str(mount_point), str(archived.root), str(wdir)],
        cwd=Path(__file__).resolve().parents[2],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["patched"] == reference.patched_sha
    assert seen["devices"][0] != seen["devices"][1]
    assert seen["store_objects"] > 0
    assert seen["links"] == [1], "objects across file systems are copies, not links"
    # the tmpfs (and the store on it) is gone with the child: the workdir holds everything itself
    run_git(wdir, "fsck", "--full", "--no-dangling")
    assert run_git(wdir, "status", "--porcelain") == ""
