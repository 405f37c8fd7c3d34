"""Pin bumps on the real test-bed: the llama.cpp trees of llama-cpp-python 0.3.35 -> 0.3.36.

The project used here lives under ``.deps/e2e/pinbump`` (kept between runs, so
a second run rebuilds only what changed); downloads and the compiler cache are
shared with the project's own ``.deps/cache``.
"""

from __future__ import annotations

import io
import os
import re
import shutil
from pathlib import Path

from skippy.core import proc
from skippy.core.git import hermetic_env
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump.bisect import run_bisect
from skippy.flows.pinbump.bump import pin_bump
from skippy.queue.prepare import Target, prepare, triage_target
from tooling.testbed import LlamaTestbed

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / ".deps" / "e2e" / "pinbump"

PYPROJECT = """\
[project]
name = "pinbump-e2e"
version = "0"

[tool.skippy]
upstream_url = "{url}"
pin_file = "upstream.txt"
patch_dir = "patches"
workdir = "work/llama.cpp"
build_root = "build"
cache_dir = "{cache}"
compat_link = false
"""


def make_project(bed: LlamaTestbed, name: str) -> Settings:
    root = BASE / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        PYPROJECT.format(url=bed.url, cache=ROOT / ".deps" / "cache"), encoding="utf-8"
    )
    (root / "upstream.txt").write_text(bed.commits["0.3.35"] + "\n", encoding="utf-8")
    patches = root / "patches"
    if patches.exists():
        shutil.rmtree(patches)
    patches.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_"))}
    env.pop("CI", None)
    return Settings.load(root, env)


def changed_line(settings: Settings, old: str, new: str, path: str) -> tuple[str, int]:
    """A line of ``path`` at ``old`` that ``new`` changed (from the real upstream diff)."""
    genv = hermetic_env(settings.env, settings.workdir.parent)
    diff = proc.run(["git", "-C", str(settings.workdir), "diff", "-U0", old, new, "--", path], env=genv).stdout
    for hunk in re.finditer(r"^@@ -(\d+)(?:,(\d+))? ", diff, flags=re.MULTILINE):
        count = int(hunk[2]) if hunk[2] is not None else 1
        if count >= 1:
            return path, int(hunk[1])
    raise AssertionError(f"{path} has no changed line between the versions")


def test_triage_names_the_true_conflict(testbed: LlamaTestbed) -> None:
    """A queue patch that edits a line upstream 0.3.36 changed: the right patch, path and upstream commit."""
    settings = make_project(testbed, "triage")
    console = Console(env={}, stream=io.StringIO())
    prepare(settings, Target.pinned(), console=console, interactive=False)
    old, new = testbed.commits["0.3.35"], testbed.commits["0.3.36"]
    genv = hermetic_env(settings.env, settings.workdir.parent)
    names = proc.run(
        ["git", "-C", str(settings.workdir), "diff", "--name-only", old, new, "--", "src/*.cpp"], env=genv
    ).stdout.split()
    assert names, "upstream moved src/ between 0.3.35 and 0.3.36"
    path, lineno = changed_line(settings, old, new, names[0])
    wdir = settings.workdir
    text = (wdir / path).read_text(encoding="utf-8").splitlines(keepends=True)
    text[lineno - 1] = "// skippy e2e: a downstream edit of a line upstream changed\n"
    (wdir / path).write_text("".join(text), encoding="utf-8")
    hermetic = {**genv, "GIT_AUTHOR_DATE": "2024-06-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-06-01T00:00:00+0000"}
    proc.run(["git", "-C", str(wdir), "commit", "--quiet", "-am", "core: edit a moving line"], env=hermetic)
    mbox = proc.run(
        ["git", "-C", str(wdir), "format-patch", "--stdout", "--zero-commit", "-1", "HEAD"], env=genv
    ).stdout
    proc.run(["git", "-C", str(wdir), "checkout", "--quiet", "--detach", "HEAD~1"], env=genv)
    (settings.patch_dir / "0001-core-edit-a-moving-line.patch").write_text(mbox, encoding="utf-8")
    prepare(settings, Target.pinned(), console=console, interactive=False)
    report = triage_target(settings, Target.at(new), console=console)
    (verdict,) = report.verdicts
    assert verdict.patch == "core/0001-core-edit-a-moving-line.patch"
    assert verdict.verdict == "conflict"
    assert verdict.paths == (path,)
    assert [b.sha for b in verdict.blamed] == [new[:7]]
    bisect = run_bisect(settings, to=new, console=console)
    assert bisect.newest_compatible == old
    assert [(b.patch, b.commit) for b in bisect.breakers] == [(verdict.patch, new)]


def test_pin_bump_from_0335_to_0336_builds_and_spot_checks(testbed: LlamaTestbed) -> None:
    """The whole path, for real: prepare 0.3.36, CPU build, spot check on Gemma 3, parity, pin written."""
    settings = make_project(testbed, "bump")
    console = Console(env={}, stream=io.StringIO())
    prepare(settings, Target.pinned(), console=console, interactive=False)
    new = testbed.commits["0.3.36"]
    # upstream's tests in a pin move (and a move they refuse) are tests/e2e/test_upstream_tests.py's
    report = pin_bump(settings, sha=new, console=console, upstream_tests=False)
    assert report.written
    assert settings.pin_file.read_text(encoding="utf-8") == new + "\n"
    assert report.summary is not None and len(report.summary.commits) == 1
    # the map by function walked that commit (the queue here is empty: no patch to review)
    assert report.as_dict()["summary"]["churn"]["commits_walked"] == 1
    # the CPU build's greedy answers against the reference, and the reference rewritten for the new pin
    (numerics,) = report.numerics
    assert numerics["model"] == "gemma3-270m" and numerics["written"] is True
    assert (settings.root / numerics["reference"]).is_file()
    assert "Numerics" in report.numerics_markdown()
    binaries = list(settings.build_root.glob("cpu-*/bin/llama-server"))
    assert binaries, "the bump built llama-server"
    assert prepare(settings, Target.pinned(), console=console).action == "noop"
