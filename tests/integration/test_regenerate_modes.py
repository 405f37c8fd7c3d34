"""`invoke regenerate` under a strict umask: a patch file whose bytes do not change is not written
at all (same inode, mode and time), a changed one keeps its mode, a new one gets the umask's mode
(as `open` gives it). It used to rewrite every patch file, as 0600 under umask 077."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.cli.entries import prepare_main, regenerate_main
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration

#: `invoke regenerate --json` in a child whose umask is 077
STRICT_UMASK = """
import os, sys
from pathlib import Path
os.umask(0o077)
from skippy.cli.entries import regenerate_main
sys.exit(regenerate_main(os.environ, root=Path(sys.argv[1]), json=True))
"""


def run_git(path: Path, *args: str, **env: str) -> str:
    return git(path, *args, env={**hermetic_git_env(Path(os.environ["HOME"])), **env})


def stats(folder: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every file under ``folder``: inode, permission bits, mtime and bytes."""
    out: dict[str, tuple[int, int, int, bytes]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            info = path.stat()
            out[str(path.relative_to(folder))] = (
                info.st_ino,
                stat.S_IMODE(info.st_mode),
                info.st_mtime_ns,
                path.read_bytes(),
            )
    return out


def test_regenerate_under_umask_077_writes_only_what_changed_and_keeps_modes(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    root, env = queued_project.root, queued_project.env
    assert prepare_main(env, root=root) == 0
    # the fixture's patches were not written by format-patch: normalize them once, then prepare
    assert regenerate_main(env, root=root) == 0
    assert prepare_main(env, root=root) == 0
    capsys.readouterr()
    patches = queued_project.patches
    for path in patches.rglob("*"):
        if path.is_file():
            path.chmod(0o664)
    wdir = queued_project.workdir
    # one patch changes (a fixup squashed in), one is new (a commit after the generated lane)
    stamp_base = json.loads((wdir / ".git" / "skippy" / "prepare.json").read_text())["base_commit"]
    target = run_git(wdir, "log", "--format=%H", "--grep=^Skippy-Patch: core/0002-core-add-provenance.patch$")
    (wdir / "src/provenance.h").write_text("#define SKIPPY 2\n")
    run_git(wdir, "commit", "--quiet", "-a", f"--fixup={target.strip()}")
    run_git(wdir, "rebase", "--quiet", "-i", "--autosquash", stamp_base, GIT_SEQUENCE_EDITOR="true")
    (wdir / "src/qwen.cpp").write_text("// qwen support\n")
    run_git(wdir, "add", "src/qwen.cpp")
    run_git(wdir, "commit", "--quiet", "-m", "qwen: model support")
    before = stats(patches)

    child = subprocess.run(
        [sys.executable, "-c", STRICT_UMASK, str(root)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout)["ok"] is True
    after = stats(patches)

    changed = {name for name in after if after[name] != before.get(name)}
    assert changed == {
        "0002-core-add-provenance.patch",
        "model_support/0002-qwen-model-support.patch",
        "model_support/series",
    }
    for name in changed - {"model_support/0002-qwen-model-support.patch"}:
        assert after[name][1] == 0o664, f"{name} kept its mode"
    assert after["model_support/0002-qwen-model-support.patch"][1] == 0o600, "a new file gets the umask's mode"
    for name in set(before) - changed:
        assert after[name] == before[name], f"{name} was not written"
    assert set(after) == set(before) | {"model_support/0002-qwen-model-support.patch"}
