"""SIGTERM is handled as Ctrl-C is (issue 46 item 7): `timeout N invoke ...`, a cancelled CI
job or `kill` used to end a command at once, exit 143 with no JSON at all, and leave the
command it was running (a build's compilers) running with parent pid 1.

Each test starts the real entry point in its own process, waits until a stand-in program it
runs is at work (a file it writes, never a fixed sleep), sends a real signal, and asserts the
exit code, the one JSON report, that the stand-in and the process it started in its group are
gone, and that nothing outside the command's own places was written.  SIGINT's disposition is
set for the child (a background job of a non-interactive shell starts with SIGINT ignored).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.command import INTERRUPTED
from skippy.core.errors import Interrupted, TerminatedError
from skippy.core.ui import Console
from skippy.queue.prepare import Target, prepare
from tests.busy import carrying, default_interrupts
from tests.conftest import Project
from tests.outside import tree_state, written_outside

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: the error, its exit code and the report's `what` for each signal
EXPECTED = {
    "TERM": (TerminatedError, "interrupted by SIGTERM"),
    "INT": (Interrupted, "interrupted"),
}
#: how long the stand-in's group may take to go once the command has exited (it is stopped
#: before the exit; this only covers the kernel finishing the kill on a busy machine)
GONE_WITHIN = 10.0
#: a SIGKILLed command cannot stop anything itself: the guards of skippy.core.proc do (see
#: tests/integration/test_no_orphans.py for the bound)
KILLED_WITHIN = 15.0

#: stands in for a program skippy runs: at work (``@WHEN@`` true) it starts a helper in its
#: own process group (as ninja starts compilers), says it is ready once the helper wrote its
#: first heartbeat into ``@BEAT@`` (relative: its cwd, a build dir), and works until stopped;
#: the helper writes a heartbeat for as long as it lives
STAND_IN = """#!@PYTHON@
import os, subprocess, sys, time
args = sys.argv[1:]
if @WHEN@:
    helper = (
        "import sys, time\\n"
        "while True:\\n"
        "    with open(sys.argv[1], 'a') as beat:\\n"
        "        beat.write(str(time.time()) + '\\\\n')\\n"
        "    time.sleep(0.05)\\n"
    )
    subprocess.Popen([sys.executable, "-c", helper, @BEAT@, @TOKEN@ + "-helper"])
    while not os.path.exists(@BEAT@):
        time.sleep(0.01)
    with open(@READY@ + ".tmp", "w") as ready:
        ready.write(str(os.getpid()))
    os.rename(@READY@ + ".tmp", @READY@)
    while True:
        time.sleep(1)
os.execv(@REAL@, [@REAL@, *args])
"""


def stand_in(bindir: Path, name: str, *, real: str, when: str, ready: Path, beat: Path, token: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / name
    text = STAND_IN
    for key, value in {
        "@PYTHON@": sys.executable,
        "@WHEN@": when,
        "@BEAT@": repr(str(beat)),
        "@TOKEN@": repr(token),
        "@READY@": repr(str(ready)),
        "@REAL@": repr(real),
    }.items():
        text = text.replace(key, value)
    script.write_text(text, encoding="utf-8")
    script.chmod(0o755)
    return script


def _ignore_sigint() -> None:
    default_interrupts()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupt(
    script: str,
    args: list[str],
    env: dict[str, str],
    ready: Path,
    sig: str,
    *,
    timeout: float = 120,
    background: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a process of its own, ``sig`` to it once ``ready`` exists.  SIGINT is
    at its default in the child, or ignored with ``background`` (how a background job of a
    non-interactive shell starts); ``sig`` may name several signals, sent in order."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if background else default_interrupts,  # noqa: PLW1509 - one signal disposition
    )
    try:
        deadline = time.monotonic() + timeout
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), child.communicate(timeout=30)
        for name in sig.split("+"):
            child.send_signal(getattr(signal, f"SIG{name}"))
        out, err = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def gone(token: str, seconds: float = GONE_WITHIN) -> bool:
    deadline = time.monotonic() + seconds
    while carrying(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not carrying(token)


def reported(result: subprocess.CompletedProcess[str], sig: str, untouched: str, rerun: str) -> dict[str, Any]:
    error, what = EXPECTED[sig]
    assert result.returncode == error.exit_code == 128 + getattr(signal, f"SIG{sig}"), result.stderr
    report = json.loads(result.stdout)
    assert report == {
        "ok": False,
        "error": error.__name__,
        "exit_code": error.exit_code,
        "what": what,
        "untouched": untouched,
        "next": f"rerun {rerun}",
        "details": None,
    }
    assert f"error: {what}\n" in result.stderr and "Traceback" not in result.stderr
    return dict(report)


#: the stand-in git's condition: a `git am` that applies (its --abort and friends go through)
GIT_AM = "'am' in args and not any(a in args for a in ('--abort', '--quit', '--skip', '--continue'))"


PREPARE = """
    import os, sys
    from pathlib import Path
    from skippy.cli.entries import prepare_main
    sys.exit(prepare_main(os.environ, root=Path(sys.argv[1]), json=True))
"""

CHECK = """
    import os, sys
    from pathlib import Path
    from skippy.cli.entries import check_main
    sys.exit(check_main(os.environ, root=Path(sys.argv[1]), json=True))
"""


def _project_env(project: Project, bindir: Path) -> dict[str, str]:
    env = {**os.environ, **project.env}
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _workdir_files(project: Project) -> dict[str, bytes]:
    out = {}
    for path in project.workdir.rglob("*"):
        if path.is_file() and ".git" not in path.relative_to(project.workdir).parts:
            out[str(path.relative_to(project.workdir))] = path.read_bytes()
    return out


#: command -> (its entry point, the report's untouched, its rerun)
COMMANDS = {
    "prepare": (PREPARE, INTERRUPTED, "invoke prepare"),
    "check": (CHECK, "the workdir and the queue: the audit reads temporary worktrees only", "invoke check"),
}


@pytest.mark.parametrize("sig", ["TERM", "INT"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_signal_while_git_am_runs_stops_it_and_reports(
    queued_project: Project, tmp_path: Path, sig: str, command: str
) -> None:
    """`invoke prepare --json` (a queue change to apply on the prepared workdir) and `invoke
    check --json`, stopped while `git am` applies: exit 143 for SIGTERM as 130 for Ctrl-C, one
    JSON report, git and what it started stopped, the workdir untouched, the temporary
    worktrees removed, and the next prepare applies the queue."""
    script, untouched, rerun = COMMANDS[command]
    project = queued_project
    prepare(project.settings(), Target.pinned(), console=Console(quiet=True))
    base = project.upstream.commits[1]
    gen = project.patch(base, "generated: family llama", {"src/generated/llama.inc": "// v2\n"})
    project.add_patch("generated", "0001-family-llama.patch", gen)
    token = f"skippy-signal-test-{os.getpid()}-{tmp_path.name}"
    ready, beat = tmp_path / "git.ready", tmp_path / "git.beat"
    bindir = tmp_path / "bin"
    stand_in(bindir, "git", real=shutil.which("git") or "git", when=GIT_AM, ready=ready, beat=beat, token=token)
    files = _workdir_files(project)
    allowed = [project.workdir / ".git", project.settings().cache_dir, tmp_path / "bin", ready, beat]
    before = tree_state([project.root, Path(project.env["HOME"])], allowed)

    result = interrupt(script, [str(project.root)], _project_env(project, bindir), ready, sig)

    reported(result, sig, untouched, rerun)
    assert gone(token), f"git am's group outlived the {command}: {carrying(token)}"
    assert _workdir_files(project) == files, "the workdir's files were not touched"
    aside = project.workdir / ".git" / "skippy" / "aside"
    assert not aside.exists() or list(aside.iterdir()) == [], "the temporary worktree was removed"
    assert written_outside(before, tree_state([project.root, Path(project.env["HOME"])], allowed)) == []
    # the next run applies the queue
    report = prepare(project.settings(), Target.pinned(), console=Console(quiet=True))
    assert report.action == "applied"
    assert (project.workdir / "src" / "generated" / "llama.inc").read_text() == "// v2\n"


def test_a_background_job_keeps_ignoring_ctrl_c_and_stops_on_sigterm(queued_project: Project, tmp_path: Path) -> None:
    """`nohup invoke prepare &` in a script: the job starts with SIGINT ignored, so that a
    Ctrl-C meant for the foreground command does not stop it half-way through `git am`.
    skippy keeps that (as Python does); SIGTERM, `kill`'s default, stops it cleanly.  The
    SIGINT is sent first: an ignored signal is dropped when sent, a handled one would have
    made the report "interrupted" (130)."""
    project = queued_project
    prepare(project.settings(), Target.pinned(), console=Console(quiet=True))
    gen = project.patch(project.upstream.commits[1], "generated: family llama", {"src/generated/llama.inc": "// v2\n"})
    project.add_patch("generated", "0001-family-llama.patch", gen)
    token = f"skippy-signal-test-{os.getpid()}-{tmp_path.name}"
    ready, beat = tmp_path / "git.ready", tmp_path / "git.beat"
    bindir = tmp_path / "bin"
    stand_in(bindir, "git", real=shutil.which("git") or "git", when=GIT_AM, ready=ready, beat=beat, token=token)
    env = _project_env(project, bindir)

    result = interrupt(PREPARE, [str(project.root)], env, ready, "INT+TERM", background=True)

    reported(result, "TERM", INTERRUPTED, "invoke prepare")
    assert gone(token)


PROBE = Path(__file__).parent / "cmake_probe"

#: the build entry point (`nox -s build-cpu -- --json`'s path) on the CMake probe tree: a real
#: configure and a real `cmake --build` (ninja), no prepare, no spot check
BUILD = """
    import os, sys
    from pathlib import Path
    from skippy.compile.builder import execute_plan
    from skippy.compile.cachestats import stop_cache_server
    from skippy.compile.plan import plan_build
    from skippy.compile.toolchain import inspect_tree, probe_toolchain
    from skippy.cli.entries import build_main
    from skippy.flows.build_session import SessionOutcome

    src, root = Path(sys.argv[1]), Path(sys.argv[2])
    plans = []

    def session(request, settings, console):
        plan = plan_build(
            request.build,
            settings,
            tree=inspect_tree(src),
            toolchain=probe_toolchain("cpu", settings),
            patched_sha="1" * 40,
        )
        plans.append(plan)
        return SessionOutcome(backend="cpu", build=execute_plan(plan, console))

    try:
        code, _ = build_main("cpu", os.environ, root=root, args=["--json", "--no-spot-check"], session_fn=session)
    finally:
        for plan in plans:
            stop_cache_server(plan)
    sys.exit(code)
"""


@pytest.mark.parametrize(
    ("sig", "cache"),
    [("TERM", "none"), ("INT", "none"), ("KILL", "none"), ("TERM", "sccache"), ("INT", "sccache")],
)
def test_a_signal_during_the_build_stops_every_compiler(tmp_path: Path, sig: str, cache: str) -> None:
    """`timeout N nox -s build-cpu`: the compilers ninja runs (stand-ins that write into the
    build dir until stopped) kept running with parent pid 1 once SIGTERM had ended skippy.
    ninja runs each job in a process group of its own, which only ninja can stop, and it was
    SIGKILLed by the death signal before it could.  Now SIGTERM (as Ctrl-C) stops ninja's group
    before the command exits, ninja stops its jobs, and the report says so (143, 130); a
    SIGKILLed skippy's ninja gets SIGTERM from the death signal and stops them too.  With sccache
    (the default launcher where it is installed) the compiles run in its server, a daemon outside
    every group of ours: those still working in the build dir are stopped too."""
    src = tmp_path / "src"
    shutil.copytree(PROBE, src)
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n\n[tool.skippy]\n', encoding="utf-8")
    home = tmp_path / "home"
    token = f"skippy-signal-test-{os.getpid()}-{tmp_path.name}"
    ready = tmp_path / "compiler.ready"
    bindir = tmp_path / "compilers"
    # the real compilers for CMake's checks; for the probe's own sources, a compiler that works on
    # (its helper writes a heartbeat into the build dir, its cwd) until it is stopped
    compiles_source = f"any(a.startswith({str(src) + os.sep!r}) and a.endswith(('.c', '.cpp')) for a in args)"
    cc, cxx = (
        stand_in(bindir, name, real=_real(name), when=compiles_source, ready=ready, beat=Path("heartbeat"), token=token)
        for name in ("cc", "c++")
    )
    env = {
        # the venv's bin first: sccache comes from the package index
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        "HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "CC": str(cc),
        "CXX": str(cxx),
        "SKIPPY_COMPILER_CACHE": cache,
    }
    # the stand-ins (two compile at once) and what they write
    allowed = [root / ".deps", src, home, ready, ready.with_name(ready.name + ".tmp"), bindir]
    before = tree_state([tmp_path], allowed)

    result = interrupt(BUILD, [str(src), str(root)], env, ready, sig, timeout=300)

    if sig == "KILL":
        assert (result.returncode, result.stdout) == (-signal.SIGKILL, ""), "nothing can report a SIGKILL"
        assert gone(token, KILLED_WITHIN), f"compilers outlived the SIGKILLed build: {carrying(token)}"
    else:
        kept = "the source tree; the build dir is kept (the next run reconfigures or resumes it)"
        reported(result, sig, kept, "nox -s build-cpu")
        assert gone(token), f"compilers outlived the build: {carrying(token)}"
    stopped = tree_state([root / ".deps"], [])
    assert [p for p in stopped if p.endswith("heartbeat")], "the stand-in compiler was at work in the build dir"
    assert written_outside(before, tree_state([tmp_path], allowed)) == []


def _real(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"no {name}: install g++")
    return str(Path(found).resolve())
