"""`prepare` with a source archive: fallback when the upstream is unreachable, --offline, mismatches."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from skippy.core.errors import ArchiveError, SettingsError
from skippy.core.files import sha256_of
from skippy.core.ui import Console
from skippy.queue import archives
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env, pyproject

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)
FOLDER = "llama.cpp-fixture"


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def archive_of(project: Project, commit: str) -> Path:
    """A tar.gz of the fixture upstream at ``commit``, as a release tarball would be."""
    out = project.root / "archives" / f"{commit[:12]}.tar.gz"
    out.parent.mkdir(exist_ok=True)
    run_git(project.upstream.path, "archive", "--format=tar.gz", f"--prefix={FOLDER}/", "-o", str(out), commit)
    return out


def configure(project: Project, upstream_url: str, mappings: dict[str, tuple[Path, str]]) -> None:
    """Rewrite the project's pyproject.toml with ``upstream_url`` and archive mappings."""
    extra = ""
    for sha, (path, digest) in mappings.items():
        rel = path.relative_to(project.root).as_posix()
        extra += f'\n[tool.skippy.archives."{sha}"]\nurl = "file:{rel}"\nsha256 = "{digest}"\nfolder = "{FOLDER}"\n'
    (project.root / "pyproject.toml").write_text(pyproject(upstream_url, extra), encoding="utf-8")


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    state: dict[str, tuple[int, bytes]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                state[str(path.relative_to(root))] = (path.stat().st_mtime_ns, path.read_bytes())
    return state


def reference_tree(project: Project) -> str:
    """The patched tree prepare makes from the real git upstream (in a throwaway copy)."""
    report = prepare(project.settings(), Target.pinned(), console=QUIET)
    tree = run_git(project.workdir, "rev-parse", "HEAD^{tree}").strip()
    assert report.source == "git"
    shutil.rmtree(project.workdir)  # a plain clone: remove it wholesale
    (project.root / "llama.cpp").unlink(missing_ok=True)
    return tree


def test_unreachable_upstream_falls_back_to_the_archive(queued_project: Project) -> None:
    pin = queued_project.upstream.commits[1]
    expected_tree = reference_tree(queued_project)
    archive = archive_of(queued_project, pin)
    missing = (queued_project.root / "missing.git").as_uri()
    configure(queued_project, missing, {pin: (archive, sha256_of(archive))})

    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET, sleep=lambda _s: None)

    assert report.source == "archive"
    assert report.upstream_sha == pin
    wdir = queued_project.workdir
    # same patched tree as from the git upstream, on top of the imported archive commit
    assert run_git(wdir, "rev-parse", "HEAD^{tree}").strip() == expected_tree
    base = run_git(wdir, "rev-parse", f"refs/skippy/archive/{pin}").strip()
    assert run_git(wdir, "rev-parse", "HEAD~4").strip() == base
    assert (
        run_git(wdir, "rev-parse", f"{base}^{{tree}}").strip()
        == run_git(queued_project.upstream.path, "rev-parse", f"{pin}^{{tree}}").strip()
    )
    trailers = archives.parse_trailers(run_git(wdir, "log", "-1", "--format=%B", base))
    assert trailers["Upstream-Commit"] == pin
    assert run_git(wdir, "status", "--porcelain") == ""
    # and the next run is a no-op that needs neither the upstream nor the archive
    archive.unlink()
    again = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert again.action == "noop"
    assert again.patched_sha == report.patched_sha


def test_offline_never_touches_the_upstream(queued_project: Project) -> None:
    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    # a reachable upstream: offline must still not clone or fetch from it
    configure(queued_project, str(queued_project.upstream.path), {pin: (archive, sha256_of(archive))})
    upstream_before = snapshot(queued_project.upstream.path)

    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET, offline=True)

    assert report.source == "archive"
    wdir = queued_project.workdir
    assert run_git(wdir, "for-each-ref", "refs/remotes") == ""
    for commit in queued_project.upstream.commits:
        assert git_missing(wdir, commit)
    assert snapshot(queued_project.upstream.path) == upstream_before


def git_missing(path: Path, sha: str) -> bool:
    env = hermetic_git_env(Path(os.environ["HOME"]))
    result = subprocess.run(
        ["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=path, env=env, capture_output=True, check=False
    )
    return result.returncode != 0


def test_offline_without_a_mapping_explains(queued_project: Project) -> None:
    configure(queued_project, str(queued_project.upstream.path), {})
    with pytest.raises(SettingsError) as info:
        prepare(queued_project.settings(), Target.pinned(), console=QUIET, offline=True)
    assert "no archive is configured" in info.value.what
    assert "[tool.skippy.archives]" in (info.value.next_step or "")
    assert not (queued_project.workdir / "src").exists()


def test_digest_mismatch_through_prepare_changes_nothing(queued_project: Project) -> None:
    # a warm workdir prepared from git at the first pin ...
    first = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    assert first.source == "git"
    wdir = queued_project.workdir
    before = snapshot(wdir)
    # ... then the pin moves to a commit only an archive (with a wrong digest) can provide
    newer = queued_project.upstream.commit("upstream moves on", {"README.md": "# moved\n"})
    archive = archive_of(queued_project, newer)
    missing = (queued_project.root / "missing.git").as_uri()
    configure(queued_project, missing, {newer: (archive, "0" * 64)})
    queued_project.pin(newer)
    with pytest.raises(ArchiveError) as info:
        prepare(queued_project.settings(), Target.pinned(), console=QUIET, sleep=lambda _s: None)
    assert "does not match its sha256" in info.value.what
    assert f"actual   {sha256_of(archive)}" in (info.value.details or "")
    after = snapshot(wdir)
    # the failed fetch attempt rewrites FETCH_HEAD and prepare re-points origin at the configured URL:
    # that is prepare's network side; work tree, index, refs, objects and stamp are untouched
    changed = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
    assert set(changed) <= {".git/FETCH_HEAD", ".git/config"}
    assert run_git(wdir, "rev-parse", "HEAD").strip() == first.patched_sha
    assert run_git(wdir, "for-each-ref", "refs/skippy/archive") == ""


def test_an_abbreviated_sha_of_a_configured_archive_prepares_offline(queued_project: Project) -> None:
    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    configure(queued_project, str(queued_project.upstream.path), {pin: (archive, sha256_of(archive))})

    report = prepare(queued_project.settings(), Target.at(pin[:12]), console=QUIET, offline=True)

    assert report.upstream_sha == pin
    assert report.source == "archive"


def test_an_abbreviation_matching_two_configured_commits_is_refused(queued_project: Project) -> None:
    from skippy.queue.target import expand_known_sha

    settings = queued_project.settings()
    twins: dict[str, dict[str, str]] = {"ab" + "1" * 38: {}, "ab" + "2" * 38: {}}
    crafted = type(settings).from_table(settings.root, {**settings.raw, "archives": twins}, settings.env)
    with pytest.raises(SettingsError, match="--sha ab is ambiguous") as info:
        expand_known_sha(crafted, "ab")
    assert "give more digits" in (info.value.next_step or "")
    assert expand_known_sha(crafted, "ab1") == "ab" + "1" * 38
    assert expand_known_sha(crafted, "cd12") == "cd12"
