"""Apple Metal: macOS with the Xcode command line tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from skippy.compile.backends.base import BackendSpec, CiJob, Found, InstallHint, ProbeContext


@dataclass(frozen=True)
class _Metal(BackendSpec):
    def probe(self, ctx: ProbeContext) -> Found:
        return Found(tools=(ctx.require("xcrun"),))


BACKEND: Final = _Metal(
    name="metal",
    title="Apple Metal (macOS with Xcode command line tools)",
    switch="GGML_METAL",
    languages=("C", "CXX", "OBJC", "OBJCXX"),
    install=InstallHint(debian=None, arch=None, macos="xcode-select --install"),
    host_systems=frozenset({"Darwin"}),
    host_requirement="needs macOS with Xcode command line tools",
    gpu=True,
    spot_check_args=("-ngl", "99"),
    device_prefix="MTL",
    artifact_markers=("ggml_backend_metal_reg", "ggml_backend_rpc_reg"),
    # the tree's GGML_METAL defaults to ON on Apple: every other backend's build there turns it off
    default_on_systems=frozenset({"Darwin"}),
    label="Metal",
    upstream_areas=("ggml/src/ggml-metal/", "ggml/include/ggml-metal.h"),
    failure_patterns=((r"metal_library_init: error", "Metal shader library failed to build"),),
    ci=(CiJob("macOS arm64, build + spot check", runs_on="macos-15"),),
)
