"""Hostile links and paths through the entry points (issue "Hostile input, round 4", items 1,
3, 6 and 9): a queue, pin or settings file linked to a secret (``/proc/self/environ``, a
protected file, ``/etc/shadow``) is refused and never read, a ``file:`` archive outside the
project is never copied, a workdir inside the queue or ``.git`` and a link loop in a path
variable are clear errors, and a pin file with two lines says so.  Each case asserts the exit
code, the message, the JSON report, that no secret is printed and that nothing was written
outside the places the command owns."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.entries import check_main, parity_main, prepare_main, status_main
from skippy.core.errors import ArchiveError, CheckFailed, QueueError, SettingsError
from skippy.core.files import sha256_of
from tests.conftest import Project
from tests.gitfixtures import git, hermetic_git_env, pyproject
from tests.integration.test_archives_prepare import FOLDER, archive_of
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SHADOW = Path("/etc/shadow")
#: what a link may point to: a protected file the test makes, the process's own environment,
#: and the system's shadow file where this machine has one
TARGETS = ["protected", "environ", *(["/etc/shadow"] if SHADOW.exists() else [])]


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def report(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.out)
        return data

    def shown(self) -> str:
        return self.out + self.err


@dataclass(frozen=True)
class Secret:
    """A secret planted where a link may lead: in a protected file and in the environment."""

    value: str
    protected: Path

    def target(self, which: str) -> Path:
        return {"protected": self.protected, "environ": Path("/proc/self/environ"), "/etc/shadow": SHADOW}[which]

    def assert_not_in(self, text: str) -> None:
        assert self.value not in text
        if SHADOW.exists() and os.access(SHADOW, os.R_OK):
            for line in SHADOW.read_text(encoding="utf-8", errors="replace").splitlines():
                _name, _, rest = line.partition(":")
                if len(rest) > 12:  # an entry with a password field worth the name
                    assert rest not in text


@pytest.fixture
def secret(tmp_path: Path) -> Secret:
    value = "skippy-test-secret-" + secrets.token_hex(12)
    folder = tmp_path / "protected"
    folder.mkdir()
    protected = folder / "shadow"
    protected.write_text(f"root:$6${value}:19000:0:99999:7:::\n", encoding="utf-8")
    protected.chmod(0o640)
    return Secret(value, protected)


def invoke(project: Project, secret: Secret, *args: str, env: dict[str, str] | None = None) -> Outcome:
    """``invoke ARGS`` in the project, as a user runs it, the secret in its environment (so that
    ``/proc/self/environ`` holds it)."""
    tasks = project.root / "tasks.py"
    if not tasks.exists():
        shutil.copy(REPO_ROOT / "tasks.py", tasks)
    full = {
        **os.environ,
        **project.env,
        **(env or {}),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(REPO_ROOT),  # the skippy under test, wherever the tree is
        "SKIPPY_TEST_SECRET": secret.value,
    }
    done = subprocess.run(
        ["invoke", *args], cwd=project.root, env=full, capture_output=True, text=True, timeout=300, check=False
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def call(capsys: pytest.CaptureFixture[str], main: Callable[..., int], project: Project, **options: Any) -> Outcome:
    env = {**project.env, **options.pop("env", {})}
    code = main(env, root=project.root, json=True, **options)
    out = capsys.readouterr()
    return Outcome(code, out.out, out.err)


def watched(project: Project, tmp_path: Path) -> tuple[list[Path], tuple[Path, ...]]:
    """The folders compared before and after, and the ones the commands may write (workdir, cache)."""
    return [tmp_path, Path(os.environ["HOME"])], (project.root / ".deps",)


def link(path: Path, target: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


# --- item 1: a queue, pin or settings file linked out of the project -------------------------

#: file -> (where it is, the commands that read it, their exit code and error)
LINKED: dict[str, tuple[str, list[tuple[str, ...]], int, str]] = {
    "series": ("queue/patches/model_support/series", [("check",), ("prepare",)], QueueError.exit_code, "QueueError"),
    "pin": ("queue/upstream.txt", [("status",), ("prepare",)], SettingsError.exit_code, "SettingsError"),
    "allowlist": ("queue/patches/parity-allowlist.toml", [("parity",)], QueueError.exit_code, "QueueError"),
    "settings": ("pyproject.toml", [("status",)], SettingsError.exit_code, "SettingsError"),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("which", list(LINKED))
def test_a_file_linked_out_of_the_project_is_refused_and_never_read(
    queued_project: Project, tmp_path: Path, secret: Secret, which: str, target: str
) -> None:
    where, commands, exit_code, error = LINKED[which]
    path = queued_project.root / where
    real = r"/proc/\d+/environ" if target == "environ" else re.escape(os.path.realpath(secret.target(target)))
    shutil.copy(REPO_ROOT / "tasks.py", queued_project.root / "tasks.py")
    link(path, secret.target(target))
    tops, allowed = watched(queued_project, tmp_path)
    before = tree_state(tops, allowed)
    for args in commands:
        ran = invoke(queued_project, secret, *args, "--json")
        # `invoke check` reports the refusal as its queue step's failure
        expected = (CheckFailed.exit_code, "CheckFailed") if args == ("check",) else (exit_code, error)
        assert ran.code == expected[0], (args, ran.err)
        report = ran.report
        assert report["ok"] is False and report["error"] == expected[1], report
        text = json.dumps(report)
        # the file is named with what it is (the link's target, /proc/<its pid>/environ), never quoted
        assert re.search(
            rf"a symbolic link to {real}, outside the project \({re.escape(str(queued_project.root))}\)", text
        ), text
        assert "refused" in text
        assert "Traceback" not in ran.err
        secret.assert_not_in(ran.shown())
        if which == "series" and args == ("check",):
            queue_step = report["check"]["steps"][0]
            assert queue_step["name"] == "queue" and queue_step["status"] == "failed"
            assert [s["status"] for s in report["check"]["steps"][1:]] == ["skipped"] * 4
    assert secret.protected.read_text(encoding="utf-8").startswith("root:$6$")
    assert oct(secret.protected.stat().st_mode & 0o777) == oct(0o640)
    assert written_outside(before, tree_state(tops, allowed)) == []
    assert not (queued_project.workdir).exists(), "nothing was cloned"


def test_a_series_linked_out_of_the_project_is_named_in_the_queue_error(
    queued_project: Project, capsys: pytest.CaptureFixture[str], secret: Secret
) -> None:
    """The whole message, in-process (``invoke prepare`` takes this path)."""
    series = queued_project.patches / "model_support" / "series"
    link(series, secret.protected)
    ran = call(capsys, prepare_main, queued_project)
    assert ran.code == QueueError.exit_code
    report = ran.report
    assert report["what"] == f"the patch queue in {queued_project.patches} is invalid (1 problem)"
    assert report["details"] == (
        f"[model_support] model_support/series: refused, not read: it is a symbolic link to {secret.protected}, "
        f"outside the project ({queued_project.root})\n"
        "    fix: make it a regular file in model_support/ (the queue reads no file from outside the project)"
    )
    assert report["next"] == "fix the files named above, then re-run `invoke prepare`"
    secret.assert_not_in(ran.shown())


def test_a_link_inside_the_project_to_a_regular_file_is_still_read(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link that stays in the project is fine (a lane folder or a pin kept elsewhere in it)."""
    pin = queued_project.root / "queue" / "upstream.txt"
    kept = queued_project.root / "pins" / "upstream.txt"
    kept.parent.mkdir()
    pin.rename(kept)
    pin.symlink_to(Path("..") / "pins" / "upstream.txt")
    ran = call(capsys, status_main, queued_project)
    assert ran.code == 0, ran.err
    assert ran.report["pin"] == queued_project.upstream.commits[1]


def test_a_pin_variable_naming_proc_environ_is_refused_before_anything(
    queued_project: Project, tmp_path: Path, secret: Secret
) -> None:
    """Not a link at all: ``LLAMA_PIN_FILE=/proc/self/environ`` reports size 0 and holds the environment."""
    tops, allowed = watched(queued_project, tmp_path)
    shutil.copy(REPO_ROOT / "tasks.py", queued_project.root / "tasks.py")
    before = tree_state(tops, allowed)
    ran = invoke(queued_project, secret, "prepare", "--json", env={"LLAMA_PIN_FILE": "/proc/self/environ"})
    assert ran.code == SettingsError.exit_code, ran.err
    report = ran.report
    assert report["error"] == "SettingsError"
    real = os.path.realpath("/proc/self/environ")
    assert report["what"].startswith("LLAMA_PIN_FILE=/proc/self/environ: refused as the pin file: it is ")
    assert f"outside the project ({queued_project.root})" in report["what"]
    assert "/proc/" in report["what"] and real != "/proc/self/environ"
    assert report["untouched"] == "everything: nothing was read or written"
    assert report["next"].startswith("unset LLAMA_PIN_FILE, or set pin_file under [tool.skippy]")
    secret.assert_not_in(ran.shown())
    assert written_outside(before, tree_state(tops, allowed)) == []


# --- item 3: a file: archive outside the project ------------------------------------------------


def archive_settings(project: Project, url: str, digest: str) -> str:
    pin = project.upstream.commits[1]
    missing = (project.root / "missing.git").as_uri()  # no upstream: the archive must stand in
    extra = f'\n[tool.skippy.archives."{pin}"]\nurl = "{url}"\nsha256 = "{digest}"\nfolder = "{FOLDER}"\n'
    (project.root / "pyproject.toml").write_text(pyproject(missing, extra), encoding="utf-8")
    return pin


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["protected", "link in the project", *(["/etc/shadow"] if SHADOW.exists() else [])])
def test_a_file_archive_outside_the_project_is_refused_and_never_copied(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str], secret: Secret, target: str
) -> None:
    if target == "link in the project":
        (queued_project.root / "archives").mkdir()
        (queued_project.root / "archives" / "llama.tar.gz").symlink_to(secret.protected)
        url = "file:archives/llama.tar.gz"
    else:
        url = (secret.protected if target == "protected" else SHADOW).as_uri()
    pin = archive_settings(queued_project, url, "0" * 64)  # a wrong sha256, as in the report
    tops, allowed = watched(queued_project, tmp_path)
    before = tree_state(tops, allowed)
    for options in ({"offline": True}, {}):
        ran = call(capsys, prepare_main, queued_project, **options)
        assert ran.code == SettingsError.exit_code, ran.err
        report = ran.report
        assert report["ok"] is False and report["error"] == "SettingsError"
        assert report["what"].startswith(f"pyproject.toml [tool.skippy.archives.\"{pin}\"] url = '{url}': refused: ")
        cache = queued_project.root / ".deps" / "cache"
        assert report["what"].endswith(
            f"is outside the project ({queued_project.root}) and the cache ({cache}); "
            "a file: archive is read only from inside them"
        )
        assert report["untouched"] == "everything: nothing was fetched, copied or written"
        assert report["next"].endswith("(or use its https:// URL), then re-run `invoke prepare --pinned`")
        secret.assert_not_in(ran.shown())
    cache = queued_project.root / ".deps" / "cache"
    assert not (cache / "archives").exists(), "nothing was fetched, nothing quarantined"
    copies = [p for p in cache.rglob("*") if p.is_file() and secret.value.encode() in p.read_bytes()]
    assert copies == []
    assert written_outside(before, tree_state(tops, allowed)) == []


@pytest.mark.timeout(300)
def test_a_quarantined_archive_is_readable_by_its_owner_only(
    queued_project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = archive_of(queued_project, queued_project.upstream.commits[1])
    archive.chmod(0o644)
    url = "file:" + archive.relative_to(queued_project.root).as_posix()
    archive_settings(queued_project, url, "0" * 64)
    ran = call(capsys, prepare_main, queued_project, offline=True)
    assert ran.code == ArchiveError.exit_code, ran.err
    report = ran.report
    assert report["error"] == "ArchiveError" and report["what"] == f"archive {url} does not match its sha256"
    quarantine = queued_project.root / ".deps" / "cache" / "archives" / "quarantine"
    kept = [quarantine / f"{sha256_of(archive)}-{archive.name}"]
    assert sorted(quarantine.iterdir()) == kept
    assert oct(quarantine.stat().st_mode & 0o777) == oct(0o700)
    assert oct(kept[0].stat().st_mode & 0o777) == oct(0o600)
    assert f"the download was moved to {kept[0]}" in report["details"]


# --- item 6: workdirs that must not be, link loops ------------------------------------------------


@pytest.mark.parametrize("inside", ["the patch dir", "the project's .git"])
def test_a_workdir_inside_the_queue_or_git_is_refused_before_anything(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str], inside: str
) -> None:
    root = queued_project.root
    git(root, "init", "-q", env=hermetic_git_env(Path(os.environ["HOME"])))
    folder = queued_project.patches if inside == "the patch dir" else root / ".git"
    workdir = folder / "llama.cpp"
    tops, _allowed = watched(queued_project, tmp_path)
    before = tree_state(tops, ())
    harm = {
        "the patch dir": "a clone there would put all of llama.cpp into the queue",
        "the project's .git": "a clone there would write into the project's own git data",
    }[inside]
    for main, options in ((prepare_main, {}), (prepare_main, {"latest": True}), (status_main, {})):
        ran = call(capsys, main, queued_project, env={"LLAMA_WORKDIR": str(workdir)}, **options)
        assert ran.code == SettingsError.exit_code, ran.err
        report = ran.report
        assert report["error"] == "SettingsError"
        assert report["what"] == (
            f"LLAMA_WORKDIR={workdir}: refused as the workdir: it is inside {inside} ({folder}), and {harm}"
        )
        assert report["untouched"] == "everything: nothing was locked, read or written"
        assert report["next"] == (
            f"unset LLAMA_WORKDIR, or give it a directory of its own: LLAMA_WORKDIR={root}/.deps/llama.cpp "
            "invoke status"
        )
        assert f"error: {report['what']}" in ran.err
    assert written_outside(before, tree_state(tops, ())) == [], "no lock, no clone, nothing"


@pytest.mark.parametrize("variable", ["LLAMA_WORKDIR", "LLAMA_PATCH_DIR", "LLAMA_PIN_FILE"])
@pytest.mark.parametrize("shape", ["self", "pair", "under"])
def test_a_link_loop_in_a_path_variable_is_a_clear_error(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str], variable: str, shape: str
) -> None:
    loops = tmp_path / "loops"
    loops.mkdir()
    (loops / "a").symlink_to("b" if shape == "pair" else "a")
    if shape == "pair":
        (loops / "b").symlink_to("a")
    value = str(loops / "a" / "child" if shape == "under" else loops / "a")
    label = {"LLAMA_WORKDIR": "the workdir", "LLAMA_PATCH_DIR": "the patch dir", "LLAMA_PIN_FILE": "the pin file"}
    tops, _allowed = watched(queued_project, tmp_path)
    before = tree_state(tops, ())
    for main in (status_main, prepare_main, check_main):
        ran = call(capsys, main, queued_project, env={variable: value})
        assert ran.code == SettingsError.exit_code, ran.err
        report = ran.report
        assert report["ok"] is False and report["error"] == "SettingsError"
        assert report["what"] == (
            f"{variable}={value}: refused as {label[variable]}: it is a symbolic link loop "
            f"({value} never resolves: its links lead back to themselves)"
        )
        assert report["untouched"] == "everything: nothing was locked, read or written"
        assert (
            report["next"]
            == f"unset {variable}, or point it at a path whose links resolve, then re-run `invoke status`"
        )
        assert "Traceback" not in ran.err and "unexpected" not in ran.err
    assert written_outside(before, tree_state(tops, ())) == []


def test_a_patch_dir_outside_the_project_is_refused(
    queued_project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(queued_project.patches, elsewhere)
    ran = call(capsys, status_main, queued_project, env={"LLAMA_PATCH_DIR": str(elsewhere)})
    assert ran.code == SettingsError.exit_code, ran.err
    assert ran.report["what"] == (
        f"LLAMA_PATCH_DIR={elsewhere}: refused as the patch dir: it is outside the project ({queued_project.root}): "
        "skippy reads the queue only from inside the project"
    )
    assert ran.report["next"] == (
        "unset LLAMA_PATCH_DIR, or point it at the queue's folder inside the project, then re-run `invoke status`"
    )


# --- item 9: a pin file with two lines -------------------------------------------------------------


@pytest.mark.parametrize("comment", [False, True], ids=["two-lines", "with-a-comment-between"])
def test_a_pin_file_with_two_lines_names_the_second(
    queued_project: Project, capsys: pytest.CaptureFixture[str], comment: bool
) -> None:
    first, second = queued_project.upstream.commits[1], queued_project.upstream.commits[2]
    pin = queued_project.root / "queue" / "upstream.txt"
    pin.write_text(f"{first}\n" + ("# the next pin\n" if comment else "") + f"{second}\n", encoding="utf-8")
    line = 3 if comment else 2
    what = (
        f"pin file queue/upstream.txt must hold one line, but it has more: line 1 holds the SHA and "
        f"line {line} holds '{second}' as well"
    )
    for main in (prepare_main, parity_main):
        ran = call(capsys, main, queued_project)
        assert ran.code == SettingsError.exit_code, ran.err
        report = ran.report
        assert report["error"] == "SettingsError"
        assert report["what"] == what
        assert report["next"] == (
            f"keep the one upstream SHA in queue/upstream.txt and remove line {line} (or make it a # comment)"
        )
        assert "must hold one full 40-hex commit SHA, found" not in ran.shown()
    # status reports it (and carries on: it is a report, not an action)
    ran = call(capsys, status_main, queued_project)
    assert ran.code == 0 and ran.report["queue"]["error"] == what and ran.report["pin"] is None


@pytest.mark.timeout(300)
def test_regenerate_never_reads_nor_writes_through_a_patch_linked_out_of_the_project(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str], secret: Secret
) -> None:
    """The range-diff's old side reads the queue's files before the queue is validated: a core
    patch linked to a protected file is never shown (it is left out of the old side), and the
    new lane replaces the link with a regular file (never written through)."""
    from skippy.cli.entries import regenerate_main
    from skippy.core.ui import Console
    from skippy.maintain.regenerate import regenerate
    from tests.integration.test_parity_fixtures import arch_upstream
    from tests.integration.test_regenerate import lanes_v1

    arch_upstream(project)
    lanes_v1(project)
    settings = project.settings()
    regenerate(settings, core_head="core", model_support_head="models", console=Console(quiet=True))
    first = sorted(project.patches.glob("0001-*.patch"))[0]
    wanted = first.read_bytes()
    link(first, secret.protected)
    ran = call(capsys, regenerate_main, project, core_head="core", model_support_head="models")
    assert ran.code == 0, ran.err
    assert ran.report["ok"] is True
    secret.assert_not_in(ran.shown())
    assert not first.is_symlink() and first.read_bytes() == wanted
    assert secret.protected.read_text(encoding="utf-8").startswith("root:$6$")
    assert oct(secret.protected.stat().st_mode & 0o777) == oct(0o640)
