"""The root-only tests as a hosted runner runs them: a plain user with passwordless sudo runs the
tier through `.ci/as-root` (as ci.yml's test jobs do), and a test that needs root (it mounts a
small tmpfs) passes; run by the same user without it, the same test cannot run, and with CI set
it fails rather than skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.needs import cannot_run

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
USER = "skippy-runner"
ROOT_ONLY = "tests/integration/test_disk_full_fs.py::test_a_checkout_that_fills_the_disk_names_the_file_system"


@pytest.fixture
def runner_user(tmp_path: Path) -> Iterator[str]:
    """A plain user (not root) with passwordless sudo, as GitHub's hosted runners have; removed after."""
    if os.geteuid() != 0:
        cannot_run("making a user with passwordless sudo needs root")
    for tool in ("sudo", "useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            cannot_run(f"{tool} is not installed (.ci/packages.txt)")
    subprocess.run(["userdel", "--remove", USER], capture_output=True, check=False)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True, capture_output=True)
    sudoers = Path("/etc/sudoers.d") / USER
    sudoers.write_text(f"{USER} ALL=(ALL) NOPASSWD: ALL\n", encoding="utf-8")
    sudoers.chmod(0o440)
    try:
        yield USER
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", "--remove", USER], capture_output=True, check=False)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    site = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "PYTHONPATH": os.pathsep.join([str(REPO), *site]),
        "HOME": f"/home/{user}",
        "CI": "true",
    }
    command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=600)


def test_a_root_only_test_passes_as_a_plain_user_through_as_root(runner_user: str) -> None:
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", ROOT_ONLY]
    through = as_user(runner_user, ".ci/as-root", *pytest_argv)
    assert through.returncode == 0, through.stdout[-3000:] + through.stderr[-3000:]
    assert "1 passed" in through.stdout and "skipped" not in through.stdout
    plain = as_user(runner_user, *pytest_argv)
    assert plain.returncode != 0, "without root the test cannot mount its tmpfs"
    assert "cannot run on CI" in plain.stdout and "mounting a tmpfs needs root" in plain.stdout, plain.stdout[-3000:]
