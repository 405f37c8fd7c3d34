"""The offline conflict rehearsal's X (issue 43): ``--offline`` beside a local mirror, typos in
``--sha`` and in an archive's key, and what pin-bump says of a pin only a source archive holds.

Real git throughout: the fixture upstream is a local repository, its archives are ``git archive``
tarballs (which record their commit as the archive's comment, as a forge's release tarball does).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from skippy.core.errors import ArchiveError, SettingsError
from skippy.core.files import sha256_of
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.pinbump.bump import Collaborators, pin_bump
from skippy.queue.prepare import PrepareReport, Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env
from tests.integration.test_archives_prepare import archive_of, configure, git_missing, snapshot

pytestmark = pytest.mark.integration
QUIET = Console(quiet=True)


def run_git(path: Path, *args: str) -> str:
    return git(path, *args, env=hermetic_git_env(Path(os.environ["HOME"])))


def typo(sha: str) -> str:
    """``sha`` with its last digit changed."""
    return sha[:-1] + ("0" if sha[-1] != "0" else "1")


class Recorder:
    """The build and parity steps at their process boundary (real builds are the e2e tier's)."""

    def build(
        self, backend: str, settings: Settings, console: Console, prepare_fn: Any, *, upstream_tests: bool
    ) -> object:
        report: PrepareReport = prepare_fn(settings, console)
        return report

    def parity(self, settings: Settings, console: Console, repo: Any, base: str, upstream_sha: str) -> dict[str, Any]:
        return {"ok": True}


def mirrored(project: Project) -> tuple[str, str]:
    """The pin mapped to its archive, the upstream URL a local repository (a mirror), and a later
    upstream commit X that only the mirror has; (pin, X)."""
    pin = project.upstream.commits[1]
    x = project.upstream.commit("docs: notes", {"docs/notes.md": "notes\n"})
    archive = archive_of(project, pin)
    configure(project, str(project.upstream.path), {pin: (archive, sha256_of(archive))})
    return pin, x


def test_offline_beside_a_local_mirror_says_why_and_its_next_command_prepares_x(queued_project: Project) -> None:
    pin, x = mirrored(queued_project)
    prepare(queued_project.settings(), Target.pinned(), console=QUIET, offline=True)
    head = run_git(queued_project.workdir, "rev-parse", "HEAD")
    upstream_before = snapshot(queued_project.upstream.path)

    with pytest.raises(SettingsError) as caught:
        prepare(queued_project.settings(), Target.at(x), console=QUIET, offline=True)

    error = caught.value
    mirror = str(queued_project.upstream.path)
    assert "(offline: no archive is configured for it)" in error.what
    assert f"--offline reads no upstream, not even the local repository {mirror}" in (error.details or "")
    assert f"mapped: {pin[:12]}" in (error.details or "")
    assert error.next_step is not None
    assert f"drop --offline: `invoke prepare --sha {x}` reads the local upstream {mirror}" in error.next_step
    assert "nothing was fetched, imported or changed" in (error.untouched or "")
    # nothing read from the mirror, nothing changed here
    assert snapshot(queued_project.upstream.path) == upstream_before
    assert git_missing(queued_project.workdir, x)
    assert run_git(queued_project.workdir, "rev-parse", "HEAD") == head
    # the command it names (without --offline) prepares X from the mirror
    report = prepare(queued_project.settings(), Target.at(x), console=QUIET)
    assert (report.upstream_sha, report.source) == (x, "git")


def test_a_typo_in_sha_offline_names_the_mapped_commit_and_touches_nothing(queued_project: Project) -> None:
    pin, _x = mirrored(queued_project)
    prepare(queued_project.settings(), Target.pinned(), console=QUIET, offline=True)
    refs = run_git(queued_project.workdir, "for-each-ref")

    for wrong in (typo(pin), typo(pin[:12])):
        with pytest.raises(SettingsError) as caught:
            prepare(queued_project.settings(), Target.at(wrong), console=QUIET, offline=True)
        assert caught.value.what.startswith(f"--sha {wrong}: ")
        assert f"maps {pin}, a few digits away: a typo?" in caught.value.what
        assert caught.value.next_step == f"`invoke prepare --sha {pin} --offline`"
    assert run_git(queued_project.workdir, "for-each-ref") == refs


def test_an_archive_key_its_own_content_contradicts_is_refused_before_anything_is_unpacked(
    queued_project: Project,
) -> None:
    """A typo in the 40-hex key of pyproject.toml: the tarball records its real commit."""
    pin = queued_project.upstream.commits[1]
    archive = archive_of(queued_project, pin)
    wrong = typo(pin)
    configure(queued_project, str(queued_project.root / "missing.git"), {wrong: (archive, sha256_of(archive))})
    pin_file = queued_project.root / "queue" / "upstream.txt"
    before = pin_file.read_text(encoding="utf-8")

    with pytest.raises(ArchiveError) as caught:
        prepare(queued_project.settings(), Target.at(wrong), console=QUIET, offline=True)

    error = caught.value
    assert error.what == (
        f'pyproject.toml [tool.skippy.archives."{wrong}"]: the archive file:archives/{pin[:12]}.tar.gz holds '
        f"upstream {pin}, not {wrong} (the key)"
    )
    assert "git archive records the commit there" in (error.details or "")
    assert "nothing was unpacked or committed" in (error.untouched or "")
    assert error.next_step == (
        f'rename the table to [tool.skippy.archives."{pin}"] in pyproject.toml (the key is the upstream commit '
        f"the archive holds), then `invoke prepare --sha {pin} --offline`"
    )
    assert pin_file.read_text(encoding="utf-8") == before
    assert not (queued_project.workdir / "src").exists()
    store = queued_project.root / ".deps" / "cache" / "git" / "llama.cpp.git"
    assert not store.exists() or run_git(store, "for-each-ref", "refs/skippy/archive") == ""
    # the next step, done: the right key prepares it
    configure(queued_project, str(queued_project.root / "missing.git"), {pin: (archive, sha256_of(archive))})
    assert prepare(queued_project.settings(), Target.at(pin), console=QUIET, offline=True).source == "archive"


def test_a_pin_from_a_source_archive_alone_is_marked_unverified(queued_project: Project) -> None:
    up = queued_project.upstream
    pin = up.commits[1]
    x = up.commit("docs: notes", {"docs/notes.md": "notes\n"})
    mappings = {}
    for sha in (pin, x):
        archive = archive_of(queued_project, sha)
        mappings[sha] = (archive, sha256_of(archive))
    configure(queued_project, str(up.path), mappings)
    rec = Recorder()

    dry = pin_bump(
        queued_project.settings(),
        sha=x[:12],
        console=QUIET,
        dry_run=True,
        offline=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )
    report = pin_bump(
        queued_project.settings(),
        sha=x,
        console=QUIET,
        offline=True,
        allow_non_descendant=True,
        collaborators=Collaborators(build=rec.build, parity=rec.parity),
    )

    said = f"the source archive file:archives/{x[:12]}.tar.gz (sha256 {mappings[x][1][:12]}...)"
    assert report.written and report.source == "archive"
    assert report.unverified.startswith(said)
    assert (
        "whose own record (the archive's comment (git archive records the commit there)) names it" in report.unverified
    )
    assert f"unverified pin: {x[:12]} comes from {said}" in "\n".join(report.notes)
    md = report.provenance_markdown()
    assert md.startswith(f"> **Unverified pin**: `{x}` was written from {said}")
    assert f"re-run `invoke pin-bump --sha {x}` with LLAMA_UPSTREAM_URL pointing at a mirror" in md
    assert dry.provenance_markdown().startswith(f"> **Unverified pin**: `{x}` would be written from {said}")
    as_json = json.loads(json.dumps(report.as_dict()))
    assert (as_json["source"], as_json["verified"]) == ("archive", False)


def test_a_pin_the_upstream_history_holds_is_not_marked(queued_project: Project) -> None:
    _pin, x = mirrored(queued_project)  # the pin mapped to an archive, but the mirror answers
    rec = Recorder()

    report = pin_bump(
        queued_project.settings(), sha=x, console=QUIET, collaborators=Collaborators(build=rec.build, parity=rec.parity)
    )

    assert report.written and report.source == "git" and report.unverified == ""
    assert report.provenance_markdown() == "" and report.as_dict()["verified"] is True
    assert not any("unverified" in note for note in report.notes)


def test_a_reference_that_already_holds_the_answers_is_not_said_to_be_rewritten(queued_project: Project) -> None:
    from skippy.spot.fingerprint import Fingerprint, Run, Step, reference_path, render_reference
    from skippy.spot.proofs import reference_dir
    from skippy.spot.report import ModelResult, SpotCheckReport

    settings = queued_project.settings()
    prepare(settings, Target.pinned(), console=QUIET)
    x = queued_project.upstream.commit("docs: notes", {"docs/notes.md": "notes\n"})
    steps = (Step(1, " t1", -0.5), Step(2, " t2", -0.25))
    fingerprint = Fingerprint(model="gemma3-270m", model_sha256="f" * 64, runs=(Run("a", steps),))
    path = reference_path(reference_dir(settings), "gemma3-270m")
    path.parent.mkdir(parents=True)
    path.write_text(render_reference(fingerprint), encoding="utf-8")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    result = ModelResult(model="gemma3-270m", path=None, verdict="pass")
    result.compute.fingerprint = fingerprint
    spot = SpotCheckReport(server="llama-server", results=[result])

    def build(backend: str, s: object, c: object, p: object, *, upstream_tests: bool) -> object:
        return SimpleNamespace(spot=spot)

    report = pin_bump(
        settings, sha=x, console=QUIET, collaborators=Collaborators(build=build, parity=Recorder().parity)
    )

    (numerics,) = report.numerics
    assert (numerics["written"], numerics["up_to_date"]) == (False, True)
    md = report.numerics_markdown()
    assert "rewritten" not in md
    assert f"- `gemma3-270m`: unchanged; reference `{numerics['reference']}` already holds these answers" in md
    assert path.stat().st_mtime_ns == 1_000_000_000, "the reference file was not written again"


def test_a_mirror_made_from_the_workdir_serves_the_rehearsal_without_the_upstream(queued_project: Project) -> None:
    """docs/queue.md's command: a workdir cloned from the upstream holds its history; pushed into
    a bare repository it is a mirror that prepares the pin and X once the upstream is gone."""
    pin, x = queued_project.upstream.commits[1], queued_project.upstream.commit("docs: notes", {"d.md": "d\n"})
    prepare(queued_project.settings(), Target.pinned(), console=QUIET)
    mirror = queued_project.root.parent / "llama.cpp-mirror.git"
    run_git(queued_project.root, "init", "--quiet", "--bare", str(mirror))
    run_git(
        queued_project.root,
        "-C",
        ".deps/llama.cpp",
        "push",
        "--quiet",
        str(mirror),
        "refs/remotes/origin/master:refs/heads/master",
        "refs/tags/*:refs/tags/*",
    )
    queued_project.upstream.path.rename(queued_project.root.parent / "gone.git")
    shutil.rmtree(queued_project.workdir)  # a new workdir: cloned from the mirror alone
    (queued_project.root / "llama.cpp").unlink()
    settings = queued_project.settings(LLAMA_UPSTREAM_URL=str(mirror))

    assert prepare(settings, Target.pinned(), console=QUIET).action == "cloned"
    report = prepare(settings, Target.at(x[:12]), console=QUIET)

    assert (report.upstream_sha, report.source) == (x, "git")
    assert run_git(queued_project.workdir, "remote", "get-url", "origin").strip() == str(mirror)
    assert pin in run_git(queued_project.workdir, "rev-list", x)
