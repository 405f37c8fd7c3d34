"""The parity audit and `invoke check` on the real pinned llama.cpp tree (llama-cpp-python 0.3.35).

The test project's upstream is the test-bed's bare repository; the pin is its 0.3.35 commit
(the tree of upstream 4df29be4).  The expected figures are counted here independently of the
scanner, with line-based regular expressions over the same files.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from skippy.cli.entries import check_main, parity_main
from skippy.maintain.parity import DEFAULT_FILES, glob_match
from tests.gitfixtures import git, hermetic_git_env, pyproject
from tooling.testbed import LlamaTestbed

VERSION = "0.3.35"


def env_of(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home)}


@pytest.fixture
def real_project(tmp_path: Path, testbed: LlamaTestbed) -> Path:
    root = tmp_path / "project"
    (root / "queue" / "patches").mkdir(parents=True)
    (root / "pyproject.toml").write_text(pyproject(testbed.url), encoding="utf-8")
    (root / "queue" / "upstream.txt").write_text(testbed.commits[VERSION] + "\n", encoding="utf-8")
    return root


def grep_counts(testbed: LlamaTestbed, home: Path) -> tuple[int, int, int]:
    """(arch switches, arch cases, LLM_ARCH_NAMES entries), counted line by line."""
    env = hermetic_git_env(home)
    commit = testbed.commits[VERSION]
    files = git(testbed.path, "ls-tree", "-r", "--name-only", commit, env=env).split()
    switches = cases = 0
    for path in files:
        if not any(glob_match(path, pattern) for pattern in DEFAULT_FILES):
            continue
        text = git(testbed.path, "show", f"{commit}:{path}", env=env)
        switches += len(re.findall(r"^\s*switch\s*\(\s*[\w.>-]*arch\s*\)\s*\{", text, flags=re.M))
        cases += len(re.findall(r"\bcase\s+LLM_ARCH_\w+\s*:", text))
    arch = git(testbed.path, "show", f"{commit}:src/llama-arch.cpp", env=env)
    table = arch.split("LLM_ARCH_NAMES = {", 1)[1].split("};", 1)[0]
    entries = len(re.findall(r"^\s*\{\s*LLM_ARCH_\w+\s*,", table, flags=re.M))
    return switches, cases, entries


def test_parity_reports_the_true_counts_of_the_pinned_tree(
    real_project: Path, testbed: LlamaTestbed, hermetic_seal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    switches, cases, entries = grep_counts(testbed, hermetic_seal)
    assert switches >= 10 and cases >= 300 and entries >= 100  # the tree is the real one
    started = time.monotonic()
    code = parity_main(env_of(hermetic_seal), root=real_project, json=True)
    seconds = time.monotonic() - started
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["upstream"]["switches"] == switches
    assert data["upstream"]["cases"] == cases
    assert data["upstream"]["entries"] == entries
    per_file = data["upstream"]["per_file"]
    assert per_file["src/llama-model.cpp"]["switches"] == 5
    assert data["patched"]["cases"] == cases
    print(f"\nparity on the pinned tree: {switches} switches, {cases} cases, {entries} name entries, {seconds:.1f} s")


def make_real_patch(testbed: LlamaTestbed, scratch: Path, home: Path) -> bytes:
    """A core patch on the real tree that drops LLM_ARCH_MPT from llama_model_rope_type."""
    env = hermetic_git_env(home)
    git(scratch.parent, "clone", "--quiet", "--no-checkout", testbed.url, str(scratch), env=env)
    git(scratch, "checkout", "--quiet", "--detach", testbed.commits[VERSION], env=env)
    path = scratch / "src" / "llama-model.cpp"
    text = path.read_text(encoding="utf-8")
    head, sep, tail = text.partition("llama_rope_type llama_model_rope_type(")
    assert sep and "        case LLM_ARCH_MPT:\n" in tail
    path.write_text(head + sep + tail.replace("        case LLM_ARCH_MPT:\n", "", 1), encoding="utf-8")
    git(scratch, "commit", "--quiet", "-am", "core: rope types without MPT", env=env)
    return git(scratch, "format-patch", "--stdout", "--zero-commit", "--no-signature", "-1", "HEAD", env=env).encode()


def test_check_runs_end_to_end_on_the_pinned_tree(
    real_project: Path, testbed: LlamaTestbed, hermetic_seal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = env_of(hermetic_seal)
    patch = make_real_patch(testbed, tmp_path / "scratch", hermetic_seal)
    (real_project / "queue" / "patches" / "0001-core-rope-types-without-mpt.patch").write_bytes(patch)

    started = time.monotonic()
    code = check_main(env, root=real_project, json=True)
    failing = time.monotonic() - started
    assert code != 0
    data = json.loads(capsys.readouterr().out)
    steps = {s["name"]: s for s in data["check"]["steps"]}
    assert steps["apply"]["status"] == "ok"
    assert steps["parity"]["status"] == "failed"
    dropped = steps["parity"]["data"]["dropped"]
    assert [(d["function"], d["case"], d["patch"]) for d in dropped] == [
        ("llama_model_rope_type", "LLM_ARCH_MPT", "core/0001-core-rope-types-without-mpt.patch")
    ]
    deletions = steps["parity"]["data"]["deletions"]
    assert [(d["file"], d["upstream_lines"]) for d in deletions] == [("src/llama-model.cpp", 1)]

    (real_project / "queue" / "patches" / "parity-allowlist.toml").write_text(
        '[[dropped]]\nfile = "src/llama-model.cpp"\nfunction = "llama_model_rope_type"\n'
        'case = "LLM_ARCH_MPT"\nreason = "e2e: dropped on purpose"\n',
        encoding="utf-8",
    )
    started = time.monotonic()
    code = check_main(env, root=real_project, json=True)
    passing = time.monotonic() - started
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data
    assert {s["name"]: s["status"] for s in data["steps"]} == {
        "queue": "ok",
        "apply": "ok",
        "parity": "ok",
        "generated": "ok",
        "boundaries": "ok",
    }
    print(f"\ncheck on the pinned tree: failing run {failing:.1f} s, passing run {passing:.1f} s")
