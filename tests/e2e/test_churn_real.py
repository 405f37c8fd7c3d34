"""The pin move reviewed by function on the real test-bed: skippy's own queue, 0.3.35 -> 0.3.36.

The expectations are taken from the two real trees independently of the map: the
functions a patch changes are the ones whose text (between the function's first line
and its closing brace at column 0) differs between the pinned file and the patched
one; upstream changed one of them when its text differs between the two upstream trees.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from skippy.cli.entries import summary_main
from tests.gitfixtures import git, hermetic_git_env, pyproject
from tooling.testbed import LlamaTestbed

ROOT = Path(__file__).resolve().parents[2]
PROVENANCE = "core/0001-core-report-skippy-build-provenance.patch"


def top_level_function(text: str, name: str) -> str:
    """The text of the column-0 function ``name`` (its definition line to the next ``}`` at column 0)."""
    match = re.search(rf"^[^\s#/][^\n]*\b{re.escape(name)}\s*\([^;]*?\)\s*(?:const\s*)?\{{.*?^\}}", text, re.M | re.S)
    assert match, name
    return match.group(0)


@pytest.fixture
def own_queue_project(tmp_path: Path, testbed: LlamaTestbed) -> Path:
    root = tmp_path / "project"
    (root / "queue").mkdir(parents=True)
    shutil.copytree(ROOT / "skippy" / "llama_cpp" / "patches", root / "queue" / "patches")
    (root / "pyproject.toml").write_text(pyproject(testbed.url), encoding="utf-8")
    (root / "queue" / "upstream.txt").write_text(testbed.commits["0.3.35"] + "\n", encoding="utf-8")
    return root


def test_summary_maps_the_own_queue_by_function_on_the_real_move(
    own_queue_project: Path, testbed: LlamaTestbed, hermetic_seal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(hermetic_seal)}
    old, new = testbed.commits["0.3.35"], testbed.commits["0.3.36"]
    assert summary_main(env, root=own_queue_project, old=old, new=new) == 0
    markdown = capsys.readouterr().out
    assert "### Review these" in markdown
    assert summary_main(env, root=own_queue_project, old=old, new=new, json=True) == 0
    data = json.loads(capsys.readouterr().out)
    churn = {p["patch"]: p for p in data["churn"]["patches"]}
    # every patch of the queue is listed, with the functions it changes
    folder = own_queue_project / "queue" / "patches"
    patches = sorted(
        ("core/" if p.parent == folder else "") + p.relative_to(folder).as_posix() for p in folder.rglob("*.patch")
    )
    assert sorted(churn) == patches
    provenance = {f["name"]: f for f in churn[PROVENANCE]["functions"]}
    assert {"print_usage", "rpc_server_params_parse"} <= set(provenance)
    assert provenance["print_usage"]["file"] == "tools/rpc/rpc-server.cpp"

    # upstream's side, from the two trees: the map names a commit exactly where the function's text moved
    genv = hermetic_git_env(hermetic_seal)
    rpc_old = git(testbed.path, "show", f"{old}:tools/rpc/rpc-server.cpp", env=genv)
    rpc_new = git(testbed.path, "show", f"{new}:tools/rpc/rpc-server.cpp", env=genv)
    for name in ("print_usage", "rpc_server_params_parse"):
        changed = top_level_function(rpc_old, name) != top_level_function(rpc_new, name)
        assert bool(provenance[name]["upstream"]) == changed, name
    exposed = [p for p in data["churn"]["patches"] if p["exposure"]]
    assert [p["patch"] for p in exposed] == data["churn"]["review"]
    for p in exposed:
        assert p["patch"] in markdown
        for f in p["functions"]:
            for u in f["upstream"]:
                assert u["sha"] == new and u["did"], f
    print("\nreview these:", ", ".join(f"{p['patch']} ({p['exposure']})" for p in exposed))
