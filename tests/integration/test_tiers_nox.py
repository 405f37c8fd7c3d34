"""The real `nox -s tests -- ARGS` runs the fast tiers in one process per core (tests/tiers.py
plans it; this checks that the noxfile runs that plan)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from skippy.core import proc

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def nox_tests(*args: str) -> proc.Result:
    # the venv first, as after the README's set-up line; no pytest/xdist state of this run leaks in
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", os.defpath)])
    return proc.run([str(BIN / "nox"), "-s", "tests", "--", *args], env=env, cwd=ROOT, check=False, timeout=300)


def test_arguments_keep_the_workers() -> None:
    ran = nox_tests("tests/unit/test_mail.py", "-k", "lane")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-3000:]
    assert "nox > pytest tests/unit/test_mail.py -k lane -m 'not e2e' --numprocesses auto" in out
    assert re.search(r"created: \d+/\d+ workers?", out), out[-3000:]
    assert "-m e2e" not in out  # every path given is outside tests/e2e: no e2e run


def test_the_users_own_layout_wins() -> None:
    ran = nox_tests("tests/unit/test_mail.py", "-k", "lane", "-p", "no:xdist")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-3000:]
    assert "nox > pytest tests/unit/test_mail.py -k lane -p no:xdist\n" in out
    assert "created:" not in out
