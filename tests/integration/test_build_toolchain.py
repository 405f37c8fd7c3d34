"""Toolchain probes on this machine's real tools (skipped where a tool is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skippy.build.backends.cuda import find_cuda_library
from skippy.build.toolchain import TreeInfo, check_tree_needs, probe_toolchain
from skippy.core import proc
from skippy.core.errors import ToolchainMissing
from skippy.core.settings import Settings

pytestmark = pytest.mark.integration


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_table(tmp_path, {}, {"PATH": os.environ.get("PATH", os.defpath), **env})


def _headers(root: Path, version: int, *, layer_settings: bool) -> Path:
    inc = root / "include"
    (inc / "vulkan").mkdir(parents=True)
    text = (
        f"#define VK_HEADER_VERSION {version}\n"
        "#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n"
    )
    if layer_settings:
        text += "#define VK_EXT_layer_settings 1\n"
    (inc / "vulkan" / "vulkan_core.h").write_text(text, encoding="utf-8")
    (inc / "vulkan" / "vulkan.hpp").write_text("// C++ bindings\n", encoding="utf-8")
    return inc


def _tree_needing_layer_settings(source_dir: Path) -> TreeInfo:
    vk = source_dir / "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    vk.parent.mkdir(parents=True)
    vk.write_text("vk::LayerSettingEXT setting{};\n", encoding="utf-8")
    return TreeInfo(source_dir, frozenset(), frozenset(), "ggml-rpc-server")


def test_vulkan_probe_reads_the_given_headers(tmp_path: Path) -> None:
    s = settings(tmp_path)
    if proc.which("glslc", s.env) is None:
        pytest.skip("glslc is not installed")
    spirv_found = any(
        (Path(d) / "spirv" / "unified1" / "spirv.hpp").is_file() for d in ("/usr/include", "/usr/local/include")
    )
    if not spirv_found:
        pytest.skip("no SPIR-V headers installed")
    old = _headers(tmp_path / "old", 239, layer_settings=False)
    tc = probe_toolchain("vulkan", s, given={"Vulkan_INCLUDE_DIR": str(old)})
    assert tc.facts["vulkan_include_dir"] == str(old)
    assert tc.facts["vulkan_header_version"] == "1.3.239"
    assert any(t.name == "glslc" for t in tc.tools)
    tree = _tree_needing_layer_settings(tmp_path / "tree")
    with pytest.raises(ToolchainMissing, match="VK_EXT_layer_settings"):
        check_tree_needs(tree, tc)
    new = _headers(tmp_path / "new", 309, layer_settings=True)
    check_tree_needs(tree, probe_toolchain("vulkan", s, given={"Vulkan_INCLUDE_DIR": str(new)}))


def test_vulkan_probe_without_headers_names_what_is_missing(tmp_path: Path) -> None:
    s = settings(tmp_path)
    if proc.which("glslc", s.env) is None:
        pytest.skip("glslc is not installed")
    with pytest.raises(ToolchainMissing, match=r"vulkan_core\.h not in"):
        probe_toolchain("vulkan", s, given={"Vulkan_INCLUDE_DIR": str(tmp_path / "nowhere")})


def test_cuda_probe_uses_the_default_architectures_without_a_gpu(tmp_path: Path) -> None:
    s = settings(tmp_path)
    try:
        tc = probe_toolchain("cuda", s)
    except ToolchainMissing as exc:
        assert "nvcc" in exc.what or "cuBLAS" in exc.what
        return
    assert tc.facts.get("cuda_compiler")
    assert any(t.name == "nvcc" and "release" in t.version for t in tc.tools)
    if proc.which("nvidia-smi", s.env) is None:
        assert "cuda_architectures" not in tc.facts
        assert any("default CUDA architectures" in n for n in tc.notes)


def test_compiler_cache_choice(tmp_path: Path) -> None:
    none = probe_toolchain("cpu", settings(tmp_path, SKIPPY_COMPILER_CACHE="none"))
    assert none.launcher is None
    with pytest.raises(ToolchainMissing, match="unknown compiler cache"):
        probe_toolchain("cpu", settings(tmp_path, SKIPPY_COMPILER_CACHE="distcc"))


def test_find_cuda_library(tmp_path: Path) -> None:
    root = tmp_path / "cuda"
    (root / "targets" / "x86_64-linux" / "lib").mkdir(parents=True)
    assert find_cuda_library("skippy_no_such_lib", [root]) is None
    lib = root / "targets" / "x86_64-linux" / "lib" / "libskippy_no_such_lib.so.13"
    lib.write_bytes(b"")
    assert find_cuda_library("skippy_no_such_lib", [root]) == lib
