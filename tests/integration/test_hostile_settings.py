"""Hostile settings through the entry points (issue "Hostile input, round 3"): a workdir that
must never be replaced, a pin file that is not a small regular file, a token in the upstream
URL.  Each is refused (or redacted) with its message, exit code and JSON ``untouched``/``next``,
and nothing outside the workdir, the cache and the patch dir is written."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.entries import prepare_main, status_main
from tests.conftest import Project
from tests.gitfixtures import git

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


def skippy_could_make(folder: Path, project: Project) -> set[str]:
    """The entries of a shared folder (``/``, ``/tmp``, ``/dev``: other processes write there
    too) that skippy could have made, the folder being a workdir or a workdir's parent: a
    clone's ``.git`` and upstream's files inside, a partial clone, an old checkout, a lock or a
    compat link beside.  Only these are compared before and after."""
    upstream = set(git(project.upstream.path, "ls-tree", "--name-only", "HEAD", env=project.upstream.env).split())
    return {
        name
        for name in listing(folder)
        if name in upstream | {".git", "llama.cpp"}
        or name.startswith((".skippy", "llama.cpp"))
        or name.endswith(".lock")
        or ".before-reclone-" in name
    }


def call(
    capsys: pytest.CaptureFixture[str], main: Any, project: Project, env: dict[str, str], **options: Any
) -> tuple[int, dict[str, Any], str]:
    code = main({**project.env, **env}, root=project.root, json=True, **options)
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


# --- items 1 and 2: the workdir ---------------------------------------------------------------


@pytest.mark.parametrize("which", ["root", "root-parent", "/", "home", "/tmp", "/dev/null", "patches"])
def test_a_workdir_skippy_must_never_replace_is_refused_before_any_lock(
    queued_project: Project,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    which: str,
) -> None:
    # a TMPDIR of its own (Python's temporary files and the children's), inside the tree compared
    own_tmp = tmp_path / "tmpdir"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    queued_project.env["TMPDIR"] = str(own_tmp)
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
    # shared folders: only what skippy could have made there is compared (other processes,
    # the other test worker's compiler among them, write /tmp all the time)
    shared = [Path("/"), Path("/tmp"), Path("/dev")]
    before = {folder: skippy_could_make(folder, queued_project) for folder in shared}
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
    assert {folder: skippy_could_make(folder, queued_project) for folder in shared} == before, "no lock file left"
    assert state([root.parent, home]) == tree, "nothing of the project (nor of $HOME, nor in its TMPDIR) was written"
    assert listing(own_tmp) == set()


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


# --- item 6: the pin file ---------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["/dev/zero", "link to /dev/zero", "directory", "fifo", "big"])
def test_a_pin_file_that_is_not_a_small_regular_file_is_refused_without_reading_it(
    queued_project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path, which: str
) -> None:
    odd = tmp_path / "odd-pin"
    if which == "link to /dev/zero":
        odd.symlink_to("/dev/zero")
    elif which == "directory":
        odd.mkdir()
    elif which == "fifo":
        os.mkfifo(odd)
    elif which == "big":
        odd.write_bytes(b"#" * (64 * 1024 + 1))
    pin = "/dev/zero" if which == "/dev/zero" else str(odd)
    kind = {
        "/dev/zero": "a character device, not a regular file",
        "link to /dev/zero": "a symbolic link to /dev/zero, a character device, not a regular file",
        "directory": "a directory, not a regular file",
        "fifo": "a FIFO (named pipe), not a regular file",
        "big": "65537 bytes, over the 65536-byte limit of a pin file",
    }[which]
    tree = state([queued_project.root.parent], skip=[odd])
    for main, options in ((status_main, {}), (prepare_main, {}), (prepare_main, {"latest": True})):
        code, report, err = call(capsys, main, queued_project, {"LLAMA_PIN_FILE": pin}, **options)
        assert code == 2, err
        assert report["error"] == "SettingsError"
        assert report["what"] == f"LLAMA_PIN_FILE={pin}: refused as the pin file: it is {kind}"
        assert report["untouched"] == "everything: nothing was read or written"
        assert report["next"] == (
            f"unset LLAMA_PIN_FILE, or set pin_file under [tool.skippy] in {queued_project.root}/pyproject.toml "
            "to a small regular file holding one 40-hex upstream commit, then re-run `invoke status`"
        )
        assert "Traceback" not in err
    assert state([queued_project.root.parent], skip=[odd]) == tree


@pytest.mark.timeout(60)
def test_read_pin_itself_never_opens_a_fifo_nor_reads_past_the_limit(queued_project: Project) -> None:
    """The file may change after the settings were checked: reading it is bounded too."""
    from skippy.core.errors import SettingsError
    from skippy.queue.target import read_pin

    settings = queued_project.settings()
    pin = settings.pin_file
    pin.unlink()
    os.mkfifo(pin)
    with pytest.raises(SettingsError, match=r"refused as the pin file: it is a FIFO \(named pipe\), not a regular"):
        read_pin(settings)
    pin.unlink()
    pin.write_bytes(b"0" * (1 << 20))
    with pytest.raises(SettingsError, match="it is 1048576 bytes, over the 65536-byte limit"):
        read_pin(settings)


# --- item 5: a token in LLAMA_UPSTREAM_URL ------------------------------------------------------

# nothing listens on port 9: the clone fails
TOKEN_URL = "https://user:SECRET@127.0.0.1:9/none.git"  # noqa: S105 - a fake token the test checks is never shown


@pytest.mark.timeout(120)
def test_a_token_in_the_upstream_url_is_never_shown(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**queued_project.env, "LLAMA_UPSTREAM_URL": TOKEN_URL}
    runs = [
        (prepare_main, {"latest": True, "json": True}),
        (prepare_main, {"latest": True, "verbose": True}),
        (status_main, {}),
        (status_main, {"json": True}),
    ]
    seen = ""
    for main, options in runs:
        code = main(env, root=queued_project.root, **options)
        out = capsys.readouterr()
        assert "SECRET" not in out.out and "SECRET" not in out.err, (main, options, out)
        seen += out.out + out.err
        if main is prepare_main:
            assert code == 5, out.err  # NetworkError
        if options.get("json") and main is prepare_main:
            report = json.loads(out.out)
            assert report["what"] == "could not clone https://***@127.0.0.1:9/none.git after 2 attempt(s)"
            assert report["next"].startswith("check the network and LLAMA_UPSTREAM_URL")
            assert report["untouched"] == ".deps/llama.cpp: nothing was changed"
    assert "https://***@127.0.0.1:9/none.git" in seen, "the URL is shown, masked"
    assert "$ git" in seen, "--verbose echoed the git commands (masked)"
