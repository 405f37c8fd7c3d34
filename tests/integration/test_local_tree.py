"""--workdir-as-is on real git: the workdir's state names the build dir, reading it
writes nothing, and a local binary passes the standalone spot check only when asked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skippy.compile.localtree import read_workdir_state
from skippy.core.errors import BuildError
from tests.gitfixtures import Upstream, git

pytestmark = pytest.mark.integration


def _never(path: str) -> bool:
    return False


def _state_key(up: Upstream, env: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    return read_workdir_state(up.path, env, skip=lambda p: p.startswith(skip) if skip else False).key


def test_the_key_follows_edits_commits_and_new_sources_but_not_ignored_files(
    upstream: Upstream, git_env: dict[str, str]
) -> None:
    up = upstream
    (up.path / ".gitignore").write_text("build/\n")
    git(up.path, "add", ".gitignore", env=git_env)
    git(up.path, "commit", "-qm", "ignore build/", env=git_env)
    clean = _state_key(up, git_env)
    assert _state_key(up, git_env) == clean, "the same state, the same key"

    # ignored outputs and tolerated paths are not sources
    (up.path / "build").mkdir()
    (up.path / "build" / "out.o").write_bytes(b"\0")
    (up.path / "model.gguf").write_bytes(b"GGUF")
    assert _state_key(up, git_env, skip=("model.gguf",)) == clean

    readme = up.path / "README.md"
    original = readme.read_text()
    readme.write_text(original + "an edit\n")
    edited = _state_key(up, git_env, skip=("model.gguf",))
    assert edited != clean
    git(up.path, "add", "README.md", env=git_env)
    assert _state_key(up, git_env, skip=("model.gguf",)) == edited, "staged or not, the same tree"

    git(up.path, "commit", "-qm", "a local commit", env=git_env)
    committed = read_workdir_state(up.path, git_env, skip=lambda p: p == "model.gguf")
    assert committed.key not in (clean, edited)
    assert committed.changed == ()

    (up.path / "src").mkdir(exist_ok=True)
    (up.path / "src" / "new.cpp").write_text("int f() { return 1; }\n")
    with_new = read_workdir_state(up.path, git_env, skip=lambda p: p == "model.gguf")
    assert with_new.key != committed.key
    assert with_new.changed == ("src/new.cpp",)
    (up.path / "src" / "new.cpp").write_text("int f() { return 2; }\n")
    assert _state_key(up, git_env, skip=("model.gguf",)) != with_new.key


def test_reading_the_state_writes_nothing(upstream: Upstream, git_env: dict[str, str]) -> None:
    up = upstream
    (up.path / "README.md").write_text("touched\n")
    index = up.path / ".git" / "index"
    # an old stat cache: git would refresh and rewrite the index if it were allowed to
    os.utime(up.path / "README.md", (1_000_000_000, 1_000_000_000))
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    refs_before = git(up.path, "for-each-ref", env=git_env)
    read_workdir_state(up.path, git_env, skip=_never)
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    assert git(up.path, "for-each-ref", env=git_env) == refs_before


def test_a_directory_without_a_checkout_is_refused(tmp_path: Path, git_env: dict[str, str]) -> None:
    with pytest.raises(BuildError) as info:
        read_workdir_state(tmp_path, git_env, skip=_never)
    assert "nothing to build as it is" in info.value.what
    assert info.value.untouched == "everything: nothing was configured or built"
    assert info.value.next_step is not None and "invoke prepare" in info.value.next_step


def test_the_standalone_spot_check_refuses_a_local_binary_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skippy.cli.entries import spot_main
    from tests.integration.test_spotcheck import Rig, _project, _stamp

    rig = Rig(tmp_path)
    _project(rig)
    _stamp(rig, "a" * 40, "d" * 64)
    local = {"PATH": os.defpath, **rig.env(), "FAKE_LLAMA_PROVENANCE": f"upstream={'a' * 40} queue=local"}
    assert spot_main(["--model", str(rig.model), "--json"], env=local, root=rig.root) == 13
    out = json.loads(capsys.readouterr().out)
    assert out["what"].startswith("stale llama-server")
    assert f"queue digest is local, expected {'d' * 64}" in out["what"]
    assert "--workdir-as-is" in out["next"]
    assert spot_main(["--model", str(rig.model), "--json", "--workdir-as-is"], env=local, root=rig.root) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["queue_digest"] == "local"
    # and the other way round: a prepared binary is not what --workdir-as-is checks
    prepared = {**local, "FAKE_LLAMA_PROVENANCE": f"upstream={'a' * 40} queue={'d' * 64}"}
    assert spot_main(["--model", str(rig.model), "--json", "--workdir-as-is"], env=prepared, root=rig.root) == 13
    assert "nox -s build-cpu -- --workdir-as-is" in json.loads(capsys.readouterr().out)["next"]
