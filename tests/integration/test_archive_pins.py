"""A workdir whose upstream commits come from source archives (the upstream does not answer):
what a user reads names the upstream SHAs, never the local import commits, and the pin moves
between two archive-backed commits (``pin-bump`` offline)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from skippy.core.errors import ConflictError, SettingsError
from skippy.core.files import sha256_of
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump.bump import Collaborators, pin_bump
from skippy.flows.pinbump.sides import run_summary
from skippy.maintain.summary import summarize
from skippy.queue.model import load_queue
from skippy.queue.prepare import PrepareReport, Target, prepare, triage_target
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env
from tests.integration.test_archives_prepare import archive_of, configure, snapshot

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)
GITHUB = "https://github.com/ggml-org/llama.cpp.git"


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


@dataclass
class Archived:
    project: Project
    pin: str
    clean: str  # a later upstream commit the whole queue applies to
    breaking: str  # a later upstream commit the core hook patch conflicts with

    def settings(self) -> Settings:
        return self.project.settings()

    def import_of(self, sha: str) -> str:
        return run_git(self.project.workdir, "rev-parse", f"refs/skippy/archive/{sha}").strip()

    def pin_text(self) -> str:
        return (self.project.root / "queue" / "upstream.txt").read_text(encoding="utf-8")


@pytest.fixture
def archived(queued_project: Project) -> Archived:
    """The queued project with three archive-backed upstream commits (the pin, a clean target and a
    breaking one), an upstream URL that does not answer, and the workdir prepared from the pin's archive."""
    up = queued_project.upstream
    pin = up.commits[1]
    clean = up.commit("docs: notes", {"docs/notes.md": "notes\n"})
    model = up.read("src/llama-model.cpp")
    breaking = up.commit("model: rework line 5", {"src/llama-model.cpp": model.replace("line 5\n", "line five\n")})
    mappings = {}
    for sha in (pin, clean, breaking):
        archive = archive_of(queued_project, sha)
        mappings[sha] = (archive, sha256_of(archive))
    configure(queued_project, (queued_project.root / "missing.git").as_uri(), mappings)
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET, sleep=lambda _s: None)
    assert report.source == "archive"
    return Archived(queued_project, pin, clean, breaking)


# --------------------------------------------------------------------------- item 8: upstream SHAs


def test_triage_names_the_upstream_shas_not_the_imports(archived: Archived) -> None:
    report = triage_target(archived.settings(), Target.at(archived.breaking), console=QUIET, sleep=lambda _s: None)

    assert (report.target, report.since) == (archived.breaking, archived.pin)
    text = report.render()
    assert text.startswith(f"triage against {archived.breaking[:12]} (since {archived.pin[:12]})")
    conflict = next(v for v in report.verdicts if v.verdict == "conflict")
    # no history: no upstream commit is blamed (the import commit is not one), and the table says why
    assert conflict.blamed == ()
    assert "no upstream history here" in text
    shown = text + json.dumps(report.as_dict())
    for imported in (archived.import_of(archived.breaking), archived.import_of(archived.pin)):
        assert imported[:12] not in shown


def test_a_conflicting_prepare_reports_the_upstream_sha(archived: Archived) -> None:
    with pytest.raises(ConflictError) as caught:
        prepare(archived.settings(), Target.at(archived.breaking), console=QUIET, interactive=False)
    said = f"{caught.value.what}\n{caught.value.details}\n{caught.value.next_step}"
    assert f"triage against {archived.breaking[:12]} (since {archived.pin[:12]})" in said
    assert archived.import_of(archived.breaking)[:12] not in said
    assert archived.import_of(archived.pin)[:12] not in said


def test_summary_between_archives_links_upstream_shas_and_lists_no_local_commit(archived: Archived) -> None:
    repo = Repo(archived.project.workdir, archived.project.env)
    prepare(archived.settings(), Target.at(archived.clean), console=QUIET, sleep=lambda _s: None)
    old, new = archived.import_of(archived.pin), archived.import_of(archived.clean)
    queue = load_queue(archived.settings().patch_dir)

    summary = summarize(repo, old, new, queue, upstream_url=GITHUB)

    md = summary.markdown()
    assert (summary.old, summary.new) == (archived.pin, archived.clean)
    assert f"## llama.cpp {archived.pin[:12]} → {archived.clean[:12]}" in md
    assert f"/compare/{archived.pin}...{archived.clean}" in md
    assert summary.commits == ()
    assert "Unavailable: " in md and "known here only from their source archives" in md
    # the diffstat between the two trees is still there
    assert "2 files changed" in summary.shortstat and ("docs/notes.md", 1) in summary.top_files
    for local in (old, new, *run_git(archived.project.workdir, "rev-list", f"{new}..HEAD").split()):
        assert local[:12] not in md
        assert local not in json.dumps(summary.as_dict())


def test_run_summary_between_archives_gives_the_diffstat(archived: Archived) -> None:
    summary = run_summary(archived.settings(), archived.pin, archived.clean, console=QUIET)
    assert (summary.old, summary.new) == (archived.pin, archived.clean)
    assert summary.no_history and summary.commits == ()
    assert ("docs/notes.md", 1) in summary.top_files


def test_summary_never_lists_the_queues_commits_as_upstream_ones(queued_project: Project) -> None:
    """With history: the queue's own commits (Skippy-Patch) on top of the pin are not upstream commits."""
    report = prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    repo = Repo(queued_project.workdir, queued_project.env)
    queue = load_queue(queued_project.settings().patch_dir)
    upstream_first = queued_project.upstream.commits[0]

    summary = summarize(repo, upstream_first, report.patched_sha, queue, upstream_url=GITHUB)

    assert [c.sha for c in summary.commits] == [queued_project.upstream.commits[1]]
    assert summary.no_history is None
    md = summary.markdown()
    assert "### Upstream commits (1)" in md
    listed = md.split("### Upstream commits", 1)[1].split("### Diffstat", 1)[0]
    assert "readme: mention the fixture" in listed
    for queued in run_git(queued_project.workdir, "rev-list", f"{report.upstream_sha}..HEAD").split():
        assert queued[:12] not in listed


def test_summary_from_an_upstream_commit_to_an_archive_import_lists_no_import(queued_project: Project) -> None:
    """An upstream commit of the history, then a target known only from its archive: the import
    commit (parentless: all of ``old..import``) is not an upstream commit."""
    up = queued_project.upstream
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    target = up.commit("docs: notes", {"docs/notes.md": "notes\n"})
    archive = archive_of(queued_project, target)
    configure(
        queued_project,
        (queued_project.root / "missing.git").as_uri(),
        {target: (archive, sha256_of(archive))},
    )
    prepare(queued_project.settings(), Target.at(target), console=QUIET, sleep=lambda _s: None)
    repo = Repo(queued_project.workdir, queued_project.env)
    imported = run_git(queued_project.workdir, "rev-parse", f"refs/skippy/archive/{target}").strip()

    summary = summarize(
        repo, up.commits[1], imported, load_queue(queued_project.settings().patch_dir), upstream_url=GITHUB
    )

    assert summary.new == target and summary.commits == ()
    assert imported[:12] not in summary.markdown()
    assert f"{target[:12]} is known here only from its source archive" in summary.markdown()


# --------------------------------------------------------------------------- item 9: pin-bump offline


class Recorder:
    def __init__(self) -> None:
        self.builds: list[tuple[str, str]] = []
        self.audited: tuple[str, str] | None = None

    def build(
        self, backend: str, settings: Settings, console: Console, prepare_fn: Any, *, upstream_tests: bool
    ) -> object:  # the build process boundary: real builds are the e2e tier's
        report: PrepareReport = prepare_fn(settings, console)
        self.builds.append((backend, report.upstream_sha))
        return report

    def parity(self, settings: Settings, console: Console, repo: Any, base: str, upstream_sha: str) -> dict[str, Any]:
        self.audited = (base, upstream_sha)
        return {"ok": True}


def test_pin_bump_dry_run_between_two_archives(archived: Archived) -> None:
    rec = Recorder()
    before = archived.pin_text()

    report = pin_bump(
        archived.settings(),
        sha=archived.clean[:12],
        console=QUIET,
        dry_run=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )

    assert (report.old_pin, report.new_pin, report.written) == (archived.pin, archived.clean, False)
    assert archived.pin_text() == before
    assert rec.builds == [("cpu", archived.clean)]
    assert rec.audited == (archived.import_of(archived.clean), archived.clean)
    notes = "\n".join(report.notes)
    assert (
        f"cannot check that {archived.clean[:12]} descends from the pin {archived.pin[:12]}: "
        f"{archived.pin[:12]} and {archived.clean[:12]} are known here only from their source archives" in notes
    )
    assert "the real bump will need --allow-non-descendant" in notes
    assert report.summary is not None and report.summary.no_history
    assert report.summary.new == archived.clean and "2 files changed" in report.summary.shortstat


def test_pin_bump_between_two_archives_needs_allow_non_descendant(archived: Archived) -> None:
    rec = Recorder()
    before = archived.pin_text()
    with pytest.raises(SettingsError) as caught:
        pin_bump(
            archived.settings(),
            sha=archived.clean,
            console=QUIET,
            collaborators=Collaborators(build=rec.build, parity=rec.parity),
        )
    assert "refusing to move the pin without knowing it moves forward" in caught.value.what
    assert f"invoke pin-bump --sha {archived.clean} --allow-non-descendant" in (caught.value.next_step or "")
    assert archived.pin_text() == before and rec.builds == []

    report = pin_bump(
        archived.settings(),
        sha=archived.clean,
        console=QUIET,
        allow_non_descendant=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )

    assert report.written and archived.pin_text() == archived.clean + "\n"
    assert "going on as --allow-non-descendant says" in "\n".join(report.notes)
    # the workdir is prepared at the new pin, from its archive
    stamp = json.loads((archived.project.workdir / ".git" / "skippy" / "prepare.json").read_text(encoding="utf-8"))
    assert (stamp["upstream_sha"], stamp["base_commit"]) == (archived.clean, archived.import_of(archived.clean))


def test_pin_bump_offline_never_contacts_the_upstream(archived: Archived) -> None:
    """--offline with an upstream that does answer: nothing is fetched from it."""
    project = archived.project
    mappings = {}
    for sha in (archived.pin, archived.clean, archived.breaking):
        archive = project.root / "archives" / f"{sha[:12]}.tar.gz"
        mappings[sha] = (archive, sha256_of(archive))
    configure(project, str(project.upstream.path), mappings)
    upstream_before = snapshot(project.upstream.path)
    rec = Recorder()

    report = pin_bump(
        archived.settings(),
        sha=archived.clean,
        console=QUIET,
        dry_run=True,
        offline=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )

    assert report.new_pin == archived.clean and report.summary is not None and report.summary.no_history
    assert run_git(project.workdir, "for-each-ref", "refs/remotes") == ""
    assert snapshot(project.upstream.path) == upstream_before
    with pytest.raises(SettingsError, match="needs --sha") as caught:
        pin_bump(
            archived.settings(), sha=None, console=QUIET, offline=True, collaborators=Collaborators(build=rec.build)
        )
    assert (
        caught.value.next_step == f"`invoke pin-bump --offline --sha {sorted((archived.clean, archived.breaking))[0]}`"
    )


def test_pin_bump_between_archives_has_no_bisection(archived: Archived) -> None:
    rec = Recorder()
    with pytest.raises(SettingsError, match="--newest-compatible bisects the upstream history"):
        pin_bump(
            archived.settings(),
            sha=archived.breaking,
            console=QUIET,
            newest_compatible=True,
            collaborators=Collaborators(build=rec.build, parity=rec.parity),
        )
    with pytest.raises(ConflictError) as caught:
        pin_bump(
            archived.settings(),
            sha=archived.breaking,
            console=QUIET,
            dry_run=True,
            collaborators=Collaborators(build=rec.build, parity=rec.parity),
        )
    details = caught.value.details or ""
    assert f"triage against {archived.breaking[:12]}" in details
    assert "no bisection: the pin or the target is known here only from its source archive" in details
    assert rec.builds == []


def test_conflict_rehearsal_offline(archived: Archived) -> None:
    """The README's offline rehearsal: prepare the target from its archive, resolve, continue,
    regenerate, then bump; nothing needs the upstream."""
    from skippy.maintain.regenerate import regenerate
    from skippy.queue.session import resume_session

    settings = archived.settings()
    wdir = archived.project.workdir
    with pytest.raises(ConflictError):
        prepare(settings, Target.at(archived.breaking), console=QUIET, interactive=True, offline=True)
    model = (wdir / "src" / "llama-model.cpp").read_text(encoding="utf-8")
    assert "<<<<<<<" in model
    resolved = archived.project.upstream.read("src/llama-model.cpp", archived.breaking).replace(
        "line five\n", "line five\nHOOK\n"
    )
    (wdir / "src" / "llama-model.cpp").write_text(resolved, encoding="utf-8")
    run_git(wdir, "add", "src/llama-model.cpp")
    resumed = resume_session(settings, "continue", console=QUIET)
    assert resumed.upstream_sha == archived.breaking
    regenerate(settings, core_head=None, model_support_head=None, checkout=None, console=QUIET, offline=True)
    rec = Recorder()

    report = pin_bump(
        settings,
        sha=archived.breaking,
        console=QUIET,
        offline=True,
        allow_non_descendant=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )

    assert report.written and archived.pin_text() == archived.breaking + "\n"
    assert rec.builds == [("cpu", archived.breaking)]
