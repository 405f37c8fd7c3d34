"""Vulkan headers newer than the system's, from the system's own Debian mirror.

Current llama.cpp trees need Vulkan headers that define ``VK_EXT_layer_settings``
(``vk::LayerSettingEXT``); Debian 12's ``libvulkan-dev`` (1.3.239) does not, and
``ggml-vulkan.cpp`` fails to compile minutes into the build.  A newer Debian
release's ``libvulkan-dev`` has them.  :func:`fetch_headers` takes the package pinned
in ``[tool.skippy.build.vulkan_headers]`` (suite, package, version) from the mirror
the system's apt already uses, through a private sources list and private apt
state under the project cache (the system's sources, lists and packages are never
touched; apt checks the download against the suite's signed index), unpacks it
with ``dpkg-deb -x`` once, and hands back the include directory for
``-DVulkan_INCLUDE_DIR``.  The linker still uses the system's Vulkan loader: only
the headers are newer.

The headers are fetched once (:func:`skippy.compile.fetched.fetch_once`): a folder
without its marker (an interrupted run) is never used.  The pure parts (the pin, the choice, the apt options;
the mirror and the sources line in :mod:`skippy.compile.backends.debian`) are separate
functions for the unit tests.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from skippy.compile.backends.base import resolve_choice
from skippy.compile.backends.debian import DEBIAN_KEYRING, present_keyring, sources_line, system_mirror
from skippy.compile.fetched import fetch_once
from skippy.core import proc
from skippy.core.errors import CommandError, NetworkError, SettingsError, ToolchainMissing

#: ``[tool.skippy.build] vulkan_headers`` / ``SKIPPY_VULKAN_HEADERS`` values
HEADERS_CHOICES: Final = ("auto", "system", "debian")
HEADERS_ENV: Final = "SKIPPY_VULKAN_HEADERS"
PIN_TABLE: Final = "vulkan_headers_debian"

#: seconds apt may take for the suite's index (about 10 MB) and the package (about 2 MB)
APT_TIMEOUT: Final = 600.0


def _bad_pin(problem: str) -> SettingsError:
    return SettingsError(
        f"pyproject.toml [tool.skippy.build.{PIN_TABLE}]: {problem}",
        untouched="everything: nothing was downloaded or built",
        next_step='give it as suite = "trixie", package = "libvulkan-dev", version = "1.4.309.0-1"',
    )


@dataclass(frozen=True)
class HeaderPin:
    suite: str
    package: str
    version: str

    @property
    def label(self) -> str:
        return f"{self.package} {self.version} ({self.suite})"

    @property
    def dirname(self) -> str:
        return f"{self.package}_{self.version}".replace(":", "%")


def parse_header_pin(table: object) -> HeaderPin:
    """``[tool.skippy.build.vulkan_headers_debian]`` -> the pin."""
    if not isinstance(table, Mapping) or not table:
        raise _bad_pin("missing (the Debian headers need a suite, a package and its version)")
    if set(table) != {"suite", "package", "version"}:
        raise _bad_pin(f"needs exactly suite, package and version (has {', '.join(sorted(table)) or 'nothing'})")
    values = {key: table[key] for key in ("suite", "package", "version")}
    for key, value in values.items():
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+:~_-]*", value):
            raise _bad_pin(f"{key} {value!r} is not a Debian name or version")
    return HeaderPin(**values)


def resolve_headers_choice(table: Mapping[str, object], env: Mapping[str, str]) -> str:
    """``SKIPPY_VULKAN_HEADERS``, else ``[tool.skippy.build] vulkan_headers``, else ``auto``."""
    return resolve_choice(
        table, env, key="vulkan_headers", env_var=HEADERS_ENV, choices=HEADERS_CHOICES, what="Vulkan headers choice"
    )


def apt_options(state: Path) -> list[str]:
    """apt options that confine it to ``state``: its own sources, lists and downloads, no lock
    on the system's, and no privilege drop (root may run it in a directory ``_apt`` cannot write)."""
    settings = {
        "Dir::Etc::SourceList": str(state / "sources.list"),
        "Dir::Etc::SourceParts": str(state / "sources.list.d"),
        "Dir::Etc::Preferences": str(state / "preferences"),
        "Dir::Etc::PreferencesParts": str(state / "preferences.d"),
        "Dir::State::Lists": str(state / "lists"),
        "Dir::Cache::Archives": str(state / "archives"),
        "Dir::Cache::pkgcache": "",
        "Dir::Cache::srcpkgcache": "",
        "APT::Sandbox::User": "root",
        "Debug::NoLocking": "1",
        "Acquire::Retries": "3",
    }
    out: list[str] = []
    for key, value in settings.items():
        out += ["-o", f"{key}={value}"]
    return out


# --- the fetch -------------------------------------------------------------------------


@dataclass(frozen=True)
class DebianHeaders:
    """Unpacked headers: ``include`` is what ``-DVulkan_INCLUDE_DIR`` gets."""

    include: Path
    pin: HeaderPin
    seconds: float = 0.0
    reused: bool = False


@dataclass(frozen=True)
class FetchContext:
    cache_dir: Path
    env: Mapping[str, str] = field(repr=False)
    lock_timeout: float = 600.0
    keyring: Path | None = DEBIAN_KEYRING
    log: Callable[[str], None] = field(default=lambda _line: None, repr=False)


def headers_home(cache_dir: Path, pin: HeaderPin) -> Path:
    return cache_dir / "vulkan-headers" / pin.dirname


def _record(pin: HeaderPin) -> dict[str, object]:
    return {"suite": pin.suite, "package": pin.package, "version": pin.version}


def unpacked(home: Path, pin: HeaderPin, record: Mapping[str, object]) -> bool:
    return record == _record(pin) and (home / "usr" / "include" / "vulkan" / "vulkan_core.h").is_file()


def can_fetch(env: Mapping[str, str]) -> bool:
    """apt-get and dpkg-deb are there (a Debian or Ubuntu system)."""
    return proc.which("apt-get", env) is not None and proc.which("dpkg-deb", env) is not None


def fetch_headers(pin: HeaderPin, ctx: FetchContext) -> DebianHeaders:
    """The pinned headers under the project cache: reused when unpacked, else fetched."""

    def done(home: Path, record: Mapping[str, object]) -> DebianHeaders | None:
        return DebianHeaders(home / "usr" / "include", pin, reused=True) if unpacked(home, pin, record) else None

    started = time.monotonic()
    headers, made = fetch_once(
        headers_home(ctx.cache_dir, pin),
        done=done,
        make=lambda folder: _fetch_into(folder, pin, ctx),
        what="fetching the Vulkan headers",
        timeout=ctx.lock_timeout,
    )
    if not made:
        return headers
    took = time.monotonic() - started
    ctx.log(f"unpacked {pin.label} in {took:.1f} s")
    return replace(headers, reused=False, seconds=took)


def _apt(argv: list[str], ctx: FetchContext, *, cwd: Path | None = None, what: str) -> None:
    try:
        proc.run(argv, env=ctx.env, cwd=cwd, timeout=APT_TIMEOUT, what=what)
    except CommandError as exc:
        raise NetworkError(
            f"could not fetch the Vulkan headers ({what})",
            untouched="the system's apt sources, lists and packages; nothing was built",
            next_step=f"check that the Debian mirror is reachable and that [tool.skippy.build.{PIN_TABLE}] names a "
            f"package version the suite has, or set {HEADERS_ENV}=system and pass -DVulkan_INCLUDE_DIR=<dir>",
            details=exc.details,
        ) from exc


def _fetch_into(folder: Path, pin: HeaderPin, ctx: FetchContext) -> Mapping[str, object]:
    """``pin``'s package from the system's Debian mirror, unpacked into ``folder``."""
    mirror = system_mirror(ctx.env)
    if mirror is None:
        raise ToolchainMissing(
            "the Vulkan backend needs newer Vulkan headers, and apt has no Debian mirror to take them from",
            untouched="everything: nothing was downloaded or built",
            next_step="install Vulkan headers that define VK_EXT_layer_settings and pass -DVulkan_INCLUDE_DIR=<dir> "
            f"(or set {HEADERS_ENV}=system)",
        )
    keyring = present_keyring(ctx.keyring)
    ctx.log(f"fetching Vulkan headers: {pin.label} from the system's Debian mirror")
    with tempfile.TemporaryDirectory(prefix="apt-", dir=folder.parent) as tmp:
        state = Path(tmp)
        for sub in ("lists/partial", "archives/partial", "sources.list.d", "preferences.d", "download"):
            (state / sub).mkdir(parents=True)
        (state / "sources.list").write_text(sources_line(mirror, pin.suite, keyring), encoding="utf-8")
        options = apt_options(state)
        _apt(["apt-get", *options, "update"], ctx, what=f"apt-get update ({pin.suite})")
        _apt(
            ["apt-get", *options, "download", f"{pin.package}={pin.version}"],
            ctx,
            cwd=state / "download",
            what=f"apt-get download {pin.package}={pin.version}",
        )
        debs = sorted((state / "download").glob("*.deb"))
        if len(debs) != 1:
            raise NetworkError(
                f"apt-get download {pin.package}={pin.version} left {len(debs)} package files, expected 1",
                untouched="the system's apt state; nothing was built",
                next_step="run the build again",
            )
        proc.run(["dpkg-deb", "-x", str(debs[0]), str(folder)], env=ctx.env, timeout=120, what="dpkg-deb -x")
        if not (folder / "usr" / "include" / "vulkan" / "vulkan_core.h").is_file():
            raise ToolchainMissing(
                f"{debs[0].name} has no usr/include/vulkan/vulkan_core.h",
                untouched="the system's headers; nothing was built",
                next_step=f"pin a package with the Vulkan headers in [tool.skippy.build.{PIN_TABLE}]",
            )
    return _record(pin)
