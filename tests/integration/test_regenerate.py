"""`invoke regenerate` against fixture upstreams: byte-identical round trips, verification that
restores the backup exactly, and the range-diff classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skippy.cli.entries import regenerate_main
from skippy.core.errors import QueueError
from skippy.core.ui import Console
from skippy.maintain.regenerate import regenerate
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git
from tests.integration.test_parity_fixtures import arch_upstream, commit_files, edit, git_env, snapshot

pytestmark = pytest.mark.integration

QUIET = Console(quiet=True)


def run(repo: Path, *args: str) -> str:
    return git(repo, *args, env=git_env()).strip()


def branch_from(repo: Path, name: str, start: str) -> None:
    run(repo, "checkout", "--quiet", "--force", "-B", name, start)


def lanes_v1(project: Project) -> tuple[str, str]:
    """core: A (line 5), B (rope), C (new file), D (readme); models: M. Branches `core` and `models`."""
    wdir = project.workdir
    prepare(project.settings(), Target.pinned(), console=QUIET)
    pin = run(wdir, "rev-parse", "HEAD")
    branch_from(wdir, "core", pin)
    m = "src/llama-model.cpp"
    commit_files(
        wdir,
        "core: add a hook point",
        {m: edit(wdir, m, "    return res;\n", "    hook(res);\n    return res;\n")},
        date="2024-06-01T10:00:00+0000",
    )
    commit_files(
        wdir,
        "core: gemma rope",
        {m: edit(wdir, m, "        case LLM_ARCH_GEMMA3:\n", "        case LLM_ARCH_GEMMA3: // gemma\n")},
        date="2024-06-02T10:00:00+0000",
    )
    commit_files(
        wdir, "core: provenance header", {"src/provenance.h": "#define SKIPPY 1\n"}, date="2024-06-03T10:00:00+0000"
    )
    commit_files(
        wdir, "core: readme note", {"README.md": "# llama.cpp fixture\n\ndownstream\n"}, date="2024-06-04T10:00:00+0000"
    )
    branch_from(wdir, "models", "core")
    commit_files(
        wdir, "gemma3: runtime adaptation", {"src/gemma3-extra.cpp": "// gemma3\n"}, date="2024-06-05T10:00:00+0000"
    )
    return run(wdir, "rev-parse", "core"), run(wdir, "rev-parse", "models")


def test_round_trip_is_byte_identical(project: Project) -> None:
    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    first = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    patches = settings.patch_dir
    assert sorted(p.name for p in patches.glob("*.patch")) == [
        "0001-core-add-a-hook-point.patch",
        "0002-core-gemma-rope.patch",
        "0003-core-provenance-header.patch",
        "0004-core-readme-note.patch",
    ]
    assert (patches / "model_support" / "series").read_text() == "0001-gemma3-runtime-adaptation.patch\n"
    assert [e.status for e in first.entries] == ["new"] * 5
    data = (patches / "0001-core-add-a-hook-point.patch").read_bytes()
    assert data.startswith(b"From 0000000000000000000000000000000000000000 ")
    assert b"Subject: [PATCH] core: add a hook point" in data
    assert b"\n-- \n" not in data  # no signature
    assert first.backup.is_dir()
    exported = snapshot(patches)

    # the same branches again, with hostile output-shaping config in the checkout: the same bytes
    wdir = project.workdir
    for key, value in (
        ("format.signOff", "true"),
        ("format.headers", "X-Hostile: yes"),
        ("format.to", "list@example.invalid"),
        ("format.numbered", "true"),
        ("format.signature", "hostile"),
        ("diff.noprefix", "true"),
        ("diff.context", "7"),
        ("diff.algorithm", "patience"),
        ("core.abbrev", "7"),
    ):
        run(wdir, "config", key, value)
    second = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert snapshot(patches) == exported
    assert {e.status for e in second.entries} == {"unchanged"}

    # prepare the new queue, then regenerate from the patched checkout itself
    run(wdir, "checkout", "--quiet", "--detach", first.patched_sha)
    run(wdir, "branch", "-D", "core", "models")
    report = prepare(settings, Target.pinned(), console=QUIET, force=True)
    assert report.patched_sha == first.patched_sha
    run(wdir, "branch", "core2", "HEAD~1")
    third = regenerate(settings, core_head="core2", model_support_head="HEAD", console=QUIET)
    assert snapshot(patches) == exported
    assert {e.status for e in third.entries} == {"unchanged"}
    assert third.patched_sha == first.patched_sha


def test_tree_mismatch_restores_the_backup_exactly(project: Project) -> None:
    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    (settings.patch_dir / "parity-allowlist.toml").write_text("# nothing dropped\n", encoding="utf-8")
    before = snapshot(settings.patch_dir)
    wdir = project.workdir
    # CR line endings do not survive format-patch + git am: the replayed tree differs
    branch_from(wdir, "models", "models")
    commit_files(
        wdir, "windows: a batch file", {"tools/run.bat": "@echo off\r\nrem crlf\r\n"}, date="2024-06-06T10:00:00+0000"
    )
    with pytest.raises(QueueError) as info:
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    error = info.value
    assert "do not give the tree" in error.what
    assert "tools/run.bat" in (error.details or "")
    assert "restored byte for byte" in (error.untouched or "")
    assert snapshot(settings.patch_dir) == before


def test_old_backups_are_pruned_after_a_success_but_kept_after_a_failure(project: Project) -> None:
    from skippy.maintain.regenerate import KEEP_BACKUPS

    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    backups = settings.cache_dir / "backups"
    seeded = [backups / f"patches-20200101T0000{i:02d}Z-aaaaaa" for i in range(KEEP_BACKUPS + 2)]
    for folder in seeded:
        folder.mkdir(parents=True)
        (folder / "0001-old.patch").write_bytes(b"old\n")
    report = regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    left = sorted(backups.iterdir())
    assert len(left) == KEEP_BACKUPS
    assert report.backup in left
    assert left[:-1] == seeded[-(KEEP_BACKUPS - 1) :]  # the oldest went first

    branch_from(project.workdir, "models", "models")
    commit_files(project.workdir, "crlf", {"tools/run.bat": "@echo off\r\n"}, date="2024-06-06T10:00:00+0000")
    with pytest.raises(QueueError):
        regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    assert len(list(backups.iterdir())) == KEEP_BACKUPS + 1  # a failed run prunes nothing


def test_refuses_branches_not_on_the_pin_and_merges(project: Project) -> None:
    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    wdir = project.workdir
    upstream_first = project.upstream.commits[0]
    branch_from(wdir, "elsewhere", upstream_first)
    commit_files(wdir, "off the pin", {"x.txt": "x\n"}, date="2024-06-07T10:00:00+0000")
    before = snapshot(settings.patch_dir)
    with pytest.raises(QueueError, match="does not descend"):
        regenerate(settings, core_head="elsewhere", model_support_head="elsewhere", console=QUIET)
    branch_from(wdir, "merged", "models")
    run(wdir, "merge", "--quiet", "--no-ff", "-m", "merge", "core~1")
    side = run(wdir, "rev-parse", "HEAD")
    branch_from(wdir, "side", "core")
    commit_files(wdir, "side work", {"side.txt": "s\n"}, date="2024-06-08T10:00:00+0000")
    branch_from(wdir, "merged2", "models")
    run(wdir, "merge", "--quiet", "--no-ff", "-m", "merge side", "side")
    with pytest.raises(QueueError, match="merge commit"):
        regenerate(settings, core_head="core", model_support_head="merged2", console=QUIET)
    assert side
    assert snapshot(settings.patch_dir) == before


def test_range_diff_classes(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    regenerate(settings, core_head="core", model_support_head="models", console=QUIET)
    wdir = project.workdir
    m = "src/llama-model.cpp"
    pin = project.upstream.commits[-1]
    # v2: a new patch first (moves line numbers), the hook as before (context only), the gemma
    # edit changed, provenance unchanged, the readme note dropped; the models lane as before
    branch_from(wdir, "core-v2", pin)
    commit_files(
        wdir,
        "core: a banner",
        {m: edit(wdir, m, '#include "llama-model.h"\n', '#include "llama-model.h"\n// banner\n')},
        date="2024-06-09T10:00:00+0000",
    )
    commit_files(
        wdir,
        "core: add a hook point",
        {m: edit(wdir, m, "    return res;\n", "    hook(res);\n    return res;\n")},
        date="2024-06-01T10:00:00+0000",
    )
    commit_files(
        wdir,
        "core: gemma rope",
        {m: edit(wdir, m, "        case LLM_ARCH_GEMMA3:\n", "        case LLM_ARCH_GEMMA3: // gemma 3\n")},
        date="2024-06-02T10:00:00+0000",
    )
    commit_files(
        wdir, "core: provenance header", {"src/provenance.h": "#define SKIPPY 1\n"}, date="2024-06-03T10:00:00+0000"
    )
    branch_from(wdir, "models-v2", "core-v2")
    commit_files(
        wdir, "gemma3: runtime adaptation", {"src/gemma3-extra.cpp": "// gemma3\n"}, date="2024-06-05T10:00:00+0000"
    )
    code = regenerate_main(
        project.env, root=project.root, core_head="core-v2", model_support_head="models-v2", json=True
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    got = {(e["subject"], e["status"]) for e in data["range_diff"]}
    assert got == {
        ("core: a banner", "new"),
        ("core: add a hook point", "context"),
        ("core: gemma rope", "changed"),
        ("core: provenance header", "unchanged"),
        ("core: readme note", "dropped"),
        ("gemma3: runtime adaptation", "unchanged"),
    }
    assert data["range_diff_counts"] == {"unchanged": 2, "context": 1, "changed": 1, "new": 1, "dropped": 1}
    changed = next(e for e in data["range_diff"] if e["status"] == "changed")
    assert changed["detail"] == "diff changed"
    assert not (settings.patch_dir / "0004-core-readme-note.patch").exists()
