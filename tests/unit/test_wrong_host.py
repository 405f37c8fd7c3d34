"""A backend this kind of host cannot build (Metal off macOS) is refused without telling the user
to install a toolchain that cannot exist here (issue 43, item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.compile.backends import parse_backend
from skippy.compile.toolchain import probe_toolchain
from skippy.core.errors import ToolchainMissing
from skippy.core.settings import Settings

DEBIAN = 'ID=debian\nVERSION_ID="12"\n'


def test_metal_on_linux_points_to_a_mac_not_to_an_install(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.skippy]\n", encoding="utf-8")
    settings = Settings.load(tmp_path, {"PATH": str(tmp_path)})
    with pytest.raises(ToolchainMissing) as info:
        probe_toolchain(parse_backend("metal"), settings, system="Linux", os_release=DEBIAN)
    error = info.value
    assert error.what.startswith("the metal backend needs macOS with Xcode command line tools (this host is Linux)")
    assert "install the toolchain" not in (error.next_step or "")
    assert "Debian/Ubuntu" not in (error.details or "")
    assert error.next_step == (
        "run `nox -s build-metal` on macOS (CI builds it on macos-15: .github/workflows/build.yml), "
        "or pass --skip-unavailable (SKIPPY_SKIP_UNAVAILABLE=1) to skip it on this host"
    )
    assert error.details == "its toolchain, on macOS: xcode-select --install"


def test_a_missing_tool_on_a_host_that_can_build_still_names_the_install(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.skippy]\n", encoding="utf-8")
    settings = Settings.load(tmp_path, {"PATH": str(tmp_path)})
    with pytest.raises(ToolchainMissing) as info:
        probe_toolchain(parse_backend("metal"), settings, system="Darwin", os_release="")
    assert "install the toolchain" in (info.value.next_step or "")
