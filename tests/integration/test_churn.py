"""The pin move reviewed by function (`invoke summary`, pin-bump's report) on a fixture upstream.

The pin holds a loader with three functions.  The queue edits ``load_tensors`` and
``check_magic``.  Upstream then: reorders two statements inside ``load_tensors``,
edits ``print_info`` (no patch touches it), renames ``check_magic`` to
``verify_magic``, and finally edits the renamed function (followed through the rename).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.cli.entries import summary_main
from skippy.core.git import Repo
from skippy.core.ui import Console
from skippy.flows.pinbump.sides import run_summary
from skippy.maintain import churn
from skippy.queue.model import load_queue
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)

LOADER = """\
#include "llama-loader.h"

// the loader
bool llama_loader::check_magic(const char * head) {
    if (head == nullptr) {
        return false;
    }
    return head[0] == 'G' && head[1] == 'G';
}

void llama_loader::load_tensors(int n) {
    open_file();
    validate(n);
    for (int i = 0; i < n; ++i) {
        read_tensor(i);
    }
    close_file();
}

static void print_info(int n) {
    printf("tensors: %d\\n", n);
}
"""


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.fixture
def moved(project: Project) -> tuple[Project, dict[str, str]]:
    up = project.upstream
    shas = {"pin": up.commit("loader: add", {"src/llama-loader.cpp": LOADER})}
    project.pin(shas["pin"])
    patched = edit(LOADER, "    validate(n);\n", "    validate(n);\n    skippy_trace(n);\n")
    patched = edit(patched, "        return false;\n", '        skippy_log("no head");\n        return false;\n')
    project.add_patch(
        "core",
        "0001-core-trace-the-loader.patch",
        project.patch(shas["pin"], "core: trace the loader", {"src/llama-loader.cpp": patched}),
    )
    other = edit(LOADER, "    close_file();\n", "    close_file();\n    done();\n")
    project.add_patch(
        "model_support",
        "0001-family-x-done.patch",
        project.patch(shas["pin"], "family x: done", {"src/llama-loader.cpp": other}),
    )
    text = LOADER
    text = edit(text, "    open_file();\n    validate(n);\n", "    validate(n);\n    open_file();\n")
    shas["reorder"] = up.commit("loader: validate before opening", {"src/llama-loader.cpp": text})
    text = edit(text, 'printf("tensors: %d\\n", n);', 'printf("tensors: %d (loaded)\\n", n);')
    shas["unrelated"] = up.commit("loader: say loaded", {"src/llama-loader.cpp": text})
    text = edit(text, "llama_loader::check_magic(", "llama_loader::verify_magic(")
    shas["rename"] = up.commit("loader: rename check_magic", {"src/llama-loader.cpp": text})
    text = edit(text, "head[1] == 'G';", "head[1] == 'G' && head[2] == 'U';")
    shas["after"] = up.commit("loader: check a third byte", {"src/llama-loader.cpp": text})
    shas["docs"] = up.commit("docs: loader", {"docs/loader.md": "the loader\n"})
    prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    return project, shas


def test_the_map_names_what_upstream_did_to_the_functions_the_patches_change(
    moved: tuple[Project, dict[str, str]],
) -> None:
    project, shas = moved
    summary = run_summary(project.settings(), shas["pin"], shas["docs"], console=QUIET)
    assert summary.churn is not None
    by_patch = {p.patch: p for p in summary.churn.patches}
    trace = by_patch["core/0001-core-trace-the-loader.patch"]
    assert [(e.file, e.name, e.patch_did) for e in trace.entities] == [
        ("src/llama-loader.cpp", "llama_loader::check_magic", "body edited"),
        ("src/llama-loader.cpp", "llama_loader::load_tensors", "body edited"),
    ]
    touched = {e.name: [(t.sha, t.did) for t in e.commits] for e in trace.entities}
    assert touched == {
        "llama_loader::load_tensors": [(shas["reorder"], ("statements reordered",))],
        "llama_loader::check_magic": [
            (shas["rename"], ("renamed to llama_loader::verify_magic",)),
            (shas["after"], ("body edited",)),
        ],
    }
    # the unrelated edit (print_info) and the docs commit are named nowhere
    named = {t.sha for p in summary.churn.patches for e in p.entities for t in e.commits}
    assert named == {shas["reorder"], shas["rename"], shas["after"]}
    # ranked by exposure: the patch with the renamed and reordered functions first
    assert [p.patch for p in summary.churn.review] == [
        "core/0001-core-trace-the-loader.patch",
        "model_support/0001-family-x-done.patch",
    ]
    assert trace.exposure == 2 + 2 + 1
    markdown = summary.markdown()
    assert "### Review these" in markdown
    assert f"`{shas['reorder'][:12]}` loader: validate before opening: statements reordered" in markdown
    data = summary.as_dict()["churn"]
    assert data["review"][0] == "core/0001-core-trace-the-loader.patch"
    functions = {p["patch"]: [f["name"] for f in p["functions"]] for p in data["patches"]}
    assert functions["model_support/0001-family-x-done.patch"] == ["llama_loader::load_tensors"]


def test_a_move_between_files_and_a_deletion(project: Project, tmp_path: Path) -> None:
    up = project.upstream
    pin = up.commit("a: add", {"src/a.cpp": "int f(int x) {\n    return x + 1;\n}\n\nint g() {\n    return 2;\n}\n"})
    project.pin(pin)
    project.add_patch(
        "core",
        "0001-core-f-and-g.patch",
        project.patch(
            pin,
            "core: f and g",
            {"src/a.cpp": "int f(int x) {\n    return x + 2;\n}\n\nint g() {\n    return 3;\n}\n"},
        ),
    )
    moved = up.commit(
        "split: f to b.cpp",
        {"src/a.cpp": "int g() {\n    return 2;\n}\n", "src/b.cpp": "int f(int x) {\n    return x + 1;\n}\n"},
    )
    edited = up.commit("b: f takes a long", {"src/b.cpp": "long f(long x) {\n    return x + 1;\n}\n"})
    deleted = up.commit("a: drop g", {"src/a.cpp": "// nothing\n"})
    prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    settings = project.settings()
    repo = Repo(settings.workdir, settings.env)
    scratch = tmp_path / "scratch-churn"
    scratch.mkdir()
    found = churn.churn_map(repo, load_queue(settings.patch_dir), pin, deleted, scratch=scratch)
    (patch,) = found.patches
    assert {e.name: [(t.sha, t.did) for t in e.commits] for e in patch.entities} == {
        "f": [(moved, ("moved to src/b.cpp",)), (edited, ("signature changed",))],
        "g": [(deleted, ("deleted",))],
    }


def test_in_github_actions_the_exposed_patch_is_annotated_on_its_hunk(
    moved: tuple[Project, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    project, shas = moved
    env = {**project.env, "GITHUB_ACTIONS": "true"}
    assert summary_main(env, root=project.root, old=shas["pin"], new=shas["docs"]) == 0
    err = capsys.readouterr().err
    annotations = [line for line in err.splitlines() if line.startswith("::warning file=")]
    # both patches reach HIGH_EXPOSURE (5, and 2: one silent reorder), the most exposed first
    assert [a.split(",", 1)[0] for a in annotations] == [
        "::warning file=queue/patches/0001-core-trace-the-loader.patch",
        "::warning file=queue/patches/model_support/0001-family-x-done.patch",
    ]
    line = annotations[0]
    number = int(line.split("line=", 1)[1].split(",", 1)[0])
    patch = (project.patches / "0001-core-trace-the-loader.patch").read_text(encoding="utf-8").splitlines()
    assert patch[number - 1].startswith("@@ "), "on a hunk header of the patch"
    assert "llama_loader::check_magic: " + shas["rename"][:12] in line
    # outside GitHub Actions, no workflow command is printed
    assert summary_main(project.env, root=project.root, old=shas["pin"], new=shas["docs"]) == 0
    assert "::warning" not in capsys.readouterr().err
