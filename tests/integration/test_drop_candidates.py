"""Patches upstream already carries, named by pin-bump and bisect before any conflict.

The queue on the pin: ``verbatim`` (upstream later cherry-picks it: the same patch-id),
``context`` (upstream merges the same change with other lines around it), and ``own``
(upstream never takes it).  pin-bump stops on the first two, naming the upstream commit,
``--drop`` and ``--keep``; ``--drop`` takes them out (and puts them back when the bump
fails or is a dry run); ``--keep`` goes on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.entries import bisect_main, pin_bump_main
from skippy.core.errors import CarriedUpstream, SettingsError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump.bisect import run_bisect
from skippy.flows.pinbump.bump import Collaborators, pin_bump
from skippy.maintain.carried import Carried
from skippy.queue.prepare import PrepareReport, Target, prepare
from tests.conftest import Project

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)

HOOKS = "".join(f"// hooks line {n}\n" for n in range(1, 31))


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


class Recorder:
    """The build and parity boundaries of a bump (real builds are the e2e tier's)."""

    def __init__(self) -> None:
        self.builds: list[str] = []

    def build(
        self, backend: str, settings: Settings, console: Console, prepare_fn: Any, *, upstream_tests: bool
    ) -> object:
        report: PrepareReport = prepare_fn(settings, console)
        self.builds.append(report.upstream_sha)
        return report

    def parity(self, settings: Settings, console: Console, repo: Any, base: str, upstream_sha: str) -> dict[str, Any]:
        return {"ok": True}


@pytest.fixture
def carried(project: Project) -> tuple[Project, dict[str, str]]:
    up = project.upstream
    shas = {"pin": up.commit("hooks: add", {"src/hooks.cpp": HOOKS, "src/own.cpp": "int own = 0;\n"})}
    project.pin(shas["pin"])
    verbatim = edit(HOOKS, "// hooks line 3\n", "// hooks line 3\nverbatim();\n")
    project.add_patch(
        "core", "0001-core-verbatim.patch", project.patch(shas["pin"], "core: verbatim", {"src/hooks.cpp": verbatim})
    )
    context = edit(HOOKS, "// hooks line 20\n", "// hooks line 20\ncontext();\n")
    project.add_patch(
        "model_support",
        "0001-family-context.patch",
        project.patch(shas["pin"], "family: context", {"src/hooks.cpp": context}),
    )
    project.add_patch(
        "core", "0002-core-own.patch", project.patch(shas["pin"], "core: own", {"src/own.cpp": "int own = 1;\n"})
    )
    text = HOOKS
    shas["docs"] = up.commit("docs: hooks", {"docs/hooks.md": "hooks\n"})
    text = edit(text, "// hooks line 3\n", "// hooks line 3\nverbatim();\n")
    shas["picked"] = up.commit("hooks: take the downstream's verbatim()", {"src/hooks.cpp": text})
    # the same added line, with lines of the patch's context rewritten in the same commit: another
    # patch-id, and a tree that does not take the patch as it is (git's merge sees the change)
    text = edit(text, "// hooks line 18\n", "// line eighteen\n")
    text = edit(text, "// hooks line 20\n", "// hooks line 20\ncontext();\n")
    text = edit(text, "// hooks line 23\n", "// line twenty-three\n")
    shas["merged"] = up.commit("hooks: context() and tidy the comments", {"src/hooks.cpp": text})
    shas["tail"] = up.commit("readme: more", {"README.md": "# more\n"})
    prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    return project, shas


def test_pin_bump_stops_on_drop_candidates_before_any_conflict(
    carried: tuple[Project, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    project, shas = carried
    rec = Recorder()
    pin_before = (project.root / "queue" / "upstream.txt").read_text()
    with pytest.raises(CarriedUpstream) as info:
        pin_bump(
            project.settings(),
            sha=shas["tail"],
            console=QUIET,
            collaborators=Collaborators(build=rec.build, parity=rec.parity),
        )
    error = info.value
    assert rec.builds == [], "stopped before preparing or building anything"
    assert (project.root / "queue" / "upstream.txt").read_text() == pin_before
    found = {c.patch: (c.how, c.commit) for c in error.carried if isinstance(c, Carried)}
    assert found == {
        "core/0001-core-verbatim.patch": ("patch-id", shas["picked"]),
        "model_support/0001-family-context.patch": ("applied", shas["merged"]),
    }
    assert "core/0002-core-own.patch" not in error.what
    assert (
        f"--sha {shas['tail']} --drop core/0001-core-verbatim.patch --drop model_support/0001-family-context.patch"
        in (error.next_step or "")
    )
    assert "--keep core/0001-core-verbatim.patch" in (error.next_step or "")
    assert shas["picked"][:12] in (error.details or "") and shas["merged"][:12] in (error.details or "")
    assert [d["patch"] for d in error.as_dict()["drop_candidates"]] == sorted(found)  # type: ignore[attr-defined]

    # in GitHub Actions each one is a warning on its patch file
    env = {**project.env, "GITHUB_ACTIONS": "true"}
    assert pin_bump_main(env, root=project.root, sha=shas["tail"], dry_run=True) == CarriedUpstream.exit_code
    err = capsys.readouterr().err
    warned = sorted(line.split(",", 1)[0] for line in err.splitlines() if line.startswith("::warning file="))
    assert warned == [
        "::warning file=queue/patches/0001-core-verbatim.patch",
        "::warning file=queue/patches/model_support/0001-family-context.patch",
    ]


def test_bisect_names_the_drop_candidates(carried: tuple[Project, dict[str, str]]) -> None:
    project, shas = carried
    report = run_bisect(project.settings(), to=shas["tail"], console=QUIET)
    assert [(c.patch, c.commit) for c in report.carried] == [
        ("core/0001-core-verbatim.patch", shas["picked"]),
        ("model_support/0001-family-context.patch", shas["merged"]),
    ]
    text = report.render()
    assert "drop candidates (upstream already carries them" in text
    assert f"core/0001-core-verbatim.patch: upstream {shas['picked'][:12]}" in text
    assert report.as_dict()["drop_candidates"][1]["commit"] == shas["merged"]
    assert bisect_main(project.env, root=project.root, to=shas["tail"]) == 0


def test_drop_takes_them_out_and_keep_goes_on(carried: tuple[Project, dict[str, str]]) -> None:
    project, shas = carried
    patches = project.patches
    verbatim = patches / "0001-core-verbatim.patch"
    context = patches / "model_support" / "0001-family-context.patch"
    series = patches / "model_support" / "series"
    before = {p: p.read_bytes() for p in (verbatim, context, series)}

    # a dry run drops, bumps, and puts everything back byte for byte
    rec = Recorder()
    report = pin_bump(
        project.settings(),
        sha=shas["tail"],
        console=QUIET,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
        dry_run=True,
        drop=["core/0001-core-verbatim.patch", "model_support/0001-family-context.patch"],
    )
    assert rec.builds == [shas["tail"]] and not report.written
    assert {p: p.read_bytes() for p in before} == before
    # the core patch after the dropped one was renumbered for the bump, and is back as it was
    assert sorted(p.name for p in patches.glob("*.patch")) == ["0001-core-verbatim.patch", "0002-core-own.patch"]

    # a failing build puts them back too
    def broken(backend: str, settings: Settings, console: Console, prepare_fn: Any, *, upstream_tests: bool) -> object:
        raise SettingsError("the build broke", untouched="the pin")

    with pytest.raises(SettingsError, match="the build broke"):
        pin_bump(
            project.settings(),
            sha=shas["tail"],
            console=QUIET,
            collaborators=Collaborators(build=broken, parity=rec.parity),
            drop=["0001-core-verbatim.patch", "model_support/0001-family-context.patch"],
        )
    assert {p: p.read_bytes() for p in before} == before

    # --keep one, --drop the other: the bump goes on and the pin moves
    report = pin_bump(
        project.settings(),
        sha=shas["tail"],
        console=QUIET,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
        drop=["model_support/0001-family-context.patch"],
        keep=["core/0001-core-verbatim.patch"],
    )
    assert report.written and report.new_pin == shas["tail"]
    assert report.dropped == ("model_support/0001-family-context.patch",)
    assert not context.exists() and verbatim.exists()
    assert "0001-family-context.patch" not in series.read_text()
    assert any(n.startswith("kept on purpose (--keep): core/0001-core-verbatim.patch") for n in report.notes)


def test_unknown_and_contradicting_labels_are_refused(carried: tuple[Project, dict[str, str]], tmp_path: Path) -> None:
    project, shas = carried
    with pytest.raises(SettingsError, match=re.escape("--drop core/0009-nope.patch: no such patch")):
        pin_bump(project.settings(), sha=shas["tail"], console=QUIET, drop=["core/0009-nope.patch"])
    with pytest.raises(SettingsError, match=re.escape("--drop and --keep both name core/0002-core-own.patch")):
        pin_bump(
            project.settings(),
            sha=shas["tail"],
            console=QUIET,
            drop=["core/0002-core-own.patch"],
            keep=["core/0002-core-own.patch"],
        )
    assert (project.patches / "0002-core-own.patch").exists()
