"""A downstream's own generator makes the generated lane on the real pinned tree.

A copy of this project (pyproject, tasks, noxfile and queue under ``.deps/e2e/plugin``, the pin
from its source archive) names a generator script of its own in ``[tool.skippy.generated]``, with
``compile_commands = true``.  The script edits graph code as downstream generators do: for each
family skippy hands it (``SKIPPY_FAMILIES``) it checks that the family's builder file is compiled
(the ``compile_commands.json`` of a configured build of the tree, ``SKIPPY_COMPILE_COMMANDS``) and
puts the core lane's layer hook after the layer loop's ``cb(cur, "l_out", il);`` with plain text
edits.  Each step is the README's own command:

1. ``invoke generate``: one shard per family, the manifest naming the command and each shard's
   sha256 (the second pass, run inside, changed nothing); ``invoke generate --check`` is clean;
2. a hand edit of one shard: ``invoke generate --check`` names that family and no other;
3. ``nox -s build-cpu`` builds the tree with the lane applied and spot-checks it; the built
   server, traced, runs the generator's hooks: 2 per graph for ``tiny:qwen2`` (2 layers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import genmanifest
from skippy.spot.spotcheck import spot_check
from tests.e2e.copies import copy_project

ROOT = Path(__file__).resolve().parents[2]
PLUG = ROOT / ".deps" / "e2e" / "plugin"

SPEC = """\
schema = 2

[[family]]
name = "qwen2"
arch = "LLM_ARCH_QWEN2"

[[family]]
name = "llama"
arch = "LLM_ARCH_LLAMA"
"""

GENERATOR = '''\
"""A downstream's family generator: a trace call at the end of each layer (plain text edits)."""
import json
import os
import pathlib
import sys

families = json.loads(pathlib.Path(os.environ["SKIPPY_FAMILIES"]).read_text())["families"]
tree = pathlib.Path(os.environ["SKIPPY_TREE"])
commands = json.loads(pathlib.Path(os.environ["SKIPPY_COMPILE_COMMANDS"]).read_text())
compiled = {pathlib.Path(c["directory"], c["file"]).resolve() for c in commands}
ANCHOR = 'cb(cur, "l_out", il);\\n'
HOOK = "llama_skippy_layer_hook(this, cur, il); // downstream trace\\n"
for family in families:
    path = tree / family["builder_file"]
    if path.resolve() not in compiled:
        sys.exit(f"{path} is not compiled by the configured build")
    text = path.read_text()
    if HOOK in text:
        continue
    head, anchor, tail = text.partition(ANCHOR)
    if not anchor:
        sys.exit(f"{path}: no l_out anchor")
    indent = head.rsplit("\\n", 1)[1]
    path.write_text(head + anchor + indent + HOOK + tail)
'''


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_", "NOX_"))}
    env.pop("CI", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", os.defpath)
    return env


def run(*argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", *argv], cwd=PLUG, env=user_env(), capture_output=True, text=True, check=False
    )
    if ok:
        assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result


def make_project() -> Path:
    """The project copy with the generator script and its settings; its generated lane folder."""
    tail = '\n[tool.skippy.generated]\ncommand = ["python3", "tools/trace_families.py"]\ncompile_commands = true\n'
    copy_project(PLUG, pyproject_tail=tail, replace=("tools",))
    (PLUG / "tools").mkdir()
    (PLUG / "tools" / "trace_families.py").write_text(GENERATOR, encoding="utf-8")
    lane = PLUG / "queue" / "patches" / "generated"
    (lane / "families.toml").write_text(SPEC, encoding="utf-8")
    return lane


@pytest.mark.timeout(3600)
def test_a_users_generator_on_the_pinned_tree(pinned_sdist: Path) -> None:
    lane = make_project()
    # --- 1. the lane, from the user's generator
    made = run("invoke", "generate", "--offline")
    assert "2 family patch(es)" in made.stdout, made.stdout
    assert (lane / "series").read_text() == "0001-family-qwen2.patch\n0002-family-llama.patch\n"
    for name, family in (("0001-family-qwen2.patch", "qwen2"), ("0002-family-llama.patch", "llama")):
        text = (lane / name).read_text()
        assert f"diff --git a/src/models/{family}.cpp b/src/models/{family}.cpp" in text
        assert text.count("+        llama_skippy_layer_hook(this, cur, il); // downstream trace\n") == 1
        assert "the command in [tool.skippy.generated] (`python3 tools/trace_families.py`)" in text
    manifest = (lane / "inputs.sha256").read_text()
    assert '# command: ["python3", "tools/trace_families.py"]' in manifest
    lines = genmanifest.manifest_lines(manifest)
    assert lines["generator command"].startswith("sha256:")
    assert {k for k in lines if k.startswith("shard ")} == {
        "shard 0001-family-qwen2.patch",
        "shard 0002-family-llama.patch",
    }
    assert not (lane / "0001-family-gemma3.patch").exists()  # the old lane's shards are gone
    run("invoke", "generate", "--check", "--offline")

    # --- 2. a hand edit of one shard is drift, named
    shard = lane / "0002-family-llama.patch"
    good = shard.read_bytes()
    shard.write_bytes(good.replace(b"// downstream trace", b"// downstream trace (edited)"))
    drifted = run("invoke", "generate", "--check", "--offline", "--json", ok=False)
    assert drifted.returncode == 3, drifted.stderr
    data = json.loads(drifted.stdout)
    assert "(families: llama)" in data["what"], data
    shard.write_bytes(good)

    # --- 3. built with the lane applied, and the generator's hooks run
    built = run("nox", "-s", "build-cpu")
    assert "spot check" in (built.stdout + built.stderr).lower()
    settings = Settings.load(PLUG, user_env())
    servers = sorted((PLUG / ".deps" / "llama-build").glob("cpu-*/bin/llama-server"))
    assert servers, "the build made llama-server"
    report = spot_check(
        settings,
        servers[-1],
        ["tiny:qwen2"],
        console=Console(env={}),
        server_env={"LLAMA_SKIPPY_TRACE": "1"},
        recheck=True,  # its server's log is read
    )
    (result,) = report.results
    assert result.verdict == "pass", result.reason
    assert result.log_path is not None
    log = Path(result.log_path).read_text(encoding="utf-8", errors="replace")
    traced = {line.split("skippy: graph ", 1)[1] for line in log.splitlines() if "skippy: graph " in line}
    assert traced and all(t.startswith("arch=qwen2 ") and t.endswith(" layer_hooks=2") for t in traced), traced
