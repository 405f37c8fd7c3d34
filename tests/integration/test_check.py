"""`invoke check` on fixture upstreams: every step, on temporary checkouts only."""

from __future__ import annotations

import json

import pytest

from skippy.cli.entries import check_main
from skippy.core.errors import CheckFailed
from skippy.core.ui import Console
from skippy.maintain import generate
from skippy.maintain.review import run_check
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git
from tests.integration.test_generate import write_spec
from tests.integration.test_parity import DROP_TWO
from tests.integration.test_parity_fixtures import (
    ADD_HOOK_STEP,
    arch_upstream,
    chain_patches,
    git_env,
    queue_core,
    snapshot,
)

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)
FIXUP = ("core: fix the hook", {"src/llama-model.cpp": ("    trace(res);\n", "    trace(res, 1);\n")})


def statuses(project: Project) -> dict[str, str]:
    report = run_check(project.settings(), console=QUIET)
    return {s.name: s.status for s in report.steps}


def test_a_good_queue_passes_every_step(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    base = arch_upstream(project)
    queue_core(project, chain_patches(project, base, [ADD_HOOK_STEP]), ["core-add-a-hook-point"])
    write_spec(project)
    generate.run_generate(project.settings(), console=QUIET)
    assert statuses(project) == {
        "queue": "ok",
        "apply": "ok",
        "parity": "ok",
        "generated": "ok",
        "boundaries": "ok",
    }
    assert check_main(project.env, root=project.root, json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    parity = next(s for s in data["steps"] if s["name"] == "parity")
    assert parity["data"]["upstream"]["switches"] == 5


def test_problems_are_reported_and_the_workdir_is_untouched(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    base = arch_upstream(project)
    patches = chain_patches(project, base, [ADD_HOOK_STEP, DROP_TWO, FIXUP])
    queue_core(project, patches, ["core-add-a-hook-point", "core-simplify-rope-types", "core-fix-the-hook"])
    write_spec(project)
    settings = project.settings()
    generate.run_generate(settings, console=QUIET)
    prepare(settings, Target.pinned(), console=QUIET)
    # the maintainer's checkout: some local edits that check must not see or touch
    wdir = project.workdir
    (wdir / "README.md").write_text("local edit\n", encoding="utf-8")
    head = git(wdir, "rev-parse", "HEAD", env=git_env()).strip()
    before = snapshot(wdir / "src")
    # the generated lane drifts once the spec changes
    write_spec(project, 'schema = 2\n[[family]]\nname = "llama"\narch = "LLM_ARCH_LLAMA"\n')

    got = statuses(project)
    assert got == {
        "queue": "ok",
        "apply": "ok",
        "parity": "failed",
        "generated": "failed",
        "boundaries": "warning",
    }
    assert check_main(project.env, root=project.root, json=True) == CheckFailed.exit_code
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    steps = {s["name"]: s for s in data["check"]["steps"]}
    assert {d["case"] for d in steps["parity"]["data"]["dropped"]} == {"LLM_ARCH_MPT", "LLM_ARCH_BLOOM"}
    assert steps["generated"]["data"]["drifted_families"] == []
    assert steps["generated"]["data"]["extra_patches"] == ["0002-family-gemma3.patch"]
    assert steps["boundaries"]["data"]["warnings"][0]["patch"] == "core/0003-core-fix-the-hook.patch"
    # the workdir: same HEAD, same files, the local edit still there
    assert git(wdir, "rev-parse", "HEAD", env=git_env()).strip() == head
    assert snapshot(wdir / "src") == before
    assert (wdir / "README.md").read_text() == "local edit\n"
    aside = wdir / ".git" / "skippy" / "aside"
    assert not aside.exists() or not any(aside.iterdir())
    assert git(wdir, "worktree", "list", "--porcelain", env=git_env()).count("worktree ") == 1


def test_an_invalid_queue_skips_the_rest(project: Project) -> None:
    arch_upstream(project)
    (project.patches / "bad.patch").write_text("not a patch\n", encoding="utf-8")
    got = statuses(project)
    assert got["queue"] == "failed"
    assert {got[n] for n in ("apply", "parity", "generated", "boundaries")} == {"skipped"}


def test_a_conflicting_queue_fails_apply(project: Project) -> None:
    base = project.upstream.commits[0]
    arch_upstream(project)
    bad = project.patch(base, "core: against an old tree", {"src/llama-model.cpp": "// model line 1\nchanged\n"})
    project.add_patch("core", "0001-core-against-an-old-tree.patch", bad)
    got = statuses(project)
    assert got["apply"] == "failed"
    assert got["parity"] == "skipped"
