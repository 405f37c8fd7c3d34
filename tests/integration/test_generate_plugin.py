"""A user's own generator (``[tool.skippy.generated] command``) on a fixture upstream: the lane it
makes (one shard per family, by the spec's paths), its identity in the manifest, idempotence, and
every way it can misbehave refused with the lane left as it was."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from skippy.cli.entries import generate_main
from skippy.core.errors import QueueError, SettingsError
from skippy.core.ui import Console
from skippy.maintain import generate, genmanifest
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.integration.test_generate import write_spec
from tests.integration.test_parity_fixtures import arch_upstream, snapshot

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)

SPEC = """\
schema = 2

[[family]]
name = "llama"
arch = "LLM_ARCH_LLAMA"
paths = ["src/models/llama.cpp", "docs/families/llama.md"]

[[family]]
name = "gemma3"
arch = "LLM_ARCH_GEMMA3"
paths = ["src/models/gemma3.cpp", "docs/families/gemma3.md"]
"""

#: a downstream's own generator: plain text edits (no parser), the mode from its first argument
GENERATOR = r"""
import json, os, pathlib, subprocess, sys, time

mode = sys.argv[1]
families = json.loads(pathlib.Path(os.environ["SKIPPY_FAMILIES"]).read_text())["families"]
tree = pathlib.Path(os.environ["SKIPPY_TREE"])
assert pathlib.Path.cwd() == tree, (pathlib.Path.cwd(), tree)
if mode == "fail":
    print("gen: cannot read the model table", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    time.sleep(3600)
for family in families:
    path = tree / family["builder_file"]
    text = path.read_text()
    marker = f"// downstream: traced family {family['name']}\n"
    if marker not in text:
        anchor = 'cb(cur, "l_out", il);\n'
        text = text.replace(anchor, anchor + "        " + marker, 1)
        path.write_text(text)
    notes = tree / "docs" / "families" / (family["name"] + ".md")
    notes.parent.mkdir(parents=True, exist_ok=True)
    line = f"{family['name']}: {family['arch']} ({family['model_class']})\n"
    if mode == "flaky":
        line += f"run at {time.time_ns()}\n"
    notes.write_text(line)
if mode == "stray":
    (tree / "src" / "llama-model.cpp").write_text("// rewritten\n")
if mode == "escape":
    (tree.parent / "escape.txt").write_text("x\n")
if mode == "project":
    pathlib.Path(sys.argv[2]).write_text("x\n")
if mode == "link":
    os.symlink("/etc/hostname", tree / "docs" / "families" / "host.md")
if mode == "commit":
    subprocess.run(["git", "commit", "-qam", "mine", "--no-verify"], check=True, env={**os.environ,
        "GIT_AUTHOR_NAME": "g", "GIT_AUTHOR_EMAIL": "g@x", "GIT_COMMITTER_NAME": "g", "GIT_COMMITTER_EMAIL": "g@x"})
"""


def use_generator(project: Project, *args: str, timeout: float = 120.0, extra: str = "") -> Path:
    script = project.root / "tools" / "gen.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(GENERATOR, encoding="utf-8")
    argv = json.dumps([sys.executable, "tools/gen.py", *args])
    pyproject = project.root / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8").split("\n[tool.skippy.generated]\n")[0]
    pyproject.write_text(
        text + f"\n[tool.skippy.generated]\ncommand = {argv}\ntimeout = {timeout}\n{extra}", encoding="utf-8"
    )
    return script


def ready(project: Project, *args: str, timeout: float = 120.0) -> Path:
    arch_upstream(project)
    write_spec(project, SPEC)
    return use_generator(project, *args, timeout=timeout)


def test_a_users_generator_makes_one_shard_per_family(project: Project) -> None:
    script = ready(project, "ok")
    settings = project.settings()
    lane, drift = generate.run_generate(settings, console=QUIET)
    assert not drift.ok  # nothing was there before
    folder = project.patches / "generated"
    assert (folder / "series").read_text() == "0001-family-llama.patch\n0002-family-gemma3.patch\n"
    llama = (folder / "0001-family-llama.patch").read_text()
    assert "diff --git a/docs/families/llama.md b/docs/families/llama.md" in llama
    assert "+        // downstream: traced family llama\n" in llama
    assert "gemma3" not in llama.split("---\n", 1)[1]
    assert lane.shard_files == {
        "llama": ("docs/families/llama.md", "src/models/llama.cpp"),
        "gemma3": ("docs/families/gemma3.md", "src/models/gemma3.cpp"),
    }
    assert "the command in [tool.skippy.generated]" in llama
    text = (folder / "inputs.sha256").read_text()
    manifest = genmanifest.manifest_lines(text)
    assert manifest["generator command"].startswith("sha256:")
    assert f'# command: ["{sys.executable}", "tools/gen.py", "ok"]' in text
    first = snapshot(folder)

    # idempotent end to end: a second `invoke generate` writes the same bytes, --check is clean
    generate.run_generate(settings, console=QUIET)
    assert snapshot(folder) == first
    assert generate.run_generate(settings, console=QUIET, check=True)[1].ok

    # the lane applies
    prepare(settings, Target.pinned(), console=QUIET)
    assert "// downstream: traced family gemma3" in (project.workdir / "src/models/gemma3.cpp").read_text()
    assert (project.workdir / "docs/families/llama.md").read_text() == "llama: LLM_ARCH_LLAMA (llama_model_llama)\n"

    # the generator's own file is an input: an edit to it is drift, named
    script.write_text(script.read_text() + "\n# a comment\n", encoding="utf-8")
    with pytest.raises(QueueError) as info:
        generate.run_generate(settings, console=QUIET, check=True)
    assert "generator command" in (info.value.details or "")
    assert snapshot(folder) == first


def test_check_names_the_family_whose_shard_was_edited(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    ready(project, "ok")
    generate.run_generate(project.settings(), console=QUIET)
    path = project.patches / "generated" / "0002-family-gemma3.patch"
    path.write_text(path.read_text().replace("traced family gemma3", "traced family gemma-3"), encoding="utf-8")
    assert generate_main(project.env, root=project.root, check=True, json=True) == QueueError.exit_code
    data = json.loads(capsys.readouterr().out)
    assert "(families: gemma3)" in data["what"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("flaky",), "not idempotent: a second pass over its own result changed 2 file(s)"),
        (("fail",), "failed (first pass)"),
        (("stray",), "do not split into one patch per family"),
        (("escape",), "wrote outside its tree (first pass)"),
        (("link",), "wrote outside its tree (first pass)"),
        (("commit",), "wrote outside its tree (first pass)"),
    ],
)
def test_a_misbehaving_generator_leaves_the_lane_as_it_was(
    project: Project, args: tuple[str, ...], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ready(project, "ok")
    generate.run_generate(project.settings(), console=QUIET)
    folder = project.patches / "generated"
    before = snapshot(folder)
    use_generator(project, *args)
    code = generate_main(project.env, root=project.root, json=True)
    data = json.loads(capsys.readouterr().out)
    assert code == QueueError.exit_code, data
    assert expected in data["what"]
    assert data["untouched"].startswith("everything: the generated lane was not changed")
    assert "`invoke generate`" in data["next"]
    assert snapshot(folder) == before
    details = data["details"] or ""
    named = {
        "flaky": "M docs/families/llama.md",
        "fail": "gen: cannot read the model table",
        "stray": "src/llama-model.cpp: changed, but in no family's paths",
        "escape": "wrote escape.txt beside the tree",
        "link": "added a symlink docs/families/host.md",
        "commit": "moved the tree's HEAD",
    }[args[0]]
    assert named in details or named in data["what"]


def test_a_generator_writing_into_the_project_is_named(project: Project) -> None:
    ready(project, "ok")
    stray = project.root / "stray.txt"
    use_generator(project, "project", str(stray))
    with pytest.raises(QueueError, match="wrote outside its tree") as info:
        generate.run_generate(project.settings(), console=QUIET)
    assert "changed stray.txt of the project" in (info.value.details or "")
    assert not (project.patches / "generated" / "series").exists()


def test_a_hanging_generator_is_stopped_at_its_timeout(project: Project) -> None:
    ready(project, "hang", timeout=2)
    with pytest.raises(QueueError, match="timed out after 2 s"):
        generate.run_generate(project.settings(), console=QUIET)
    assert not (project.patches / "generated" / "series").exists()


def test_generated_settings_are_checked(project: Project) -> None:
    arch_upstream(project)
    write_spec(project, SPEC)
    pyproject = project.root / "pyproject.toml"
    base = pyproject.read_text(encoding="utf-8")
    for table, expected in (
        ("command = 3\n", "command must be a list of non-empty strings"),
        ('command = ["x"]\ntimeout = 0\n', "timeout must be seconds between 1 and 86400"),
        ("compile_commands = true\n", "compile_commands is for a generator command"),
        ('command = ["x"]\nbogus = 1\n', "unknown key(s) bogus"),
    ):
        pyproject.write_text(base + "\n[tool.skippy.generated]\n" + table, encoding="utf-8")
        with pytest.raises(SettingsError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            generate.run_generate(project.settings(), console=QUIET)
