"""Messages that fit what was asked: `prepare --latest` with the upstream unreachable does not
talk about an --offline nobody gave, and `status` on a workdir whose .git is empty says so."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from skippy.cli.entries import prepare_main, status_main
from skippy.core.errors import NetworkError, WorkdirError
from skippy.core.files import sha256_of
from skippy.core.ui import Console
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.integration.test_archives_prepare import archive_of, configure
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration


def _run(main: object, capsys: pytest.CaptureFixture[str], **kwargs: object) -> tuple[int, dict[str, object], str]:
    assert callable(main)
    code = main(**kwargs)
    captured = capsys.readouterr()
    return int(code), json.loads(captured.out), captured.err


def test_latest_with_the_upstream_unreachable_does_not_blame_offline(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    missing = (queued_project.root / "missing.git").as_uri()
    configure(queued_project, missing, {pin: (archive, sha256_of(archive))})
    home = Path(os.environ["HOME"])
    allowed = (queued_project.root / ".deps", queued_project.patches)
    before = tree_state([tmp_path, home], allowed)

    code, report, err = _run(
        prepare_main, capsys, env=queued_project.env, root=queued_project.root, latest=True, json=True
    )

    assert code == NetworkError.exit_code, err
    assert report["ok"] is False and report["error"] == "NetworkError"
    what = str(report["what"])
    assert what.startswith(f"--latest needs the upstream, and {missing} did not answer (could not clone {missing}")
    assert what.endswith("a source archive stands in for a pinned commit only, never for the latest one")
    assert report["untouched"] == ".deps/llama.cpp: nothing was cloned or changed"
    assert report["next"] == (
        "check the network and LLAMA_UPSTREAM_URL / [tool.skippy] upstream_url, then re-run with --latest; "
        "`invoke prepare --pinned` prepares the pin from its source archive meanwhile"
    )
    assert "offline" not in what and "--offline" not in str(report["next"]) and "--offline" not in err
    assert not queued_project.workdir.exists()
    assert [p.name for p in queued_project.workdir.parent.iterdir() if p.name.startswith(".skippy-partial")] == []
    assert written_outside(before, tree_state([tmp_path, home], allowed)) == []
    # what the next step says works: the pin prepares from its archive
    assert prepare(queued_project.settings(), Target.pinned(), console=Console(quiet=True)).source == "archive"


def test_latest_with_offline_given_still_says_offline(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    configure(queued_project, str(queued_project.upstream.path), {pin: (archive, sha256_of(archive))})
    code, report, _err = _run(
        prepare_main, capsys, env=queued_project.env, root=queued_project.root, latest=True, offline=True, json=True
    )
    assert code == 2 and report["what"] == "--latest needs the upstream: it cannot run --offline"


def test_status_on_a_workdir_with_an_empty_git_dir_names_it(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=Console(quiet=True))
    git_dir = queued_project.workdir / ".git"
    shutil.rmtree(git_dir)
    git_dir.mkdir()
    everything = tree_state([tmp_path, Path(os.environ["HOME"])], ())

    code, report, err = _run(status_main, capsys, env=queued_project.env, root=queued_project.root, json=True)

    assert code == WorkdirError.exit_code, err
    assert report["ok"] is False and report["error"] == "WorkdirError"
    assert report["what"] == (
        "the workdir's git dir .deps/llama.cpp/.git is empty: it is damaged (not a git repository), "
        "so the workdir's checkout and local work cannot be read"
    )
    assert report["untouched"] == ".deps/llama.cpp and everything in it: nothing was changed"
    assert report["next"] == (
        "move it aside and prepare a fresh one: mv .deps/llama.cpp .deps/llama.cpp.damaged && invoke prepare "
        "(then copy back what you need from .deps/llama.cpp.damaged)"
    )
    assert "exit code 128" not in err and "git status" not in err
    assert written_outside(everything, tree_state([tmp_path, Path(os.environ["HOME"])], ())) == []
    # a .git that lost its objects is named by what it lacks
    (git_dir / "HEAD").write_text("ref: refs/heads/master\n", encoding="utf-8")
    (git_dir / "refs").mkdir()
    code, report, err = _run(status_main, capsys, env=queued_project.env, root=queued_project.root, json=True)
    assert code == WorkdirError.exit_code
    assert str(report["what"]).startswith("the workdir's git dir .deps/llama.cpp/.git lacks objects/: it is damaged")
    # the next step runs: moved aside, prepare makes a fresh workdir
    (queued_project.workdir).rename(queued_project.root / ".deps" / "llama.cpp.damaged")
    assert prepare(settings, Target.pinned(), console=Console(quiet=True)).action == "cloned"
