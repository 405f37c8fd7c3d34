"""A full file system during a checkout or an archive import is named by its mount point (the
one that is full, not the workdir's), with its free space, and the run leaves nothing half-made.
The file system is a real small tmpfs mounted as the workdir's parent or as the cache's scratch
folder (root only: skipped without it, failed on CI)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy.cli.entries import prepare_main
from skippy.core.errors import WorkdirError
from skippy.core.files import sha256_of
from tests.conftest import Project
from tests.e2e.needs import cannot_run
from tests.integration.test_archives_prepare import archive_of, configure
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration


@pytest.fixture
def tmpfs() -> Iterator[object]:
    """``mount(path, size)``: a real tmpfs at ``path``; unmounted afterwards whatever happens."""
    if os.geteuid() != 0:
        cannot_run("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "skippy-test", str(path)], check=True)
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "--lazy", str(path)], check=False)


def _big(project: Project) -> str:
    """An upstream commit with 4 MB of poorly compressible text (a 2 MB pack, 4 MB checked out)."""
    data = os.urandom(2 * 1024 * 1024).hex()
    sha = project.upstream.commit("upstream: big file", {"big.txt": data})
    project.pin(sha)
    return sha


def _prepare(project: Project, capsys: pytest.CaptureFixture[str], **options: object) -> tuple[int, dict[str, object]]:
    code = prepare_main(project.env, root=project.root, json=True, **options)
    return code, json.loads(capsys.readouterr().out)


def test_a_checkout_that_fills_the_disk_names_the_file_system(
    queued_project: Project, tmp_path: Path, tmpfs: object, capsys: pytest.CaptureFixture[str]
) -> None:
    _big(queued_project)
    deps = queued_project.root / ".deps"
    assert callable(tmpfs)
    tmpfs(deps, "5m")
    before = tree_state([tmp_path, Path(os.environ["HOME"])], [deps])

    code, report = _prepare(queued_project, capsys)

    assert code == WorkdirError.exit_code, report
    what = str(report["what"])
    assert what.startswith("cannot write .deps/.skippy-partial-llama.cpp-"), what
    assert what.endswith(": No space left on device (git checkout)"), what
    assert "exit code 128" not in what
    assert report["untouched"] is not None and str(report["untouched"]).startswith(".deps/llama.cpp: ")
    nxt = str(report["next"])
    assert nxt.startswith(f"free space on the file system mounted at {deps} (it holds .deps/.skippy-partial-"), nxt
    assert f"`df -h {deps}` shows it: " in nxt and nxt.endswith(" now), then re-run `invoke prepare`")
    # nothing half-made is left: the partial clone is gone, and no workdir was made
    # (the prepare lock lives in the cache, .deps/cache/locks)
    assert sorted(p.name for p in deps.iterdir()) == ["cache"]
    assert [p.parent.name for p in (deps / "cache").rglob("*") if p.is_file()] == ["locks"]
    assert written_outside(before, tree_state([tmp_path, Path(os.environ["HOME"])], [deps])) == []


def test_a_full_scratch_folder_during_an_archive_import_names_its_file_system(
    queued_project: Project, tmp_path: Path, tmpfs: object, capsys: pytest.CaptureFixture[str]
) -> None:
    pin = _big(queued_project)
    archive = archive_of(queued_project, pin)
    configure(queued_project, str(queued_project.upstream.path), {pin: (archive, sha256_of(archive))})
    queued_project.pin(pin)
    scratch = queued_project.root / ".deps" / "cache" / "tmp"
    assert callable(tmpfs)
    tmpfs(scratch, "1m")
    allowed = [queued_project.root / ".deps"]
    before = tree_state([tmp_path, Path(os.environ["HOME"])], allowed)

    code, report = _prepare(queued_project, capsys, offline=True)

    assert code == WorkdirError.exit_code, report
    what = str(report["what"])
    assert what.startswith("cannot write .deps/cache/tmp/archive-") and what.endswith(": No space left on device")
    assert "while writing in .deps/llama.cpp" not in what
    nxt = str(report["next"])
    assert nxt.startswith(f"free space on the file system mounted at {scratch} (it holds .deps/cache/tmp/archive-")
    assert f"`df -h {scratch}` shows it: " in nxt and nxt.endswith("then re-run `invoke prepare --offline`")
    assert report["untouched"] is not None
    assert list(scratch.iterdir()) == [], "the scratch folder of the run is removed"
    assert not queued_project.workdir.exists()
    assert written_outside(before, tree_state([tmp_path, Path(os.environ["HOME"])], allowed)) == []
