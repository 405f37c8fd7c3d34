"""bisect, summary and pin-bump against fixture upstreams with known breaking commits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from skippy.compile.backends import upstream_areas
from skippy.core.errors import ConflictError, SettingsError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump.bisect import run_bisect
from skippy.flows.pinbump.bump import Collaborators, pin_bump
from skippy.flows.pinbump.sides import run_summary
from skippy.queue.prepare import PrepareReport, Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)


def edit(text: str, line: str, new: str) -> str:
    assert line in text
    return text.replace(line, new)


@pytest.fixture
def history(project: Project) -> tuple[Project, dict[str, str]]:
    """pin = upstream commit 1; queue A (model line 5), B (arch line 10); then upstream moves:
    u1 unrelated, u2 breaks A, u3 unrelated, u4 breaks B, u5 unrelated."""
    up = project.upstream
    pin = up.commits[1]
    model = up.read("src/llama-model.cpp", pin)
    arch = up.read("src/llama-arch.cpp", pin)
    project.add_patch(
        "core",
        "0001-core-a.patch",
        project.patch(pin, "core: a", {"src/llama-model.cpp": edit(model, "// model line 5\n", "// A\n")}),
    )
    project.add_patch(
        "model_support",
        "0001-family-b.patch",
        project.patch(pin, "family: b", {"src/llama-arch.cpp": edit(arch, "// arch line 10\n", "// B\n")}),
    )
    shas = {"pin": pin, "u0": up.commits[2]}
    shas["u1"] = up.commit("docs: unrelated", {"docs/notes.md": "notes\n"})
    shas["u2"] = up.commit(
        "model: rework line 5",
        {"src/llama-model.cpp": edit(up.read("src/llama-model.cpp"), "// model line 5\n", "// upstream 5\n")},
    )
    shas["u3"] = up.commit("cuda: kernels", {"ggml/src/ggml-cuda/k.cu": "k\n"})
    shas["u4"] = up.commit(
        "arch: rework line 10",
        {"src/llama-arch.cpp": edit(up.read("src/llama-arch.cpp"), "// arch line 10\n", "// upstream 10\n")},
    )
    shas["u5"] = up.commit("tests: more", {"tests/test-x.cpp": "t\n"})
    prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    return project, shas


def test_bisect_finds_newest_compatible_and_breakers(history: tuple[Project, dict[str, str]]) -> None:
    project, shas = history
    report = run_bisect(project.settings(), to=None, console=QUIET)
    assert report.pin == shas["pin"]
    assert report.target == shas["u5"]
    assert report.candidates == 6  # u0 .. u5
    assert report.newest_compatible == shas["u1"]
    assert [(b.patch, b.commit) for b in report.breakers] == [
        ("core/0001-core-a.patch", shas["u2"]),
        ("model_support/0001-family-b.patch", shas["u4"]),
    ]
    assert report.tested < 7 + 3, "binary search, not a scan of every commit for every patch"
    assert "first breaks at " + shas["u2"][:12] + " model: rework line 5" in report.render()
    # towards a commit the queue still applies to, the target itself is the answer
    near = run_bisect(project.settings(), to=shas["u1"], console=QUIET)
    assert near.target_applies and near.breakers == ()
    # the workdir was not touched
    wdir = project.workdir
    env = hermetic_git_env(Path(os.environ["HOME"]))
    assert git(wdir, "status", "--porcelain", env=env) == ""


def test_summary_sections(history: tuple[Project, dict[str, str]]) -> None:
    project, shas = history
    summary = run_summary(project.settings(), shas["pin"], shas["u5"], console=QUIET)
    assert [c.sha for c in summary.commits] == [shas[k] for k in ("u5", "u4", "u3", "u2", "u1", "u0")]
    md = summary.markdown()
    assert "### Upstream commits (6)" in md
    assert "### Diffstat" in md and "files changed" in summary.shortstat
    assert summary.areas["runtime"] == 3  # u0 (arch), u2 (model), u4 (arch)
    assert summary.areas["CUDA"] == 1
    # the backends' areas come from the registry, after the runtime's and GGUF's
    assert list(summary.areas)[:2] == ["runtime", "GGUF"]
    assert list(summary.areas)[2 : 2 + len(upstream_areas())] == list(upstream_areas())
    assert summary.areas["tests"] == 1
    exposed = {e.patch: [c.sha for c in e.commits] for e in summary.exposures}
    assert exposed == {
        "core/0001-core-a.patch": [shas["u2"]],
        "model_support/0001-family-b.patch": [shas["u4"], shas["u0"]],
    }
    assert "**core/0001-core-a.patch** is exposed through `src/llama-model.cpp`" in md
    with pytest.raises(SettingsError, match="is not an ancestor"):
        run_summary(project.settings(), shas["u5"], shas["pin"], console=QUIET)


def test_summary_links_for_github_upstreams() -> None:
    from skippy.maintain.summary import github_base

    assert github_base("https://github.com/ggml-org/llama.cpp.git") == "https://github.com/ggml-org/llama.cpp"
    assert github_base("git@github.com:ggml-org/llama.cpp.git") == "https://github.com/ggml-org/llama.cpp"
    assert github_base("file:///mirror/llama.cpp.git") is None


class Recorder:
    def __init__(self) -> None:
        self.builds: list[tuple[str, str]] = []
        #: what each build was told of upstream's tests
        self.upstream_tests: list[bool] = []

    def build(
        self, backend: str, settings: Settings, console: Console, prepare_fn: Any, *, upstream_tests: bool
    ) -> object:  # the build process boundary: real builds are the e2e tier's
        report: PrepareReport = prepare_fn(settings, console)
        self.builds.append((backend, report.upstream_sha))
        self.upstream_tests.append(upstream_tests)
        return report

    def parity(self, settings: Settings, console: Console, repo: Any, base: str, upstream_sha: str) -> dict[str, Any]:
        self.audited = (base, upstream_sha)
        return {"ok": True}


def pin_text(project: Project) -> str:
    return (project.root / "queue" / "upstream.txt").read_text()


def test_pin_bump_refuses_backwards_and_sideways(history: tuple[Project, dict[str, str]]) -> None:
    project, shas = history
    rec = Recorder()
    project.pin(shas["u1"])
    before = pin_text(project)
    with pytest.raises(SettingsError, match="refusing to move the pin backwards"):
        pin_bump(
            project.settings(),
            sha=shas["pin"],
            console=QUIET,
            collaborators=Collaborators(build=rec.build, parity=rec.parity),
        )
    env = hermetic_git_env(Path(os.environ["HOME"]))
    scratch = project.upstream.path
    git(scratch, "checkout", "--quiet", "-b", "side", shas["pin"], env=env)
    side = project.upstream.commit("side: work", {"side.txt": "s\n"})
    git(scratch, "checkout", "--quiet", "master", env=env)
    with pytest.raises(SettingsError, match="not a descendant of the pin"):
        pin_bump(
            project.settings(), sha=side, console=QUIET, collaborators=Collaborators(build=rec.build, parity=rec.parity)
        )
    assert pin_text(project) == before
    assert rec.builds == []
    # an explicit override moves sideways
    git(project.workdir, "fetch", "--quiet", str(scratch), "side", env=env)
    report = pin_bump(
        project.settings(),
        sha=side,
        console=QUIET,
        allow_non_descendant=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )
    assert report.written and pin_text(project) == side + "\n"


def test_pin_bump_conflict_stops_with_triage_and_bisect(history: tuple[Project, dict[str, str]]) -> None:
    project, shas = history
    rec = Recorder()
    before = pin_text(project)
    with pytest.raises(ConflictError) as info:
        pin_bump(
            project.settings(), sha=None, console=QUIET, collaborators=Collaborators(build=rec.build, parity=rec.parity)
        )
    details = info.value.details or ""
    assert "core/0001-core-a.patch" in details and "conflict" in details
    assert f"newest upstream commit the whole queue applies to: {shas['u1'][:12]}" in details
    assert "--newest-compatible" in (info.value.next_step or "")
    assert pin_text(project) == before
    assert rec.builds == []
    # for GitHub Actions: the patch prepare stopped at, then the other one bisect found broken
    assert [(a.level, a.file) for a in info.value.annotations] == [
        ("error", "queue/patches/0001-core-a.patch"),
        ("error", "queue/patches/model_support/0001-family-b.patch"),
    ]
    assert shas["u4"][:12] in info.value.annotations[1].message


def test_pin_bump_dry_run_then_real_then_newest_compatible(
    history: tuple[Project, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    project, shas = history
    toml = project.root / "pyproject.toml"
    toml.write_text(toml.read_text() + 'pin_mirror = "queue/mirror-pin.txt"\n')
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(project.root / "summary.md"))
    rec = Recorder()
    before = pin_text(project)
    dry = pin_bump(
        project.settings(),
        sha=shas["u1"],
        console=QUIET,
        dry_run=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )
    assert not dry.written and pin_text(project) == before
    assert rec.builds == [("cpu", shas["u1"])], "dry-run still builds and spot-checks"
    settings = project.settings(GITHUB_STEP_SUMMARY=str(project.root / "summary.md"))
    report = pin_bump(
        settings,
        sha=None,
        console=Console(env=settings.env, quiet=True),
        newest_compatible=True,
        backends=("cpu", "vulkan"),
        upstream_tests=False,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )
    assert report.new_pin == shas["u1"] and report.written
    assert rec.upstream_tests == [True, False, False], "--no-upstream-tests reaches every build"
    assert pin_text(project) == shas["u1"] + "\n"
    assert (project.root / "queue" / "mirror-pin.txt").read_text() == shas["u1"] + "\n"
    assert rec.builds[-2:] == [("cpu", shas["u1"]), ("vulkan", shas["u1"])]
    assert "## llama.cpp" in (project.root / "summary.md").read_text()
    assert not list((project.root / "queue").glob("*.tmp")), "the atomic write leaves no temp file"
    # now at the target: prepare --pinned has nothing to do
    assert prepare(project.settings(), Target.pinned(), console=QUIET).action == "noop"
    again = pin_bump(
        project.settings(),
        sha=shas["u1"],
        console=QUIET,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )
    assert not again.written and "already at the target" in again.notes


def test_failed_build_leaves_the_pin(history: tuple[Project, dict[str, str]]) -> None:
    project, shas = history
    before = pin_text(project)

    def failing_build(
        backend: str, settings: Settings, console: Console, prepare_fn: Any, *, upstream_tests: bool
    ) -> object:
        from skippy.core.errors import BuildError

        prepare_fn(settings, console)
        raise BuildError("ninja failed", untouched="the pin")

    from skippy.core.errors import BuildError

    with pytest.raises(BuildError):
        pin_bump(
            project.settings(),
            sha=shas["u1"],
            console=QUIET,
            collaborators=Collaborators(build=failing_build, parity=Recorder().parity),
        )
    assert pin_text(project) == before


SWITCH = """int llama_model_rope_type(int arch) {
    switch (arch) {
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_GEMMA3:
            return 1;
        default:
            return 0;
    }
}
"""


def test_pin_bump_fails_on_a_dropped_arch_case(project: Project) -> None:
    """The real parity audit runs against the new upstream: a queue that drops a case stops the bump."""
    from skippy.core.errors import ParityFailed

    up = project.upstream
    pin = up.commit("model: rope types", {"src/llama-rope.cpp": SWITCH})
    project.pin(pin)
    dropped = SWITCH.replace("        case LLM_ARCH_GEMMA3:\n", "")
    project.add_patch("core", "0001-core-drop.patch", project.patch(pin, "core: drop", {"src/llama-rope.cpp": dropped}))
    new = up.commit("docs: later", {"docs/later.md": "x\n"})
    prepare(project.settings(), Target.pinned(), console=QUIET, interactive=False)
    before = pin_text(project)
    with pytest.raises(ParityFailed) as info:
        pin_bump(project.settings(), sha=new, console=QUIET, collaborators=Collaborators(build=Recorder().build))
    assert "LLM_ARCH_GEMMA3" in (info.value.details or "")
    assert "llama_model_rope_type" in (info.value.details or "")
    assert pin_text(project) == before


def test_pin_bump_keeps_the_pin_files_comments_and_mode(history: tuple[Project, dict[str, str]]) -> None:
    project, shas = history
    pin_file = project.root / "queue" / "upstream.txt"
    header = "# upstream llama.cpp: bump with `invoke pin-bump`\r\n#   (the CI canary reads this file)\r\n\r\n"
    pin_file.write_bytes((header + shas["pin"] + "\r\n# reviewed 2024-05\r\n").encode())
    pin_file.chmod(0o664)
    real_mirror = project.root / "mirror" / "pin.txt"
    real_mirror.parent.mkdir()
    real_mirror.write_text(f"# mirror\n{shas['pin']}", encoding="utf-8")  # no final newline
    real_mirror.chmod(0o640)
    (project.root / "queue" / "mirror-pin.txt").symlink_to(real_mirror)
    toml = project.root / "pyproject.toml"
    toml.write_text(toml.read_text() + 'pin_mirror = "queue/mirror-pin.txt"\n')
    rec = Recorder()
    report = pin_bump(
        project.settings(),
        sha=shas["u1"],
        console=QUIET,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )
    assert report.written
    assert pin_file.read_bytes() == (header + shas["u1"] + "\r\n# reviewed 2024-05\r\n").encode()
    assert pin_file.stat().st_mode & 0o7777 == 0o664
    assert (project.root / "queue" / "mirror-pin.txt").is_symlink(), "the mirror link is written through"
    assert real_mirror.read_text(encoding="utf-8") == f"# mirror\n{shas['u1']}"
    assert real_mirror.stat().st_mode & 0o7777 == 0o640
    assert prepare(project.settings(), Target.pinned(), console=QUIET).upstream_sha == shas["u1"]


def test_pin_bump_reports_greedy_drift_and_rewrites_the_reference(history: tuple[Project, dict[str, str]]) -> None:
    from types import SimpleNamespace

    from skippy.spot.fingerprint import Fingerprint, Run, Step, read_reference, reference_path, render_reference
    from skippy.spot.proofs import reference_dir
    from skippy.spot.report import ModelResult, SpotCheckReport

    project, shas = history
    settings = project.settings()

    def fingerprint(*ids: int) -> Fingerprint:
        steps = tuple(Step(i, f" t{i}", -0.5) for i in ids)
        return Fingerprint(model="gemma3-270m", model_sha256="f" * 64, runs=(Run("a", steps), Run("b", steps)))

    refs = reference_dir(settings)
    refs.mkdir(parents=True)
    reference_path(refs, "gemma3-270m").write_text(render_reference(fingerprint(1, 2, 3)), encoding="utf-8")
    new = fingerprint(1, 2, 4)
    result = ModelResult(model="gemma3-270m", path=None, verdict="pass")
    result.compute.fingerprint = new
    spot = SpotCheckReport(server="llama-server", results=[result])

    def build(backend: str, s: object, c: object, p: object, *, upstream_tests: bool) -> object:
        return SimpleNamespace(spot=spot)

    rec = Recorder()
    dry = pin_bump(
        settings,
        sha=shas["u1"],
        console=QUIET,
        dry_run=True,
        collaborators=Collaborators(build=build, parity=rec.parity),
    )
    (numerics,) = dry.numerics
    assert numerics["changed_prompts"] == ["a", "b"] and numerics["written"] is False
    assert read_reference(refs, "gemma3-270m") == fingerprint(1, 2, 3), "a dry run writes no reference"
    assert "CHANGED for `a`, `b`" in dry.numerics_markdown()

    report = pin_bump(
        settings, sha=shas["u1"], console=QUIET, collaborators=Collaborators(build=build, parity=rec.parity)
    )
    assert report.written and report.numerics[0]["written"] is True
    assert read_reference(refs, "gemma3-270m") == new
    assert report.as_dict()["numerics"][0]["model"] == "gemma3-270m"
