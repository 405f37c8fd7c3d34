"""Vulkan: glslc plus Vulkan and SPIR-V headers; Mesa's lavapipe runs it without a GPU.

The headers are the system's, or (``[tool.skippy.build] vulkan_headers`` /
``SKIPPY_VULKAN_HEADERS`` = ``auto``, the default, when the system's are too old for
current trees; or ``debian``) a newer Debian release's ``libvulkan-dev`` unpacked
under the project cache (:mod:`skippy.compile.backends.vulkan_headers`).  Where the
headers came from is a toolchain fact: it names the build directory and goes into
the stamp.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.compile.backends.base import BackendSpec, Choice, CiJob, Found, InstallHint, PlanFacts, ProbeContext
from skippy.compile.backends.vulkan_headers import (
    PIN_TABLE,
    FetchContext,
    can_fetch,
    fetch_headers,
    parse_header_pin,
    resolve_headers_choice,
)

#: a marker in the tree's Vulkan sources -> the header macro it needs
VULKAN_TREE_NEEDS: Final[Mapping[str, str]] = MappingProxyType({"vk::LayerSettingEXT": "VK_EXT_layer_settings"})
VULKAN_SOURCE: Final = "ggml/src/ggml-vulkan/ggml-vulkan.cpp"


def parse_vulkan_header(text: str) -> tuple[str | None, frozenset[str]]:
    """(``"1.3.239"``, macros defined) from vulkan_core.h."""
    header = re.search(r"^#define\s+VK_HEADER_VERSION\s+(\d+)", text, re.MULTILINE)
    complete = re.search(
        r"^#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*\d+\s*,\s*(\d+)\s*,\s*(\d+)",
        text,
        re.MULTILINE,
    )
    version = None
    if header:
        major_minor = f"{complete.group(1)}.{complete.group(2)}" if complete else "1.?"
        version = f"{major_minor}.{header.group(1)}"
    features = frozenset(re.findall(r"^#define\s+(VK_[A-Z]+_[a-z0-9_]+)\s+1\s*$", text, re.MULTILINE))
    return version, features


def tree_needs(source_dir: Path) -> frozenset[str]:
    """Header macros the tree's Vulkan backend needs (see VULKAN_TREE_NEEDS)."""
    source = source_dir / VULKAN_SOURCE
    if not source.is_file():
        return frozenset()
    text = source.read_text(encoding="utf-8", errors="replace")
    return frozenset(macro for marker, macro in VULKAN_TREE_NEEDS.items() if marker in text)


def _system_include_dirs(ctx: ProbeContext) -> list[Path]:
    dirs = (
        [Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include")] if ctx.well_known_dirs else []
    )
    if ctx.env.get("VULKAN_SDK"):
        dirs.insert(0, Path(ctx.env["VULKAN_SDK"]) / "include")
    return dirs


def _find_header_dir(include_dirs: list[Path]) -> Path | None:
    return next((d for d in include_dirs if (d / "vulkan" / "vulkan_core.h").is_file()), None)


def _header_dir(include_dirs: list[Path], ctx: ProbeContext) -> Path:
    """The first of ``include_dirs`` with the Vulkan C and C++ headers, or ToolchainMissing."""
    header_dir = _find_header_dir(include_dirs)
    if header_dir is None:
        searched = ", ".join(str(d) for d in include_dirs)
        raise ctx.missing(f"needs the Vulkan headers (vulkan/vulkan_core.h not in {searched})")
    if not (header_dir / "vulkan" / "vulkan.hpp").is_file():
        raise ctx.missing(f"needs the Vulkan C++ headers (no vulkan/vulkan.hpp in {header_dir})")
    return header_dir


def _read_header(header_dir: Path) -> tuple[str | None, frozenset[str]]:
    return parse_vulkan_header((header_dir / "vulkan" / "vulkan_core.h").read_text(encoding="utf-8", errors="replace"))


def _why_newer(header_dir: Path | None, ctx: ProbeContext) -> str | None:
    """Why ``auto`` takes Debian's newer headers (the system has none, or only ones too old for
    current trees, and apt can fetch them), or None; the system's header is read once.  The
    tree's own needs are still checked before configuring (``tree_problem``)."""
    if not ctx.build_table.get(PIN_TABLE) or not can_fetch(ctx.env):
        return None
    if header_dir is None:
        return "auto: no system Vulkan headers"
    if not (header_dir / "vulkan" / "vulkan.hpp").is_file():
        return f"auto: no Vulkan C++ headers in {header_dir}"
    version, features = _read_header(header_dir)
    needs = sorted(VULKAN_TREE_NEEDS.values())
    if set(needs) <= features:
        return None
    return f"auto: the system's headers in {header_dir} ({version}) lack {', '.join(needs)}"


def _debian_headers(ctx: ProbeContext, notes: list[str], why: str) -> Path:
    pin = parse_header_pin(ctx.build_table.get(PIN_TABLE))
    headers = fetch_headers(pin, FetchContext(cache_dir=ctx.cache_dir, env=ctx.env, log=notes.append))
    notes.append(f"Vulkan headers: {pin.label} in {headers.include} ({why})")
    return headers.include


def _choose_headers(ctx: ProbeContext, system_dirs: list[Path], notes: list[str]) -> tuple[Path, str]:
    """(include dir, where from: given / system / debian)."""
    given_dir = ctx.given.get("Vulkan_INCLUDE_DIR")
    if given_dir:
        return _header_dir([Path(given_dir)], ctx), "given"
    choice = resolve_headers_choice(ctx.build_table, ctx.env)
    found = None if choice == "debian" else _find_header_dir(system_dirs)
    why = "asked for" if choice == "debian" else _why_newer(found, ctx) if choice == "auto" else None
    if why is not None:
        return _debian_headers(ctx, notes, why), "debian"
    return _header_dir(system_dirs, ctx), "system"


@dataclass(frozen=True)
class _Vulkan(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        glslc = ctx.require("glslc")
        system_dirs = _system_include_dirs(ctx)
        notes: list[str] = []
        header_dir, source = _choose_headers(ctx, system_dirs, notes)
        version, features = _read_header(header_dir)
        if not any((d / "spirv" / "unified1" / "spirv.hpp").is_file() for d in (header_dir, *system_dirs)):
            raise ctx.missing("needs the SPIR-V headers (spirv/unified1/spirv.hpp not found)")
        facts = {
            "vulkan_include_dir": str(header_dir),
            "vulkan_header_version": version or "unknown",
            "vulkan_headers": source,
        }
        if source == "debian":
            # a different set of headers is a different build directory
            facts["toolkit"] = f"vulkan headers {source} {version}"
        return Found(tools=(glslc,), facts=MappingProxyType(facts), features=features, notes=tuple(notes))

    def choices(self, plan: PlanFacts) -> tuple[Choice, ...]:
        include_dir = plan.facts.get("vulkan_include_dir")
        return (Choice("Vulkan_INCLUDE_DIR", include_dir, path=True),) if include_dir else ()

    def tree_problem(self, plan: PlanFacts) -> str | None:
        missing = sorted(tree_needs(plan.source_dir) - plan.features)
        if not missing:
            return None
        return (
            f"needs Vulkan headers that define {', '.join(missing)}; the headers in "
            f"{plan.facts.get('vulkan_include_dir')} (version {plan.facts.get('vulkan_header_version')}) do not "
            "(ggml-vulkan.cpp would fail to compile after minutes); pass newer headers with "
            "-DVulkan_INCLUDE_DIR=<dir>"
        )


BACKEND: Final = _Vulkan(
    name="vulkan",
    title="Vulkan (glslc, Vulkan and SPIR-V headers; lavapipe works without a GPU)",
    switch="GGML_VULKAN",
    install=InstallHint(
        debian=(
            "apt-get install glslc libvulkan-dev spirv-headers mesa-vulkan-drivers "
            "(Debian 12's Vulkan headers are too old for current trees: the build then takes the "
            "libvulkan-dev pinned in [tool.skippy.build.vulkan_headers_debian] into the project cache)"
        ),
        arch="pacman -S vulkan-headers vulkan-icd-loader shaderc spirv-headers",
        macos="brew install vulkan-headers vulkan-loader shaderc spirv-headers molten-vk",
    ),
    gpu=True,
    spot_check_env=MappingProxyType(
        {
            # use device 0 even when it is a software (lavapipe) device
            "GGML_VK_VISIBLE_DEVICES": "0",
            # lavapipe segfaults on the first request with graph optimisation
            "GGML_VK_DISABLE_GRAPH_OPTIMIZE": "1",
            "MESA_SHADER_CACHE_DIR": "{cache_dir}/mesa-shader-cache",
        }
    ),
    spot_check_args=("-ngl", "99"),
    # lavapipe compiles each shader pipeline on first use: with an empty Mesa shader cache one
    # 16-token completion took over 2 minutes on 2 busy cores (seconds once the cache is warm)
    spot_check_timeouts=MappingProxyType({"load_timeout": 900.0, "request_timeout": 900.0}),
    device_prefix="Vulkan",
    artifact_markers=("ggml_backend_vk_reg", "ggml_backend_rpc_reg"),
    table_defines=MappingProxyType({"vulkan_include_dir": "Vulkan_INCLUDE_DIR"}),
    extra_table_keys=frozenset({"vulkan_headers", PIN_TABLE}),
    label="Vulkan",
    upstream_areas=("ggml/src/ggml-vulkan/", "ggml/include/ggml-vulkan.h"),
    failure_patterns=(
        (r"\bVK_ERROR_\w+", "Vulkan error"),
        (r"ggml_vulkan: .*\b(?:[Ee]rror|failed)\b", "Vulkan error"),
    ),
    ci=(
        CiJob(
            "ubuntu, Mesa lavapipe software device, build + spot check",
            apt=("glslc", "libvulkan-dev", "spirv-headers", "mesa-vulkan-drivers"),
            keep=("mesa-shaders", ".deps/cache/mesa-shader-cache"),
            notes=(
                "Ubuntu 24.04's Vulkan headers (1.3.275) have VK_EXT_layer_settings; the spot check",
                "runs on lavapipe with the env skippy.compile.backends.vulkan sets (GGML_VK_VISIBLE_DEVICES=0,",
                "GGML_VK_DISABLE_GRAPH_OPTIMIZE=1, MESA_SHADER_CACHE_DIR under .deps/cache, kept between runs)",
            ),
        ),
    ),
)
