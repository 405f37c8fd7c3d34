"""A workdir whose own git config names programs (issue "Hostile input, round 4", item 2).

Real filter, diff and merge drivers and a real upload-pack command in ``.deps/llama.cpp/.git/config``,
selected by ``.git/info/attributes``: each would append to a marker file if git ran it.  Through
every queue command as users call them (status, prepare, regenerate, check, triage,
generate --check, parity): filter drivers are switched off (the commands do what they do without
them, the patched commit is the same), the keys nothing can switch off are refused before any git
command runs in the workdir, naming the key, the file and the command that removes it."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.entries import (
    check_main,
    generate_main,
    parity_main,
    prepare_main,
    regenerate_main,
    status_main,
    triage_main,
)
from skippy.core.errors import UnsafeGitConfig
from skippy.core.ui import Console
from skippy.maintain import generate
from skippy.queue.prepare import Target, prepare
from tests.conftest import Project
from tests.gitfixtures import git
from tests.integration.test_generate import write_spec
from tests.integration.test_parity_fixtures import arch_upstream
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration

#: each entry point and the options of its run here
COMMANDS: tuple[tuple[str, Any, dict[str, object]], ...] = (
    ("status", status_main, {}),
    ("prepare", prepare_main, {}),
    ("regenerate", regenerate_main, {}),
    ("check", check_main, {}),
    ("triage", triage_main, {}),
    ("generate --check", generate_main, {"check": True}),
    ("parity", parity_main, {}),
)


def call(
    capsys: pytest.CaptureFixture[str], main: Any, project: Project, **options: object
) -> tuple[int, dict[str, Any], str]:
    code = main(project.env, root=project.root, json=True, **options)
    out = capsys.readouterr()
    return int(code), json.loads(out.out), out.err


def program(marker: Path, name: str, then: str = "cat") -> str:
    """A shell command that notes it ran in ``marker``, then does ``then``."""
    return f"sh -c 'echo {name} >> {shlex.quote(str(marker))}; {then}'"


def set_config(project: Project, pairs: dict[str, str], attributes: str) -> None:
    for key, value in pairs.items():
        git(project.workdir, "config", key, value, env=project.env)
    info = project.workdir / ".git" / "info"
    info.mkdir(exist_ok=True)
    (info / "attributes").write_text(attributes, encoding="utf-8")


def outcomes(capsys: pytest.CaptureFixture[str], project: Project) -> dict[str, tuple[int, str | None]]:
    """Each command's exit code and error class (None when it passed)."""
    out: dict[str, tuple[int, str | None]] = {}
    for name, main, options in COMMANDS:
        code, report, _err = call(capsys, main, project, **options)
        out[name] = (code, report.get("error"))
    return out


QUIET = Console(quiet=True)


@pytest.fixture
def armed_project(project: Project) -> Project:
    """A project with arch switches, a core patch and a generated lane, prepared: every command has work."""
    arch_upstream(project)
    write_spec(project)
    generate.run_generate(project.settings(), console=QUIET)
    prepare(project.settings(), Target.pinned(), console=QUIET)
    return project


def test_filter_drivers_in_the_workdirs_config_never_run(
    armed_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queued_project = armed_project
    clean_sha = prepare(queued_project.settings(), Target.pinned(), console=QUIET).patched_sha
    expected = outcomes(capsys, queued_project)
    assert all(code == 0 for code, _ in expected.values()), expected

    marker = tmp_path / "ran.txt"
    set_config(
        queued_project,
        {
            "filter.evil.clean": program(marker, "clean", "tr a-z A-Z"),
            "filter.evil.smudge": program(marker, "smudge", "tr a-z A-Z"),
            "filter.evil.process": program(marker, "process", "exit 1"),
            "filter.evil.required": "true",
            "filter.Other.clean": program(marker, "other"),
        },
        "* filter=evil\n*.h filter=Other\n",
    )
    assert outcomes(capsys, queued_project) == expected
    assert not marker.exists(), marker.read_text(encoding="utf-8")

    # the patched tree does not depend on the filter: the queue applied again from the pin gives the same commit
    again = prepare(queued_project.settings(), Target.pinned(), console=QUIET, force=True)
    assert again.patched_sha == clean_sha
    assert not marker.exists()
    # the user's own git (no skippy) still runs the filter: the fixture is real
    plain = ["git", "-C", str(queued_project.workdir), "hash-object", "--path=README.md", "README.md"]
    subprocess.run(plain, env=queued_project.env, capture_output=True, check=False)
    assert marker.read_text(encoding="utf-8").split() == ["process"]


@pytest.mark.parametrize(
    ("key", "attributes"),
    [
        ("diff.evil.textconv", "* diff=evil\n"),
        ("diff.evil.command", "* diff=evil\n"),
        ("merge.evil.driver", "* merge=evil\n"),
        ("remote.origin.uploadpack", ""),
        ("diff.external", ""),
        ("core.sshCommand", ""),
    ],
)
def test_a_program_nothing_can_switch_off_is_refused_by_name(
    armed_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, attributes: str
) -> None:
    queued_project = armed_project
    marker = tmp_path / "ran.txt"
    set_config(queued_project, {key: program(marker, key)}, attributes)
    config = queued_project.workdir / ".git" / "config"
    allowed = (queued_project.root / ".deps" / "cache", config)
    before = tree_state([tmp_path], allowed)
    for name, main, options in COMMANDS:
        code, report, err = call(capsys, main, queued_project, **options)
        assert code == UnsafeGitConfig.exit_code == 21, (name, err)
        assert report["ok"] is False and report["error"] == "UnsafeGitConfig", name
        assert report["what"] == (
            f"the git config of {queued_project.workdir} names a program git would run: {key.lower()} ({config})"
        )
        assert (
            report["untouched"]
            == f"{queued_project.workdir}: no git command ran in it; its config was read, not changed"
        )
        assert report["next"].startswith(f"git config --file {config} --unset-all {key.lower()}, then re-run")
        assert "sh -c" not in err and "sh -c" not in json.dumps(report)  # the program itself is never echoed
    assert not marker.exists()
    assert written_outside(before, tree_state([tmp_path], allowed)) == []

    # the next step, run as printed, clears the way
    fix = report["next"].partition(", then re-run")[0]
    subprocess.run(shlex.split(fix), env=queued_project.env, check=True)
    code, report, err = call(capsys, status_main, queued_project)
    assert code == 0, err
    assert not marker.exists()


def test_an_include_is_audited_and_a_change_to_it_is_seen(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The audit follows include.path, and is read again when an included file changes."""
    prepare(queued_project.settings(), Target.pinned(), console=Console(quiet=True))
    included = tmp_path / "included.gitconfig"
    included.write_text("[core]\n\tabbrev = 12\n", encoding="utf-8")
    git(queued_project.workdir, "config", "include.path", str(included), env=queued_project.env)
    assert call(capsys, status_main, queued_project)[0] == 0
    marker = tmp_path / "ran.txt"
    included.write_text(f'[diff "evil"]\n\ttextconv = {program(marker, "textconv")}\n', encoding="utf-8")
    code, report, _err = call(capsys, status_main, queued_project)
    assert code == UnsafeGitConfig.exit_code
    assert report["what"].endswith(f"diff.evil.textconv ({included})")
    assert not marker.exists()


def test_the_config_is_read_again_when_it_changes_not_when_git_writes_refs(
    tmp_path: Path, git_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit changes the .git folder (objects, refs, the index), never its config: the audit
    is not made again for it; a config change is seen at once."""
    from skippy.core import gitconfig

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", env=git_env)
    reads: list[Path] = []
    real_read = gitconfig._read

    def counted(path: Path, env: Mapping[str, str]) -> tuple[list[gitconfig.Entry], bool]:
        reads.append(path)
        return real_read(path, env)

    monkeypatch.setattr(gitconfig, "_read", counted)
    gitconfig.audit(repo, git_env)
    assert len(reads) == 1
    (repo / "a.txt").write_text("a\n", encoding="utf-8")
    git(repo, "add", "a.txt", env=git_env)
    git(repo, "commit", "--quiet", "-m", "a", env=git_env)
    git(repo, "tag", "t1", env=git_env)
    gitconfig.audit(repo, git_env)
    assert len(reads) == 1, "refs, objects and the index are not the config"
    git(repo, "config", "core.abbrev", "12", env=git_env)
    assert not gitconfig.audit(repo, git_env).partial
    assert len(reads) == 2, "a change to the config is read at once"
    # the same read tells a partial clone (prepare asks it with no git command of its own)
    git(repo, "config", "remote.origin.promisor", "true", env=git_env)
    assert gitconfig.audit(repo, git_env).partial and len(reads) == 3
