"""A hard-killed archive import leaves scratch folders that the next run removes (never those of a
live run), and an error after a corrupt cached archive was set aside says so."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skippy.core.errors import ArchiveError
from skippy.core.git import Repo
from skippy.queue import archives, scratch
from tests.integration.test_archives import (
    TINY_COMMIT,
    TINY_SHA256,
    UPSTREAM,
    console,
    new_repo,
    settings_for,
)
from tests.integration.test_archives import tiny as tiny  # noqa: PLC0414 (the fixture, re-exported)

pytestmark = pytest.mark.integration

#: a child that imports the archive and stops where the issue's run was killed: in the middle of the
#: import (tree unpacked, commit pending) or of the download
CHILD = r"""
import json, sys, time
from pathlib import Path
from skippy.queue import archive_fetch, archives, scratch
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console

root, stage, ready, spec = sys.argv[1:5]
data = json.loads(spec)
settings = Settings.from_table(Path(root), data["table"], data["env"])

def stop_here(*args, **kwargs):
    Path(ready).write_text("stopped\n")
    time.sleep(600)
    raise SystemExit(3)

def fetch_then_stop(url, into, ctx):
    archive_fetch.fetch(url, into, ctx)
    stop_here()

if stage == "import":
    archives.commit_folder = stop_here
    archives.import_archive(settings, Repo(Path(data["repo"]), env=data["env"]), data["upstream"], Console())
else:
    archives.import_archive(
        settings, Repo(Path(data["repo"]), env=data["env"]), data["upstream"], Console(), fetcher=fetch_then_stop
    )
"""


def start_child(tmp_path: Path, git_env: dict[str, str], url: str, repo: Repo, stage: str) -> subprocess.Popen[str]:
    table = {
        "cache_dir": ".deps/cache",
        "network_attempts": 2,
        "network_backoff": 0.0,
        "archives": {UPSTREAM: {"url": url, "sha256": TINY_SHA256, "folder": "tiny-1.0/vendor/llama.cpp"}},
    }
    ready = tmp_path / f"ready-{stage}"
    spec = json.dumps({"table": table, "env": git_env, "repo": str(repo.path), "upstream": UPSTREAM})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), stage, str(ready), spec],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if child.poll() is not None:
            raise AssertionError(f"the child ended early: {child.stderr.read() if child.stderr else ''}")
        assert time.monotonic() < deadline, "the child never reached the stopping point"
        time.sleep(0.05)
    return child


def kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    if child.stderr is not None:
        child.stderr.close()


def leftovers(folder: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(prefix)) if folder.is_dir() else []


@pytest.mark.parametrize("case", [("import", "tmp", "archive-"), ("fetch", "archives", ".fetch-")])
def test_next_run_removes_what_a_killed_import_left(
    tiny: Path, tmp_path: Path, git_env: dict[str, str], case: tuple[str, str, str]
) -> None:
    stage, where, prefix = case
    repo = new_repo(tmp_path / "work", git_env)
    child = start_child(tmp_path, git_env, tiny.as_uri(), repo, stage)
    scratch_root = tmp_path / ".deps" / "cache" / where
    live = leftovers(scratch_root, prefix)
    assert len(live) == 2 and live[1] == live[0] + ".lock", live  # the folder and its held lock
    # while the child lives, another run leaves its folder alone (it is not stale)
    assert scratch.sweep_stale(scratch_root, prefix) == []
    assert leftovers(scratch_root, prefix) == live
    kill(child)
    left = scratch_root / live[0]
    assert any(left.rglob("*")), "the killed run left its files behind"
    assert archives.archive_commit(repo, UPSTREAM) is None
    # the next run removes them, then imports as usual and leaves nothing of its own
    settings = settings_for(tmp_path, git_env, tiny.as_uri(), TINY_SHA256)
    assert archives.import_archive(settings, repo, UPSTREAM, console()) == TINY_COMMIT
    assert leftovers(scratch_root, prefix) == []
    assert leftovers(tmp_path / ".deps" / "cache" / "tmp", "") == []


def test_unlocked_leftovers_go_only_when_old(tmp_path: Path) -> None:
    """Folders left by runs from before the locks: removed once older than any import takes."""
    root = tmp_path / "tmp"
    old, recent, other = root / "archive-old", root / "archive-recent", root / "regenerate-1234"
    for folder in (old, recent, other):
        (folder / "tree").mkdir(parents=True)
        (folder / "tree" / "big").write_bytes(b"x" * 1024)
    aged = time.time() - scratch.STALE_UNLOCKED_AGE - 60
    os.utime(old, (aged, aged))
    os.utime(other, (aged, aged))
    assert scratch.sweep_stale(root, "archive-") == [old]
    assert sorted(p.name for p in root.iterdir()) == ["archive-recent", "regenerate-1234"]


def test_corrupt_cached_archive_is_set_aside_and_the_error_says_so(
    tiny: Path, tmp_path: Path, git_env: dict[str, str]
) -> None:
    settings = settings_for(tmp_path, git_env, tiny.as_uri(), TINY_SHA256)
    cache = tmp_path / ".deps" / "cache" / "archives"
    cache.mkdir(parents=True)
    corrupt = b"truncated by a full disk"
    (cache / f"{TINY_SHA256}.archive").write_bytes(corrupt)
    tiny.unlink()  # the source is gone too: the refetch fails
    repo = new_repo(tmp_path / "work", git_env)
    with pytest.raises(ArchiveError) as info:
        archives.import_archive(settings, repo, UPSTREAM, console())
    error = info.value
    kept = cache / "quarantine" / f"{hashlib.sha256(corrupt).hexdigest()}-{TINY_SHA256}.archive"
    assert error.untouched == (
        "the repository; the cached copy of this archive no longer matched its digest and was moved "
        f"(not deleted) to {kept} before the fetch; nothing else in the download cache changed"
    )
    assert "download cache was untouched" not in error.render()
    assert kept.read_bytes() == corrupt
    assert not (cache / f"{TINY_SHA256}.archive").exists()
    assert archives.archive_commit(repo, UPSTREAM) is None
