"""The nox menu itself: a backend this host cannot build fails with the reason,
or shows as *skipped* when asked; never as passed."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest

from skippy.core import proc

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def nox(*args: str, **env: str) -> proc.Result:
    merged = {k: v for k, v in os.environ.items() if k != "SKIPPY_SKIP_UNAVAILABLE"}
    merged.update(env)
    return proc.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
        env=merged,
        cwd=ROOT,
        check=False,
        timeout=300,
    )


@pytest.fixture(autouse=True)
def _not_on_macos() -> None:
    if platform.system() == "Darwin":
        pytest.skip("Metal is available on macOS: these tests need a host that cannot build it")


def test_build_metal_fails_with_the_reason() -> None:
    result = nox("-s", "build-metal")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "needs macOS with Xcode command line tools" in text
    assert "xcode-select --install" in text
    assert "was successful" not in text


def test_build_metal_is_skipped_on_request() -> None:
    for args, env in ((("--", "--skip-unavailable"), {}), ((), {"SKIPPY_SKIP_UNAVAILABLE": "1"})):
        result = nox("-s", "build-metal", *args, **env)
        text = result.stdout + result.stderr
        assert result.returncode == 0, text
        assert "Session build-metal skipped" in text
        assert "needs macOS" in text
        assert "was successful" not in text


def test_sessions_are_listed_with_tags() -> None:
    result = nox("-l")
    for backend in ("cpu", "metal", "cuda", "vulkan", "rocm"):
        assert f"build-{backend} [build" in result.stdout
    assert "build-cuda [build,gpu]" in result.stdout
