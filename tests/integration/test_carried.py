"""Patches upstream already carries, on a fixture upstream that took some of the queue.

pin = upstream commit 1; the queue, each patch made on the pin:

* core/0001 edits model line 5; upstream u1 is the same change (a cherry-pick): same patch-id;
* core/0002 edits arch line 10; upstream u2 first changed arch lines 8 and 12, then u3 made the
  same edit: the lines around it differ, so the patch-id does, and only the 3-way test sees it;
* core/0003 edits model lines 20 and 35; upstream u4 took the first hunk only: partly, 1 of 2;
* core/0004 edits model line 30; upstream left that line alone: not listed;
* model_support/0001 edits arch line 16, which upstream u5 changed otherwise: a conflict, not listed;
* generated/0001 adds a file that upstream u6 added verbatim in a larger commit: the patch-ids
  differ, the 3-way test cannot take a new file that exists, the reverse check sees it.

Commits touching the same files come after each one (u7, u8), so the commit named is found on a
line of several, not as the only candidate.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from skippy.core.errors import SettingsError
from skippy.core.git import Repo
from skippy.core.ui import Console
from skippy.maintain.carried import Carried, carried_patches, patch_ids
from skippy.queue.model import load_queue
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)
GENERATED = "// generated: family x\nint x_family = 1;\n"


def edit(text: str, *changes: tuple[str, str]) -> str:
    for line, new in changes:
        assert text.splitlines(keepends=True).count(line) == 1, line
        text = text.replace(line, new)
    return text


@pytest.fixture
def carried(project: Project) -> tuple[Project, dict[str, str]]:
    up = project.upstream
    pin = up.commits[1]
    model = up.read("src/llama-model.cpp", pin)
    arch = up.read("src/llama-arch.cpp", pin)
    queue: dict[tuple[str, str], tuple[str, dict[str, str | None]]] = {
        ("core", "0001-core-verbatim.patch"): (
            "core: verbatim",
            {"src/llama-model.cpp": edit(model, ("// model line 5\n", "// P1 five\n"))},
        ),
        ("core", "0002-core-other-context.patch"): (
            "core: other context",
            {"src/llama-arch.cpp": edit(arch, ("// arch line 10\n", "// P2 ten\n"))},
        ),
        ("core", "0003-core-two-hunks.patch"): (
            "core: two hunks",
            {
                "src/llama-model.cpp": edit(
                    model, ("// model line 20\n", "// P3 twenty\n"), ("// model line 35\n", "// P3 thirty-five\n")
                )
            },
        ),
        ("core", "0004-core-not-taken.patch"): (
            "core: not taken",
            {"src/llama-model.cpp": edit(model, ("// model line 30\n", "// P4 thirty\n"))},
        ),
        ("model_support", "0001-family-conflicts.patch"): (
            "family: conflicts",
            {"src/llama-arch.cpp": edit(arch, ("// arch line 16\n", "// P5 sixteen\n"))},
        ),
        ("generated", "0001-family-x.patch"): ("generated: family x", {"src/generated/x.inc": GENERATED}),
    }
    for (lane, name), (subject, files) in queue.items():
        project.add_patch(lane, name, project.patch(pin, subject, files))

    def change(path: str, *changes: tuple[str, str]) -> dict[str, str | None]:
        return {path: edit(up.read(path), *changes)}

    shas = {"pin": pin}
    shas["u1"] = up.commit(
        "model: line five, from downstream", change("src/llama-model.cpp", ("// model line 5\n", "// P1 five\n"))
    )
    shas["u2"] = up.commit(
        "arch: rework lines 8 and 12",
        change(
            "src/llama-arch.cpp", ("// arch line 8\n", "// upstream 8\n"), ("// arch line 12\n", "// upstream 12\n")
        ),
    )
    shas["u3"] = up.commit("arch: line ten", change("src/llama-arch.cpp", ("// arch line 10\n", "// P2 ten\n")))
    shas["u4"] = up.commit(
        "model: line twenty", change("src/llama-model.cpp", ("// model line 20\n", "// P3 twenty\n"))
    )
    shas["u5"] = up.commit(
        "arch: line sixteen", change("src/llama-arch.cpp", ("// arch line 16\n", "// upstream 16\n"))
    )
    shas["u6"] = up.commit("generated: family x, and its docs", {"src/generated/x.inc": GENERATED, "docs/x.md": "x\n"})
    shas["u7"] = up.commit("arch: line three", change("src/llama-arch.cpp", ("// arch line 3\n", "// upstream 3\n")))
    shas["u8"] = up.commit(
        "model: line thirty-eight", change("src/llama-model.cpp", ("// model line 38\n", "// upstream 38\n"))
    )
    shas["u9"] = up.commit("docs: notes", {"docs/notes.md": "notes\n"})
    prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    return project, shas


def workdir_repo(project: Project) -> Repo:
    return Repo(project.workdir, project.settings().env)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    folder = tmp_path / "carried-scratch"
    folder.mkdir()
    return folder


def test_carried_patches_names_how_and_the_commit(carried: tuple[Project, dict[str, str]], scratch: Path) -> None:
    project, shas = carried
    repo = workdir_repo(project)
    assert repo.has_commit(shas["u9"]), "the workdir holds upstream's history past the pin"
    queue = load_queue(project.patches)
    started = time.monotonic()
    found = carried_patches(repo, queue, shas["pin"], shas["u9"], scratch=scratch)
    seconds = time.monotonic() - started
    print(f"carried_patches on the fixture: {seconds:.2f} s for {len(queue.patches)} patches")
    by_patch = {c.patch: c for c in found}
    assert list(by_patch) == [
        "core/0001-core-verbatim.patch",
        "core/0002-core-other-context.patch",
        "core/0003-core-two-hunks.patch",
        "generated/0001-family-x.patch",
    ]
    assert by_patch["core/0001-core-verbatim.patch"] == Carried(
        "core/0001-core-verbatim.patch",
        project.patches / "0001-core-verbatim.patch",
        "patch-id",
        shas["u1"],
        "model: line five, from downstream",
        1,
        1,
    )
    context = by_patch["core/0002-core-other-context.patch"]
    assert (context.how, context.commit, context.commit_subject) == ("applied", shas["u3"], "arch: line ten")
    assert (context.hunks_carried, context.hunks) == (1, 1)
    partly = by_patch["core/0003-core-two-hunks.patch"]
    assert (partly.how, partly.commit, partly.hunks_carried, partly.hunks) == ("partly", shas["u4"], 1, 2)
    added = by_patch["generated/0001-family-x.patch"]
    assert (added.how, added.commit, added.hunks_carried) == ("applied", shas["u6"], 1)
    # one line each for reports, as JSON too
    assert by_patch["core/0001-core-verbatim.patch"].describe() == (
        f'core/0001-core-verbatim.patch: upstream {shas["u1"][:12]} "model: line five, from downstream" '
        "carries it (same patch-id)"
    )
    assert partly.describe() == (
        f'core/0003-core-two-hunks.patch: upstream {shas["u4"][:12]} "model: line twenty" carries 1 of its 2 hunks'
    )
    assert partly.as_dict()["hunks_carried"] == 1 and partly.as_dict()["how"] == "partly"
    # nothing was checked out, no ref moved, the scratch folder is left as it was given
    env = hermetic_git_env(Path(os.environ["HOME"]))
    assert git(project.workdir, "status", "--porcelain", env=env) == ""
    assert list(scratch.iterdir()) == []


def test_nearer_target_carries_less(carried: tuple[Project, dict[str, str]], scratch: Path) -> None:
    """At u3 only the first two patches are carried; at the pin's own child none is."""
    project, shas = carried
    repo = workdir_repo(project)
    queue = load_queue(project.patches)
    at_u3 = carried_patches(repo, queue, shas["pin"], shas["u3"], scratch=scratch)
    assert [(c.patch, c.how, c.commit) for c in at_u3] == [
        ("core/0001-core-verbatim.patch", "patch-id", shas["u1"]),
        ("core/0002-core-other-context.patch", "applied", shas["u3"]),
    ]
    assert carried_patches(repo, queue, shas["pin"], project.upstream.commits[2], scratch=scratch) == ()


def test_the_queue_own_commits_are_no_upstream_patch_ids(
    carried: tuple[Project, dict[str, str]], scratch: Path
) -> None:
    """Towards the workdir's HEAD (the queue applied on the pin) every patch is in the tree, but by the
    queue's own commits: none is said to be carried by patch-id."""
    project, shas = carried
    repo = workdir_repo(project)
    queue = load_queue(project.patches)
    head = repo.head()
    assert head is not None and head != shas["pin"]
    found = carried_patches(repo, queue, shas["pin"], head, scratch=scratch)
    assert found and all(c.how != "patch-id" for c in found)


def test_refuses_a_target_that_does_not_descend(carried: tuple[Project, dict[str, str]], scratch: Path) -> None:
    project, shas = carried
    repo = workdir_repo(project)
    with pytest.raises(SettingsError, match="does not descend"):
        carried_patches(repo, load_queue(project.patches), shas["u9"], shas["pin"], scratch=scratch)
    with pytest.raises(SettingsError, match="is not a commit"):
        carried_patches(repo, load_queue(project.patches), shas["pin"], "no-such-ref", scratch=scratch)


def test_each_check_answers_a_case_of_its_own(carried: tuple[Project, dict[str, str]], scratch: Path) -> None:
    """Found above: 0002 (other lines around the change) and the generated file added verbatim.
    The reverse check alone misses the first, the 3-way merge alone the second."""
    project, shas = carried
    env = {**hermetic_git_env(Path(os.environ["HOME"])), "GIT_INDEX_FILE": str(scratch / "index")}

    def applies(patch: Path, *args: str) -> bool:
        git(project.workdir, "read-tree", shas["u9"], env=env)
        try:
            git(project.workdir, "apply", "--cached", *args, str(patch), env=env)
        except AssertionError:
            return False
        return True

    other_context = project.patches / "0002-core-other-context.patch"
    assert not applies(other_context, "--reverse", "--check")
    assert applies(other_context, "--3way")
    added = project.patches / "generated" / "0001-family-x.patch"
    assert not applies(added, "--3way")
    assert applies(added, "--reverse", "--check")


def test_patch_ids_in_one_run_match_git_one_by_one(carried: tuple[Project, dict[str, str]]) -> None:
    project, _shas = carried
    queue = load_queue(project.patches)
    env = hermetic_git_env(Path(os.environ["HOME"]))
    one_by_one = tuple(
        git(project.workdir, "patch-id", "--stable", env=env, input=p.data.decode()).split()[0] for p in queue.patches
    )
    assert patch_ids(workdir_repo(project), queue.patches) == one_by_one


def test_a_patch_on_another_is_found_without_its_preimage(project: Project, scratch: Path) -> None:
    """B is made on top of A elsewhere (its preimage blob is not in the upstream repository), and
    upstream took both in one commit: A by the 3-way test, B by the reverse check alone."""
    up = project.upstream
    pin = up.commits[1]
    model = up.read("src/llama-model.cpp", pin)
    with_a = edit(model, ("// model line 10\n", "// A ten\n"))
    project.add_patch("core", "0001-a.patch", project.patch(pin, "core: a", {"src/llama-model.cpp": with_a}))
    env = hermetic_git_env(Path(os.environ["HOME"]))
    a_commit = git(project.scratch, "rev-parse", "HEAD", env=env).strip()
    with_b = edit(with_a, ("// model line 12\n", "// B twelve\n"))
    b_patch = project.add_patch(
        "core", "0002-b.patch", project.patch(a_commit, "core: b", {"src/llama-model.cpp": with_b})
    )
    taken = up.commit("model: lines ten and twelve", {"src/llama-model.cpp": with_b, "docs/ab.md": "a, b\n"})
    preimage = next(
        line.split()[1].split("..")[0] for line in b_patch.read_text().splitlines() if line.startswith("index ")
    )
    with pytest.raises(AssertionError):
        git(up.path, "cat-file", "-e", preimage, env=env)
    found = carried_patches(
        Repo(up.path, project.settings().env), load_queue(project.patches), pin, taken, scratch=scratch
    )
    assert [(c.patch, c.how, c.commit) for c in found] == [
        ("core/0001-a.patch", "applied", taken),
        ("core/0002-b.patch", "applied", taken),
    ]
