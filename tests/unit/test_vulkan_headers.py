"""The pure parts of taking newer Vulkan headers (and the ROCm root) from the system's
Debian mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.compile.backends.debian import debian_mirror, present_keyring, sources_line, system_mirror
from skippy.compile.backends.vulkan_headers import (
    HeaderPin,
    apt_options,
    parse_header_pin,
    resolve_headers_choice,
)
from skippy.core.errors import SettingsError

SECURITY_FIRST = """\
Site: http://security.example/debian-security
Origin: Debian
Label: Debian-Security
Component: main
Release: bookworm-security

Site: http://ports.example/other
Origin: Other
Label: Other
Component: main
Release: stable

Site: http://mirror.example/debian
Origin: Debian
Label: Debian
Component: main
Release: bookworm
"""


def test_the_mirror_is_the_debian_main_archive_not_security_nor_another_origin() -> None:
    assert debian_mirror(SECURITY_FIRST) == "http://mirror.example/debian"
    assert debian_mirror(SECURITY_FIRST.split("\n\n", maxsplit=1)[0]) is None
    assert debian_mirror("") is None


def test_pin_is_checked_and_named() -> None:
    pin = parse_header_pin({"suite": "trixie", "package": "libvulkan-dev", "version": "1.4.309.0-1"})
    assert pin == HeaderPin("trixie", "libvulkan-dev", "1.4.309.0-1")
    assert pin.dirname == "libvulkan-dev_1.4.309.0-1"
    with pytest.raises(SettingsError, match=r"vulkan_headers_debian\]: missing"):
        parse_header_pin(None)
    with pytest.raises(SettingsError, match="needs exactly suite, package and version"):
        parse_header_pin({"suite": "trixie", "package": "libvulkan-dev"})
    with pytest.raises(SettingsError, match=r"version '1\.4; rm' is not a Debian name or version"):
        parse_header_pin({"suite": "trixie", "package": "libvulkan-dev", "version": "1.4; rm"})


def test_choice_from_the_environment_then_the_table() -> None:
    assert resolve_headers_choice({}, {}) == "auto"
    assert resolve_headers_choice({"vulkan_headers": "system"}, {}) == "system"
    assert resolve_headers_choice({"vulkan_headers": "system"}, {"SKIPPY_VULKAN_HEADERS": "Debian"}) == "debian"
    with pytest.raises(SettingsError, match="unknown Vulkan headers choice"):
        resolve_headers_choice({"vulkan_headers": "latest"}, {})


def test_apt_is_confined_to_its_own_state(tmp_path: Path) -> None:
    options = apt_options(tmp_path)
    pairs = dict(o.split("=", 1) for o in options[1::2])
    assert all(flag == "-o" for flag in options[::2])
    for key in ("Dir::Etc::SourceList", "Dir::Etc::SourceParts", "Dir::State::Lists", "Dir::Cache::Archives"):
        assert Path(pairs[key]).is_relative_to(tmp_path), key
    assert pairs["Debug::NoLocking"] == "1"
    line = sources_line("http://mirror.example/debian", "trixie", Path("/k.gpg"))
    assert line == "deb [signed-by=/k.gpg] http://mirror.example/debian trixie main\n"
    assert sources_line("http://m/d", "trixie", None) == "deb http://m/d trixie main\n"


def test_no_apt_means_no_mirror_and_a_missing_keyring_is_none(tmp_path: Path) -> None:
    # no apt-get on PATH: no mirror (each caller then says what to do), not a crash
    assert system_mirror({"PATH": str(tmp_path)}) is None
    assert present_keyring(tmp_path / "absent.gpg") is None
    assert present_keyring(None) is None
    keyring = tmp_path / "k.gpg"
    keyring.write_bytes(b"")
    assert present_keyring(keyring) == keyring
