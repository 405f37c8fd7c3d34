"""A flag the user gave is blamed by name, never the patch (issue 46, items 8 and 9): each case runs
`nox` or `invoke` as a real subprocess in a project of its own, as users call them, and asserts the
message, the `next:` step, the exit code, the JSON report, and that nothing was written where the
refusal says nothing was touched.

The stand-in llama-server (tests/integration/fake_server) refuses an argument it does not know the
way llama.cpp's parser does (`error: invalid argument: X`, exit code 1)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.entries import session_options
from skippy.cli.options import PinBumpOptions, make
from skippy.compile.request import DEFINE_ARG
from skippy.core.errors import ModelCheckFailed, QueueError, SettingsError, ToolchainMissing
from skippy.queue.patchpaths import paths_outside_the_tree
from skippy.spot.server import free_port
from tests.conftest import Project
from tests.integration.test_spotcheck import FAST, Rig
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: the subprocess bound: far below the spot check's default load timeout (300 s)
BOUND = 120


def _menus(root: Path) -> None:
    """The project's own noxfile and tasks.py: the menus users run, copied from this checkout."""
    for name in ("noxfile.py", "tasks.py"):
        shutil.copy(ROOT / name, root / name)


def _env(home: Path, **extra: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    # no __pycache__ beside the menus: every file a run writes is one the product wrote
    return {"PATH": os.pathsep.join([bin_dir, os.defpath]), "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", **extra}


def _run(tool: str, root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``nox -s ...`` (this project's noxfile) or ``invoke ...`` (its tasks.py), in the project."""
    argv = [sys.executable, "-m", tool]
    argv += ["-f", str(root / "noxfile.py")] if tool == "nox" else ["--search-root", str(root)]
    return subprocess.run([*argv, *args], cwd=root, env=env, capture_output=True, text=True, timeout=BOUND, check=False)


def _report(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    report = json.loads(result.stdout)  # one document on stdout, nothing else
    assert isinstance(report, dict)
    return report


def _spot_rig(tmp_path: Path, *, fast: bool = True) -> Rig:
    """A project with a stand-in llama-server build and a model; ``fast``: short timeouts (without
    them a server that never answers would be waited for the default 300 s)."""
    rig = Rig(tmp_path / "proj")
    table = "\n".join(f"{k} = {v}" for k, v in FAST.items()) if fast else ""
    (rig.root / "pyproject.toml").write_text(
        f'[project]\nname = "x"\nversion = "0"\n\n[tool.skippy]\nbuild_root = "build"\ncache_dir = "cache"\n\n'
        f"[tool.skippy.spot_check]\n{table}\n",
        encoding="utf-8",
    )
    _menus(rig.root)
    return rig


def _spot_args(rig: Rig, *extra: str) -> list[str]:
    return ["--server", str(rig.server), "--model", str(rig.model), "--no-provenance", "--no-rpc", "--json", *extra]


# --- item 8: --server-arg ------------------------------------------------------------


@pytest.mark.parametrize("given", ["--bogus-flag", "--bogus_flag"])
def test_an_argument_llama_server_refuses_names_the_server_arg_not_the_patch(
    tmp_path: Path, hermetic_seal: Path, given: str
) -> None:
    rig = _spot_rig(tmp_path)
    env = _env(hermetic_seal, **rig.env())
    allowed = (rig.root / "build" / "cpu-0123abcd" / "spot-check", rig.state)
    before = tree_state([tmp_path], allowed)

    result = _run("nox", rig.root, env, "-s", "spot-check", "--", *_spot_args(rig, f"--server-arg={given}"))

    assert result.returncode == ModelCheckFailed.exit_code, result.stderr
    report = _report(result)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "ModelCheckFailed", 20)
    assert report["next"] == (
        f"rerun without `--server-arg {given}` or with it corrected: llama-server does not take it as given "
        "(`build/cpu-0123abcd/bin/llama-server --help` lists the arguments it takes)"
    )
    assert "patch" not in str(report["next"]) and "compile" not in str(report["next"])
    (model,) = report["report"]["results"]
    assert model["refused_argument"] == "--bogus-flag"
    assert model["reason"] == (
        "llama-server refused its argument --bogus-flag and exited before it was ready "
        "(error: invalid argument: --bogus-flag)"
    )
    assert "error: invalid argument: --bogus-flag" in result.stderr
    assert f"next: rerun without `--server-arg {given}`" in result.stderr
    assert written_outside(before, tree_state([tmp_path], allowed)) == []


@pytest.mark.parametrize(
    "case",
    [
        ("--port", "--port", "rerun without `--server-arg --port` and its value: the check picks a free port itself"),
        ("--host", "--host", "rerun without `--server-arg --host` and its value: the check picks a free port itself"),
        (
            "-m",
            "-m",
            "rerun with --model MODEL (a .gguf path, tiny:<family> or Org/Repo[:quant]) instead of `--server-arg -m`",
        ),
        (
            "--ctx_size=512",
            "--ctx-size",
            "set ctx_size under [tool.skippy.spot_check] in pyproject.toml and rerun without "
            "`--server-arg --ctx_size=512`",
        ),
        ("--rpc", "--rpc", "rerun without `--server-arg --rpc` and its value (--no-rpc skips the RPC path)"),
        ("-lv", "-lv", "rerun without `--server-arg -lv` (and its value)"),
    ],
)
@pytest.mark.parametrize("tool", ["nox", "invoke"])
def test_a_server_arg_the_check_sets_itself_is_refused_before_anything_starts(
    tmp_path: Path, hermetic_seal: Path, tool: str, case: tuple[str, str, str]
) -> None:
    """`--server-arg --port <free port>` used to start the server on that port while the check
    polled its own, for the whole 300 s load timeout, then blamed the patch."""
    given, flag, next_step = case
    rig = _spot_rig(tmp_path, fast=False)  # the default load timeout: the refusal must not wait for it
    env = _env(hermetic_seal, **rig.env())
    before = tree_state([tmp_path], ())
    args = _spot_args(rig, f"--server-arg={given}", f"--server-arg={free_port()}")

    if tool == "nox":
        result = _run("nox", rig.root, env, "-s", "spot-check", "--", *args)
    else:
        result = _run("invoke", rig.root, env, "spot-check", *args)

    assert result.returncode == SettingsError.exit_code, result.stderr
    report = _report(result)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "SettingsError", 2)
    prog = "nox -s spot-check" if tool == "nox" else "invoke spot-check"
    assert str(report["what"]).startswith(f"{prog}: --server-arg: {given}: the spot check sets {flag} itself (")
    assert report["next"] == next_step
    assert report["untouched"] == "everything: nothing was started"
    assert not rig.state.exists(), "no server may start"
    assert written_outside(before, tree_state([tmp_path], ())) == []


def test_a_server_arg_value_that_starts_with_a_dash_is_shown_how_to_attach_it(
    tmp_path: Path, hermetic_seal: Path
) -> None:
    """`nox -s spot-check -- --server-arg --threads 2`: argparse takes --threads for an option."""
    rig = _spot_rig(tmp_path)
    env = _env(hermetic_seal, **rig.env())
    result = _run("nox", rig.root, env, "-s", "spot-check", "--", *_spot_args(rig, "--server-arg", "--threads", "2"))
    assert result.returncode == SettingsError.exit_code, result.stderr
    report = _report(result)
    assert report["what"] == "nox -s spot-check --: argument --server-arg: expected one argument"
    assert report["next"] == (
        "give --server-arg its value; one that starts with - is attached with =: --server-arg=VALUE "
        "(nox -s spot-check -- --help)"
    )
    assert not rig.state.exists()
    # written so, it reaches the server, after the check's own arguments
    attached = _spot_args(rig, "--server-arg=--threads", "--server-arg=2")
    fixed = _run("nox", rig.root, env, "-s", "spot-check", "--", *attached)
    assert fixed.returncode == 0, fixed.stderr
    assert rig.argv()[-2:] == ["--threads", "2"]


# --- item 8: --server, --model ----------------------------------------------------------


@pytest.mark.parametrize("tool", ["nox", "invoke"])
def test_a_server_that_is_a_directory_or_not_executable_is_refused_by_name(
    tmp_path: Path, hermetic_seal: Path, tool: str
) -> None:
    """`--server /tmp` crashed with exit code 70 (sh.CommandNotFound)."""
    rig = _spot_rig(tmp_path)
    env = _env(hermetic_seal, **rig.env())
    plain = rig.root / "llama-server.txt"
    plain.write_text("not a program\n", encoding="utf-8")
    cases = {
        rig.root / "build": "is a directory, not a llama-server binary",
        plain: "is not executable",
        rig.root / "nowhere" / "llama-server": "does not exist",
    }
    before = tree_state([tmp_path], ())
    for server, why in cases.items():
        args = ["--server", str(server), "--model", str(rig.model), "--no-provenance", "--json"]
        if tool == "nox":
            result = _run("nox", rig.root, env, "-s", "spot-check", "--", *args)
        else:
            result = _run("invoke", rig.root, env, "spot-check", *args)
        assert result.returncode == SettingsError.exit_code, result.stderr
        report = _report(result)
        assert (report["ok"], report["error"]) == (False, "SettingsError")
        assert report["what"] == f"--server {server} {why}"
        assert report["next"] == (
            "rerun with --server naming a llama-server binary (build/<backend>-<digest>/bin/llama-server), "
            "or without --server to check the newest build: nox -s spot-check"
        )
        assert "Traceback" not in result.stderr and "CommandNotFound" not in result.stderr
    assert not rig.state.exists(), "no server may start"
    assert written_outside(before, tree_state([tmp_path], ())) == []


def _bad_models(tmp_path: Path) -> dict[Path, str]:
    folder = tmp_path / "models"
    folder.mkdir()
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n", encoding="utf-8")
    return {
        folder: "is a directory: llama-server needs a regular GGUF file (a device or FIFO would never end, "
        "a directory or a broken link has nothing to load)",
        text: "is not a GGUF file (it does not start with the GGUF magic: b'not ')",
        tmp_path / "gone.gguf": "does not exist",
    }


@pytest.mark.parametrize("tool", ["nox", "invoke"])
def test_a_model_that_is_not_a_gguf_file_is_refused_before_the_build(
    project: Project, tmp_path: Path, tool: str
) -> None:
    """`--model <directory>` was found wrong only after the whole build."""
    _menus(project.root)
    env = _env(Path(project.env["HOME"]))
    models = _bad_models(tmp_path)
    before = tree_state([tmp_path], ())
    for model, why in models.items():
        if tool == "nox":
            result = _run("nox", project.root, env, "-s", "build-cpu", "--", "--model", str(model), "--json")
        else:
            result = _run("invoke", project.root, env, "build", "--model", str(model), "--json")
        assert result.returncode == SettingsError.exit_code, result.stderr
        report = _report(result)
        assert (report["ok"], report["error"]) == (False, "SettingsError")
        assert report["what"] == f"--model {model} {why}"
        assert report["untouched"] == "everything: nothing was prepared or built"
        assert report["next"] == (
            "rerun with --model naming a .gguf file (or without --model: the spot check's default, gemma3-270m): "
            "nox -s build-cpu"
        )
        assert "probe the cpu toolchain" not in result.stderr
    assert not project.workdir.exists() and not (project.root / "build").exists()
    assert written_outside(before, tree_state([tmp_path], ())) == []


def test_a_spot_check_model_that_is_not_a_gguf_file_is_named_before_a_server_starts(
    tmp_path: Path, hermetic_seal: Path
) -> None:
    """The spot check resolves each model before it starts a server for it: a file without the GGUF
    magic is named there (it used to reach llama-server, whose load failure blamed the patch)."""
    rig = _spot_rig(tmp_path)
    env = _env(hermetic_seal, **rig.env())
    text = rig.root / "notes.gguf"
    text.write_text("not a model\n", encoding="utf-8")
    args = ["--server", str(rig.server), "--model", str(text), "--no-provenance", "--no-rpc", "--json"]
    result = _run("nox", rig.root, env, "-s", "spot-check", "--", *args)
    assert result.returncode == ModelCheckFailed.exit_code, result.stderr
    report = _report(result)
    assert report["next"] == "pass an existing .gguf file, or --model gemma3-270m"
    (model,) = report["report"]["results"]
    assert str(model["reason"]).startswith(
        f"model file {text} is not a GGUF file (it does not start with the GGUF magic: b'not ')"
    )
    assert not rig.state.exists(), "no server may start"


# --- item 8: -D ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        (
            "-DCMAKE_BUILD_TYPE=Debug;-DX=1",
            "-DCMAKE_BUILD_TYPE=Debug;-DX=1 smuggles -DX=1 into the value of CMAKE_BUILD_TYPE after a `;` (a `;` "
            "separates the items of one CMake list value; each define is a -D of its own)",
            "rerun with each define as a -D of its own: -DCMAKE_BUILD_TYPE=Debug -DX=1",
            ["-DCMAKE_BUILD_TYPE=Debug", "-DX=1"],
        ),
        (
            "-DGGML_NATIVE:bool=OFF",
            "-DGGML_NATIVE:bool=OFF: bool is not a CMake cache type (BOOL, FILEPATH, PATH, STRING, INTERNAL, "
            "UNINITIALIZED); CMake would take it for STRING",
            "rerun with -DGGML_NATIVE:BOOL=OFF",
            ["-DGGML_NATIVE:BOOL=OFF"],
        ),
        (
            "-DGGML_NATIVE",
            "-DGGML_NATIVE is not a CMake define: it wants -DNAME=VALUE or -DNAME:TYPE=VALUE",
            "rerun with -DGGML_NATIVE=<value>",
            ["-DGGML_NATIVE=OFF"],
        ),
    ],
)
@pytest.mark.parametrize("tool", ["nox", "invoke"])
def test_a_define_cmake_would_misread_is_refused_at_option_parsing(
    project: Project, tmp_path: Path, tool: str, case: tuple[str, str, str, list[str]]
) -> None:
    """`-DCMAKE_BUILD_TYPE=Debug;-DX=1` reached CMake as one value and ended with "fix the compile error"."""
    given, what, next_step, fixed = case
    _menus(project.root)
    env = _env(Path(project.env["HOME"]))
    before = tree_state([tmp_path], ())

    if tool == "nox":
        result = _run("nox", project.root, env, "-s", "build-cpu", "--", given, "--json")
    else:
        result = _run("invoke", project.root, env, "build", given, "--json")

    assert result.returncode == SettingsError.exit_code, result.stderr
    report = _report(result)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "SettingsError", 2)
    prog = "nox -s build-cpu" if tool == "nox" else "invoke build"
    assert report["what"] == f"{prog}: -D/--define: {what}"
    assert report["next"] == next_step
    assert "probe the cpu toolchain" not in result.stderr
    assert not project.workdir.exists() and not (project.root / "build").exists()
    assert written_outside(before, tree_state([tmp_path], ())) == []
    # what the next step says parses: the defines as given there
    assert session_options(fixed, project.env).define == tuple(_pair(arg) for arg in fixed)


def _pair(arg: str) -> tuple[str, str]:
    """``-DNAME[:TYPE]=VALUE`` as the option table's converter parses it."""
    match = DEFINE_ARG.match(arg)
    assert match is not None, arg
    return match.group(1), match.group(2)


def test_a_list_value_keeps_its_semicolons() -> None:
    defines = ("-DCMAKE_CUDA_ARCHITECTURES=86;89", "-DAMDGPU_TARGETS=gfx1100;gfx1030")
    assert session_options(list(defines), {}).define == (
        ("CMAKE_CUDA_ARCHITECTURES", "86;89"),
        ("AMDGPU_TARGETS", "gfx1100;gfx1030"),
    )


# --- item 9: nox's exit codes, pin-bump --sha ------------------------------------------------


def _nox_here(*args: str) -> subprocess.CompletedProcess[str]:
    """nox on this checkout's noxfile: each case fails before any work (nothing probed or built)."""
    env = {k: v for k, v in os.environ.items() if k != "SKIPPY_SKIP_UNAVAILABLE"}
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
        cwd=ROOT,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )


def test_a_session_run_alone_exits_with_the_documented_code(tmp_path: Path) -> None:
    """nox's session.error made every failure exit 1; docs/building.md documents 2 and 11."""
    refused = _nox_here("-s", "build-cpu", "--", "--bogus", "--json")
    assert refused.returncode == SettingsError.exit_code == 2, refused.stderr
    assert _report(refused)["exit_code"] == 2
    assert "Session build-cpu failed: exit code 2." in refused.stderr
    if platform.system() != "Darwin":
        missing = _nox_here("-s", "build-metal", "--", "--json")
        assert missing.returncode == ToolchainMissing.exit_code == 11, missing.stderr
        assert _report(missing)["error"] == "ToolchainMissing"
    # several sessions: nox's summary names each, and nox's own exit code stands
    both = _nox_here("-s", "build-cpu", "spot-check", "--", "--bogus")
    assert both.returncode == 1, both.stderr
    assert "build-cpu: aborted" in both.stderr and "spot-check: aborted" in both.stderr
    assert "(exit code 2)" in both.stderr
    # a report asked for (the CI jobs): nox writes it, and ends as nox ends
    report = tmp_path / "nox-report.json"
    reported = _nox_here("--report", str(report), "-s", "build-cpu", "--", "--bogus")
    assert reported.returncode == 1, reported.stderr
    assert "build-cpu failed (exit code 2)" in reported.stderr
    (session,) = json.loads(report.read_text(encoding="utf-8"))["sessions"]
    assert (session["name"], session["result"]) == ("build-cpu", "aborted")


def test_pin_bump_checks_its_sha_before_any_network_attempt(project: Project, tmp_path: Path) -> None:
    """`invoke pin-bump --sha nope` was refused only after 3 attempts at the upstream."""
    _menus(project.root)
    unreachable = (tmp_path / "no-upstream.git").as_uri()
    env = _env(Path(project.env["HOME"]), LLAMA_UPSTREAM_URL=unreachable)
    before = tree_state([tmp_path], ())

    result = _run("invoke", project.root, env, "pin-bump", "--sha", "nope", "--json")

    assert result.returncode == SettingsError.exit_code, result.stderr
    report = _report(result)
    assert (report["ok"], report["error"]) == (False, "SettingsError")
    assert report["what"] == "invoke pin-bump: --sha: 'nope' is not a commit SHA (7 to 40 hex digits)"
    assert report["next"] == (
        "pass an upstream commit SHA, e.g. `invoke pin-bump --sha 4df29be4f4c3` (or no --sha to move to upstream "
        "master)"
    )
    assert "attempt" not in result.stderr and "no-upstream.git" not in result.stderr
    assert not project.workdir.exists()
    assert written_outside(before, tree_state([tmp_path], ())) == []
    # a SHA, full or abbreviated, passes the option check
    for sha in ("4df29be4f4c3", "4DF29BE", project.upstream.commits[1]):
        assert make(PinBumpOptions, {"sha": sha}, {}).sha == sha


# --- item 8: a patch with a path outside the tree -------------------------------------------------


def _escaping_patch(project: Project) -> tuple[Path, str]:
    """A core patch whose diff names ../../src/llama-model.cpp: the patch itself is malformed."""
    base = project.upstream.commits[1]
    model = project.upstream.read("src/llama-model.cpp", base)
    data = project.patch(base, "core: reach out", {"src/llama-model.cpp": model.replace("line 9\n", "line 9\nOUT\n")})
    escaped = data.replace(b"a/src/llama-model.cpp", b"a/../../src/llama-model.cpp").replace(
        b"b/src/llama-model.cpp", b"b/../../src/llama-model.cpp"
    )
    return project.add_patch("core", "0003-core-reach-out.patch", escaped), "../../src/llama-model.cpp"


@pytest.mark.parametrize("command", [("triage",), ("prepare",), ("prepare", "--triage")])
def test_a_patch_path_outside_the_tree_is_the_patch_malformed_not_a_conflict(
    queued_project: Project, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """It was triaged as a conflict with the pin, to be "refreshed against the new upstream"."""
    project = queued_project
    _menus(project.root)
    patch, escaped = _escaping_patch(project)
    env = _env(Path(project.env["HOME"]))
    before = tree_state([tmp_path], ())

    result = _run("invoke", project.root, env, *command, "--json")

    assert result.returncode == QueueError.exit_code, result.stderr
    report = _report(result)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "QueueError", 3)
    assert report["what"] == f"the patch queue in {project.patches} is invalid (1 problem)"
    lineno = next(i for i, line in enumerate(patch.read_text().splitlines(), 1) if line.startswith("diff --git"))
    assert report["details"] == (
        f"[core] 0003-core-reach-out.patch:{lineno}: malformed: it names '{escaped}', a path outside the llama.cpp "
        "tree (a patch's paths are relative to the tree's root; git refuses this one on every upstream)\n"
        "    fix: fix this patch file: name the file inside the tree (diff --git a/<path> b/<path>), or re-export "
        "the change with `git format-patch` from a commit of the workdir"
    )
    assert report["next"] == "fix the files named above, then re-run `invoke prepare`"
    assert report["untouched"] == "the llama.cpp workdir and the queue: nothing was applied"
    for wrong in ("refresh", "conflict", "upstream commit"):
        assert wrong not in str(report["next"]) + result.stderr
    assert not project.workdir.exists()
    assert written_outside(before, tree_state([tmp_path], ())) == []
    # the next step works: the patch named inside the tree, the queue applies
    patch.write_bytes(patch.read_bytes().replace(b"/../../src/", b"/src/"))
    fixed = _run("invoke", project.root, env, *command, "--json")
    assert fixed.returncode == 0, fixed.stderr
    assert _report(fixed)["ok"] is True


def test_a_patch_path_outside_the_tree_is_found_in_every_header_line() -> None:
    """The diff's header lines, plain or C-quoted; never the message or the hunks' text."""
    text = (
        "Subject: [PATCH] move\n\n---\n ../../x | 1 +\n\n"
        "diff --git a/src/a.cpp b/src/a.cpp\n--- a/src/a.cpp\n+++ b/src/a.cpp\n@@ -1 +1 @@\n"
        "--- a/../../in-a-hunk\n"
        "diff --git a/src/b.cpp b/../b.cpp\nsimilarity index 90%\nrename from src/b.cpp\nrename to ../b.cpp\n"
        'diff --git "a/caf\\303\\251" "b//etc/caf\\303\\251"\n--- "a/caf\\303\\251"\n'
        '+++ "b//etc/caf\\303\\251"\n@@ -1 +1 @@\n'
        "diff --git a/new file.txt b/new file.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new file.txt\n"
    )
    assert paths_outside_the_tree(text) == [(11, "../b.cpp"), (15, "/etc/caf\\303\\251")]
