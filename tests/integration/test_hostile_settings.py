"""Hostile settings through the entry points (issue "Hostile input, round 3"): a workdir that
must never be replaced, a pin file that is not a small regular file, a token in the upstream
URL.  Each is refused (or redacted) with its message, exit code and JSON ``untouched``/``next``,
and nothing outside the workdir, the cache and the patch dir is written."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.app import prepare_main, status_main
from tests.conftest import Project

pytestmark = pytest.mark.integration


def state(paths: Iterable[Path], *, skip: Iterable[Path] = ()) -> dict[str, tuple[int, float]]:
    """Every file and folder under ``paths`` (not under ``skip``): (size, mtime)."""
    skipped = [p.resolve() for p in skip]
    out: dict[str, tuple[int, float]] = {}
    for top in paths:
        for dirpath, dirs, files in os.walk(top):
            here = Path(dirpath)
            dirs[:] = [d for d in dirs if (here / d).resolve() not in skipped]
            for name in (*dirs, *files):
                path = here / name
                info = path.lstat()
                out[str(path)] = (info.st_size, info.st_mtime)
    return out


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def call(
    capsys: pytest.CaptureFixture[str], main: Any, project: Project, env: dict[str, str], **options: Any
) -> tuple[int, dict[str, Any], str]:
    code = main({**project.env, **env}, root=project.root, as_json=True, **options)
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


# --- items 1 and 2: the workdir ---------------------------------------------------------------


@pytest.mark.parametrize("which", ["root", "root-parent", "/", "home", "/tmp", "/dev/null", "patches"])
def test_a_workdir_skippy_must_never_replace_is_refused_before_any_lock(
    queued_project: Project, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    root = queued_project.root.resolve()
    home = Path(queued_project.env["HOME"]).resolve()
    workdir = {
        "root": str(root),
        "root-parent": str(root.parent),
        "/": "/",
        "home": str(home),
        "/tmp": "/tmp",
        "/dev/null": "/dev/null",
        "patches": str(queued_project.patches),
    }[which]
    watched = [Path("/"), Path("/tmp"), Path("/dev"), root.parent, home]
    before = {folder: listing(folder) for folder in watched}
    tree = state([root.parent, home])
    for main, options in ((prepare_main, {"force": True}), (prepare_main, {"latest": True}), (status_main, {})):
        code, report, err = call(capsys, main, queued_project, {"LLAMA_WORKDIR": workdir}, **options)
        assert code == 2, err
        assert report["ok"] is False and report["error"] == "SettingsError"
        assert report["what"].startswith(f"LLAMA_WORKDIR={workdir}: refused as the workdir: it ")
        assert report["untouched"] == "everything: nothing was locked, read or written"
        assert report["next"] == (
            "unset LLAMA_WORKDIR, or give it a directory of its own: "
            f"LLAMA_WORKDIR={root}/.deps/llama.cpp invoke status"
        )
        assert "--force" not in err and "--force" not in json.dumps(report)
        assert f"error: {report['what']}" in err
    if which == "/dev/null":
        assert report["what"].endswith("it is a character device, not a directory")
    elif which == "/tmp" and "/tmp/" not in str(root):
        pass  # the project is elsewhere: /tmp is refused by the workdir checks after the lock
    else:
        assert "and skippy replaces the workdir's whole tree with llama.cpp" in report["what"]
    assert {folder: listing(folder) for folder in watched} == before, "no lock file (nor anything) left"
    assert state([root.parent, home]) == tree, "nothing of the project (nor of $HOME) was written"


def test_the_prepare_lock_is_in_the_cache_dir_one_per_workdir(queued_project: Project) -> None:
    from skippy.queue.guard import lock_path

    settings = queued_project.settings()
    lock = lock_path(settings)
    assert lock.parent == settings.cache_dir / "locks"
    assert lock.name.startswith("llama.cpp-") and lock.name.endswith(".lock")
    other = queued_project.settings(LLAMA_WORKDIR=str(queued_project.root / "elsewhere" / "llama.cpp"))
    assert lock_path(other) != lock, "two workdirs, two locks (same name, another path)"
    same = queued_project.settings(LLAMA_WORKDIR=str(queued_project.root / ".deps" / ".." / ".deps" / "llama.cpp"))
    assert lock_path(same) == lock, "one workdir however it is spelled, one lock"
    assert prepare_main(queued_project.env, root=queued_project.root) == 0
    assert lock.exists()
    assert not (queued_project.workdir.parent / "llama.cpp.lock").exists()
