"""Vulkan: glslc plus Vulkan and SPIR-V headers; Mesa's lavapipe runs it without a GPU."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from skippy.build.backends.base import BackendSpec, Choice, Found, InstallHint, PlanFacts, ProbeContext

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


@dataclass(frozen=True)
class _Vulkan(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        glslc = ctx.require("glslc")
        system_dirs = (
            [Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include")]
            if ctx.well_known_dirs
            else []
        )
        if ctx.env.get("VULKAN_SDK"):
            system_dirs.insert(0, Path(ctx.env["VULKAN_SDK"]) / "include")
        given_dir = ctx.given.get("Vulkan_INCLUDE_DIR")
        include_dirs = [Path(given_dir)] if given_dir else system_dirs
        header_dir = next((d for d in include_dirs if (d / "vulkan" / "vulkan_core.h").is_file()), None)
        if header_dir is None:
            searched = ", ".join(str(d) for d in include_dirs)
            raise ctx.missing(f"needs the Vulkan headers (vulkan/vulkan_core.h not in {searched})")
        if not (header_dir / "vulkan" / "vulkan.hpp").is_file():
            raise ctx.missing(f"needs the Vulkan C++ headers (no vulkan/vulkan.hpp in {header_dir})")
        version, features = parse_vulkan_header(
            (header_dir / "vulkan" / "vulkan_core.h").read_text(encoding="utf-8", errors="replace")
        )
        if not any((d / "spirv" / "unified1" / "spirv.hpp").is_file() for d in (header_dir, *system_dirs)):
            raise ctx.missing("needs the SPIR-V headers (spirv/unified1/spirv.hpp not found)")
        facts = {"vulkan_include_dir": str(header_dir), "vulkan_header_version": version or "unknown"}
        return Found(tools=(glslc,), facts=MappingProxyType(facts), features=features)

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
            "(Debian 12's Vulkan headers are too old: unpack trixie's libvulkan-dev and pass "
            "-DVulkan_INCLUDE_DIR=<dir>/usr/include)"
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
    device_prefix="Vulkan",
    artifact_markers=("ggml_backend_vk_reg", "ggml_backend_rpc_reg"),
    table_defines=MappingProxyType({"vulkan_include_dir": "Vulkan_INCLUDE_DIR"}),
)
