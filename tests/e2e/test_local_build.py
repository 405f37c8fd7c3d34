"""The maintainer's edit loop on the real tree: commit a change and edit a file in a
copy of the prepared workdir, build it with ``--workdir-as-is`` (real CMake, Ninja,
compiler cache), spot-check the binary on the real model; its provenance says
``local``, the project's pinned build dir is untouched, and prepare still refuses
the copy until the change is forced away (or regenerated into the queue).

The copy lives at a fixed path under ``.deps/e2e`` (replaced on every run), so the
compiler cache serves it on later runs; only the two changed sources miss.
"""

from __future__ import annotations

import io
import re
import shutil
import time
from pathlib import Path

import pytest

from skippy.compile.backends.base import SERVER_TARGET
from skippy.compile.builder import BuildReport, read_stamp
from skippy.compile.plan import STAMP_NAME
from skippy.compile.request import build_request
from skippy.core import proc
from skippy.core.errors import DirtyWorkdirError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionRequest, run_build_session
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare
from skippy.spot.binaries import parse_provenance
from skippy.spot.report import SpotCheckReport

pytestmark = pytest.mark.e2e

#: small sources of llama-server: a comment in each recompiles two objects, moves no number
COMMITTED = "src/llama-cparams.cpp"
EDITED = "src/llama-hparams.cpp"


def _snapshot(build: BuildReport) -> tuple[int, bytes, int]:
    stamp = build.build_dir / STAMP_NAME
    return stamp.stat().st_mtime_ns, stamp.read_bytes(), build.binaries[SERVER_TARGET].stat().st_mtime_ns


@pytest.fixture
def local_settings(project_settings: Settings, cpu_build: BuildReport) -> Settings:
    """A copy of the project's prepared workdir (stamp and refs included), as the workdir."""
    copy = project_settings.root / ".deps" / "e2e" / "local-build" / "llama.cpp"
    if copy.exists():
        shutil.rmtree(copy)
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(project_settings.workdir, copy, symlinks=True)
    for stale in project_settings.build_root.glob("cpu-*-local-*"):
        # the local dir of an earlier run of this test (same copy, same change): built afresh
        stamp = read_stamp(stale / STAMP_NAME)
        if stamp is not None and stamp.get("source_dir") == str(copy):
            shutil.rmtree(stale)
    return Settings.load(project_settings.root, {**project_settings.env, "LLAMA_WORKDIR": str(copy)})


def test_a_local_change_builds_beside_the_pinned_build_and_is_spot_checked(
    project_settings: Settings, cpu_build: BuildReport, default_model: Path, local_settings: Settings
) -> None:
    pinned_before = _snapshot(cpu_build)
    work = local_settings.workdir
    repo = Repo(work, local_settings.env)
    prepared_head = repo.head()
    for rel, note in ((COMMITTED, "a local commit"), (EDITED, "an uncommitted edit")):
        path = work / rel
        path.write_text(path.read_text(encoding="utf-8") + f"// skippy e2e: {note}\n", encoding="utf-8")
    repo.git("add", COMMITTED)
    repo.git("commit", "-q", "-m", "e2e: a local change")
    head = repo.head()
    assert head != prepared_head
    status_before = repo.out("status", "--porcelain")
    assert status_before == f"M {EDITED}"

    stream = io.StringIO()
    started = time.monotonic()
    request = SessionRequest(build_request("cpu", local_settings), workdir_as_is=True)
    outcome = run_build_session(request, local_settings, Console(env={}, stream=stream))
    seconds = time.monotonic() - started
    out = stream.getvalue()
    report = outcome.build
    assert report is not None and outcome.local is not None
    cache = report.cache.render() if report.cache else "no compiler cache"
    print(f"local build + spot check: {seconds:.1f} s; configure {report.configure_seconds:.1f} s, "
          f"build {report.build_seconds:.1f} s, {report.compiled} compile steps; {cache}")  # fmt: skip

    # its own dir, named by the workdir's state, beside the pinned one; this copy is another workdir,
    # so its key is not the pinned tree's (two workdirs never share a build dir)
    assert report.build_dir.parent == cpu_build.build_dir.parent
    assert re.fullmatch(r"cpu-[0-9a-f]{10}-local-" + re.escape(outcome.local.state.short), report.build_dir.name)
    assert not report.build_dir.name.startswith(cpu_build.build_dir.name), "another workdir, another key"
    assert report.mode == "local"
    assert report.configured and report.compiled > 0, "a real configure and build in a new dir"
    stamp = read_stamp(report.build_dir / STAMP_NAME)
    assert stamp is not None
    assert (stamp["mode"], stamp["patched_sha"], stamp["source_dir"]) == ("local", head, str(work))
    assert outcome.local.state.changed == (EDITED,)
    assert "AS IT STANDS (--workdir-as-is)" in out
    assert "a local, unregistered tree" in out

    # the binary says so itself, and the spot check passed on it
    version = proc.run([report.binaries[SERVER_TARGET], "--version"], env=local_settings.env, check=False)
    provenance = parse_provenance(version.stdout + version.stderr)
    prepared_stamp = wd.read_stamp(wd.git_dir_of(work) or work / ".git")
    assert prepared_stamp is not None
    assert provenance is not None
    assert (provenance.upstream_sha, provenance.queue_digest) == (prepared_stamp.upstream_sha, "local")
    assert isinstance(outcome.spot, SpotCheckReport)
    assert outcome.spot.provenance == provenance
    assert outcome.spot.ok

    # nothing of the workdir was touched, nor the pinned build
    assert repo.head() == head
    assert repo.out("status", "--porcelain") == status_before
    assert _snapshot(cpu_build) == pinned_before

    _prepare_refuses_until_forced(local_settings, repo, head=head, prepared_head=prepared_head)


def _prepare_refuses_until_forced(
    settings: Settings, repo: Repo, *, head: str | None, prepared_head: str | None
) -> None:
    """prepare still refuses the change until it is carried into the queue or forced away."""
    with pytest.raises(DirtyWorkdirError) as info:
        prepare(settings, Target.pinned(), console=Console(env={}, stream=io.StringIO()), offline=True)
    text = info.value.render()
    assert EDITED in text
    assert repo.head() == head, "refused: nothing moved"
    forced = prepare(settings, Target.pinned(), console=Console(env={}, stream=io.StringIO()), offline=True, force=True)
    assert repo.head() == forced.patched_sha == prepared_head
    assert repo.out("status", "--porcelain") == ""
