"""The spot check follows the change, on the real pinned tree, each step the README's own command.

A copy of this project (pyproject, tasks, noxfile and queue under ``.deps/e2e/follow``, the pin from
its source archive; its workdir and build dir kept between runs, so a run rebuilds the one file it
changes):

1. ``invoke prepare --offline --force`` puts the queue's tree back (a previous run's commit is saved
   under a backup ref), and the copy's record is removed: ``nox -s build-cpu`` has no baseline but
   the pin, so it checks, besides the default model, every family the queue touches (the generated
   lane's gemma3, llama and qwen2 each with its tiny model; llama-embed, which builds its graph with
   llama's builder, shows as not run, with no tiny model), and records what it certified;
2. a change to ``src/models/qwen2.cpp`` committed in the workdir, ``invoke regenerate``: the next
   ``nox -s build-cpu`` measures from the certified tree and checks ``tiny:qwen2`` on its own (not
   ``tiny:llama`` or ``tiny:gemma3``), its ending and its ``--json`` report saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from skippy.core.settings import Settings
from skippy.flows import follow
from skippy.spot.models import DEFAULT_MODEL
from tests.e2e.copies import copy_project

ROOT = Path(__file__).resolve().parents[2]
COPY = ROOT / ".deps" / "e2e" / "follow"
QWEN2 = "src/models/qwen2.cpp"
BUILDER = "llama_model_qwen2::graph::graph(const llama_model & model, const llm_graph_params & params)"
EDIT = "    GGML_UNUSED(model); // skippy e2e: the spot check follows this change\n"


def user_env() -> dict[str, str]:
    """The maintainer's shell: not CI, a git identity of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_", "NOX_"))}
    env.pop("CI", None)
    env.pop("GITHUB_ACTIONS", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", os.defpath)
    env.update(
        {
            "GIT_AUTHOR_NAME": "Follow Maintainer",
            "GIT_AUTHOR_EMAIL": "follow@example.invalid",
            "GIT_COMMITTER_NAME": "Follow Maintainer",
            "GIT_COMMITTER_EMAIL": "follow@example.invalid",
            "GIT_CONFIG_NOSYSTEM": "1",
        }
    )
    return env


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", *argv], cwd=COPY, env=user_env(), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result


def make_project() -> Settings:
    """The project copy, its queue the project's own (a previous run's regenerated queue replaced)."""
    return Settings.load(copy_project(COPY), user_env())


def build(label: str, figures: dict[str, float]) -> tuple[dict[str, Any], str]:
    """``nox -s build-cpu -- --json``: its report and its human output; its wall time in ``figures``."""
    started = time.monotonic()
    done = run("nox", "-s", "build-cpu", "--", "--json")
    figures[label] = round(time.monotonic() - started, 1)
    report = json.loads(done.stdout)
    assert report["ok"] is True, report
    return report, done.stderr


def checked(report: dict[str, Any]) -> list[str]:
    return [r["model"] for r in report["spot_check"]["results"]]


def timings(report: dict[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """model -> (load s, first token s, completion s, RPC run s) of the spot check."""
    return {
        r["model"]: (
            r["load_seconds"],
            r["first_token_seconds"],
            r["completion_seconds"],
            r["compute"]["rpc"]["seconds"],
        )
        for r in report["spot_check"]["results"]
    }


@pytest.mark.timeout(3600)
def test_a_change_to_qwen2_spot_checks_tiny_qwen2(pinned_sdist: Path, default_model: Path) -> None:
    settings = make_project()
    workdir = settings.workdir
    figures: dict[str, float] = {}
    run("invoke", "prepare", "--offline", "--force")
    follow.record_path(settings, workdir, "cpu").unlink(missing_ok=True)

    # --- 1. no record: the pin is the baseline, every family the queue touches is checked
    first, said = build("first build (pin baseline)", figures)
    following = first["follow"]
    assert following["baseline"]["kind"] == "pin", following
    models = {f["family"]: f["model"] for f in following["families"]}
    assert {"gemma3": "tiny:gemma3", "llama": "tiny:llama", "qwen2": "tiny:qwen2"}.items() <= models.items(), models
    assert models.get("llama-embed", "") is None, models
    assert checked(first) == [DEFAULT_MODEL, "tiny:gemma3", "tiny:llama", "tiny:qwen2"]
    proofs = {p["name"]: p for p in first["proofs"]}
    assert proofs["family llama-embed"]["verdict"] == "not run"
    assert proofs["family llama-embed"]["detail"].startswith("no tiny model for llama-embed (src/models/llama.cpp: ")
    assert "not run: no tiny model for llama-embed" in said
    record = follow.read_record(follow.record_path(settings, workdir, "cpu"))
    assert record is not None and record.models == tuple(checked(first))
    certified = record.patched_sha

    # --- 2. the change loop: a commit in the workdir, written back with regenerate
    path = workdir / QWEN2
    text = path.read_text(encoding="utf-8")
    head, builder, tail = text.partition(BUILDER)
    assert builder, f"no {BUILDER} in {QWEN2}"
    opening, newline, body = tail.partition("{\n")
    path.write_text(head + builder + opening + newline + EDIT + body, encoding="utf-8")
    subprocess.run(
        ["git", "-C", str(workdir), "commit", "--quiet", "-am", "qwen2: a change the spot check follows"],
        env=user_env(),
        check=True,
    )
    run("invoke", "regenerate")
    second, said = build("build after the qwen2 change", figures)
    following = second["follow"]
    assert following["baseline"] == {
        "commit": certified,
        "kind": "certified",
        "said": following["baseline"]["said"],
    }
    assert following["baseline"]["said"].startswith("the last cpu build whose spot check passed")
    assert [(f["family"], f["model"]) for f in following["families"]] == [("qwen2", "tiny:qwen2")]
    assert following["families"][0]["reasons"] == ["src/models/qwen2.cpp: llama_model_qwen2::graph::graph changed"]
    assert checked(second) == [DEFAULT_MODEL, "tiny:qwen2"], "tiny:qwen2 on its own, not tiny:llama or tiny:gemma3"
    proofs = {p["name"]: p for p in second["proofs"]}
    assert proofs["family qwen2"]["verdict"] == "pass"
    assert proofs[follow.FOLLOWED]["detail"].startswith("qwen2, since the last cpu build whose spot check passed")
    assert "family gemma3" not in proofs and "family llama" not in proofs
    assert "✓ family qwen2" in said
    # what really compiled: the compiler cache's misses (qwen2.cpp and the commit strings' units)
    assert second["build"]["cache"]["misses"] <= 4, second["build"]
    misses = second["build"]["cache"]["misses"]
    print(f"follow e2e: {figures}, {misses} compile(s); spot-check timings: {timings(first)}; {timings(second)}")
