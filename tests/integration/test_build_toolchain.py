"""Toolchain probes of every backend against fake toolchains: small scripts on PATH
that answer like the real tools, so each probe runs (no skip, no early return)
on any machine, whatever it has installed."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from skippy.compile.backends.base import Backend
from skippy.compile.backends.cuda import find_cuda_library
from skippy.compile.toolchain import Toolchain, TreeInfo, check_tree_needs, probe_toolchain
from skippy.core.errors import NetworkError, SettingsError, ToolchainMissing
from skippy.core.settings import Settings

pytestmark = pytest.mark.integration

#: what `--version` prints for each fake tool
VERSIONS = {
    "cmake": "cmake version 3.31.6",
    "ninja": "1.13.0",
    "cc": "cc (Fake) 12.2.0",
    "c++": "c++ (Fake) 12.2.0",
    "sccache": "sccache 0.16.0",
    "ccache": "ccache version 4.8",
    "nvcc": "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.48",
    "glslc": "shaderc v2023.2 v2023.2\nTarget: SPIR-V 1.0",
    "xcrun": "xcrun version 70.",
    "hipconfig": "HIP version: 6.4.43484",
}


def fake_tool(bin_dir: Path, name: str, answers: dict[str, str] | None = None, *, code: int = 0) -> Path:
    """An executable ``name`` printing ``answers[" ".join(args)]`` (``--version`` from VERSIONS)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    table = {"--version": VERSIONS.get(name, f"{name} 1.0"), **(answers or {})}
    cases = "".join(f"  {shlex.quote(args)}) printf '%b\\n' {shlex.quote(out)} ;;\n" for args, out in table.items())
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}  *) ;;\nesac\nexit {code}\n', encoding="utf-8")
    script.chmod(0o755)
    return script


@dataclass
class Host:
    """A machine made of fake tools: PATH is only ``bin``."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def tool(self, name: str, answers: dict[str, str] | None = None, *, code: int = 0) -> Path:
        return fake_tool(self.bin, name, answers, code=code)

    def settings(self, **env: str) -> Settings:
        return Settings.from_table(self.root, {}, {"PATH": str(self.bin), **env})

    def probe(
        self, backend: Backend, *, system: str = "Linux", given: dict[str, str] | None = None, **env: str
    ) -> Toolchain:
        return probe_toolchain(
            backend,
            self.settings(**env),
            given=given,
            system=system,
            os_release="ID=debian\n",
            library_dirs=(),
            well_known_dirs=False,
        )


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path / "host")
    for name in ("cmake", "ninja", "cc", "c++", "sccache"):
        h.tool(name)
    return h


def test_cpu_probe_finds_the_tools_and_their_versions(host: Host) -> None:
    tc = host.probe("cpu")
    assert tc.cmake.path == str(host.bin / "cmake")
    assert tc.cmake.version == "cmake version 3.31.6"
    assert tc.ninja.version == "1.13.0"
    assert {t.name: t.version for t in tc.tools} == {"cc": "cc (Fake) 12.2.0", "c++": "c++ (Fake) 12.2.0"}
    assert tc.launcher is not None
    assert (tc.launcher.name, tc.launcher.path) == ("sccache", str(host.bin / "sccache"))
    assert set(tc.tool_versions()) == {"cmake", "ninja", "cc", "c++", "sccache"}


def test_cpu_probe_takes_cc_and_cxx_from_the_environment(host: Host) -> None:
    clang = fake_tool(host.root / "llvm", "clang", {"--version": "clang version 19.1.7"})
    fake_tool(host.root / "llvm", "clang++", {"--version": "clang version 19.1.7"})
    tc = host.probe("cpu", CC=str(clang), CXX=str(clang) + "++")
    assert {t.name: t.path for t in tc.tools} == {"cc": str(clang), "c++": str(clang) + "++"}


def test_cpu_probe_without_a_compiler_says_what_is_missing(host: Host) -> None:
    (host.bin / "c++").unlink()
    with pytest.raises(ToolchainMissing) as info:
        host.probe("cpu")
    assert info.value.what == "the cpu backend needs `c++`, which is not on PATH"
    assert "apt-get install" in str(info.value.details)
    # the install lines are printed before the next step that refers to them
    text = info.value.render()
    assert text.index("apt-get install") < text.index("next: install the toolchain (the install lines above)")


def test_ccache_when_asked_and_missing_when_absent(host: Host) -> None:
    with pytest.raises(ToolchainMissing, match="was asked to use ccache, which is not on PATH"):
        host.probe("cpu", SKIPPY_COMPILER_CACHE="ccache")
    host.tool("ccache")
    tc = host.probe("cpu", SKIPPY_COMPILER_CACHE="ccache")
    assert tc.launcher is not None
    assert (tc.launcher.name, tc.launcher.version) == ("ccache", "ccache version 4.8")


def test_metal_probe_on_macos_needs_xcrun(host: Host) -> None:
    with pytest.raises(ToolchainMissing) as info:
        host.probe("metal", system="Darwin")
    assert info.value.what == "the metal backend needs `xcrun`, which is not on PATH"
    assert "xcode-select --install" in str(info.value.details)
    host.tool("xcrun")
    tc = host.probe("metal", system="Darwin")
    assert [t.name for t in tc.tools] == ["cc", "c++", "xcrun"]
    with pytest.raises(ToolchainMissing, match=r"needs macOS .*\(this host is Linux\)"):
        host.probe("metal", system="Linux")


def _cuda_root(host: Host, *, cublas: bool) -> Path:
    root = host.root / "cuda"
    nvcc = fake_tool(root / "bin", "nvcc")
    lib = root / "lib64"
    lib.mkdir(parents=True, exist_ok=True)
    if cublas:
        (lib / "libcublas.so.13").write_bytes(b"")
    return nvcc


def test_cuda_probe_without_nvcc(host: Host) -> None:
    with pytest.raises(ToolchainMissing) as info:
        host.probe("cuda")
    assert info.value.what == "the cuda backend needs `nvcc`, which is not on PATH"


def test_cuda_probe_without_cublas(host: Host) -> None:
    nvcc = _cuda_root(host, cublas=False)
    with pytest.raises(ToolchainMissing) as info:
        host.probe("cuda", CUDA_PATH=str(nvcc.parent.parent))
    assert info.value.what == "the cuda backend needs cuBLAS (libcublas) from the CUDA toolkit, which was not found"


def test_cuda_probe_without_a_gpu_uses_the_default_architectures(host: Host) -> None:
    nvcc = _cuda_root(host, cublas=True)
    tc = host.probe("cuda", CUDA_PATH=str(nvcc.parent.parent))
    assert tc.facts.get("cuda_compiler") == str(nvcc)
    assert any(t.name == "nvcc" and t.version == "Cuda compilation tools, release 13.0, V13.0.48" for t in tc.tools)
    assert tc.facts.get("cuda_architectures") is None
    assert tc.notes == ("no nvidia-smi: using the default CUDA architectures",)


def test_cuda_probe_reads_the_gpus_from_nvidia_smi(host: Host) -> None:
    nvcc = _cuda_root(host, cublas=True)
    host.tool("nvidia-smi", {"--query-gpu=compute_cap --format=csv,noheader": "8.9\n8.6\n8.9"})
    tc = host.probe("cuda", CUDA_PATH=str(nvcc.parent.parent))
    assert tc.facts.get("cuda_architectures") == "86;89"
    assert tc.notes == ()
    # a given value wins: nvidia-smi is not asked
    given = host.probe("cuda", given={"CMAKE_CUDA_ARCHITECTURES": "75"}, CUDA_PATH=str(nvcc.parent.parent))
    assert given.facts.get("cuda_architectures") is None


def test_cuda_probe_notes_a_nvidia_smi_that_sees_no_gpu(host: Host) -> None:
    nvcc = _cuda_root(host, cublas=True)
    host.tool("nvidia-smi", code=9)
    tc = host.probe("cuda", CUDA_PATH=str(nvcc.parent.parent))
    assert tc.facts.get("cuda_architectures") is None
    assert tc.notes == ("nvidia-smi found no GPU; using the default CUDA architectures",)


def _rocm(host: Host, *, clang: bool = True) -> Path:
    llvm = host.root / "rocm" / "llvm" / "bin"
    if clang:
        fake_tool(llvm, "clang++", {"--version": "AMD clang version 19.0.0"})
    else:
        llvm.mkdir(parents=True, exist_ok=True)
    host.tool("hipconfig", {"-l": str(llvm), "--path": str(host.root / "rocm")})
    return llvm


def test_rocm_probe_without_hipconfig(host: Host) -> None:
    with pytest.raises(ToolchainMissing) as info:
        host.probe("rocm")
    assert info.value.what == "the rocm backend needs `hipconfig`, which is not on PATH"


def test_rocm_probe_without_the_hip_clang(host: Host) -> None:
    llvm = _rocm(host, clang=False)
    with pytest.raises(ToolchainMissing) as info:
        host.probe("rocm")
    assert info.value.what == f"the rocm backend needs the HIP clang (`hipconfig -l` gave {str(llvm)!r})"


def test_rocm_probe_finds_the_compiler_and_the_gpus(host: Host) -> None:
    llvm = _rocm(host)
    host.tool(
        "rocminfo", {"": "Agent 1\n  Name:                    gfx000\nAgent 2\n  Name:                    gfx1100"}
    )
    tc = host.probe("rocm")
    assert tc.facts.get("hip_compiler") == str(llvm / "clang++")
    assert tc.facts.get("hip_path") == str(host.root / "rocm")
    assert {t.name: t.version for t in tc.tools}["hip-clang"] == "AMD clang version 19.0.0"
    assert tc.facts.get("amdgpu_targets") == "gfx1100"
    assert tc.notes == ()


def test_rocm_probe_falls_back_to_amdgpu_arch_then_to_the_defaults(host: Host) -> None:
    _rocm(host)
    host.tool("rocminfo", code=1)
    host.tool("amdgpu-arch", {"": "gfx90a\ngfx90a"})
    assert host.probe("rocm").facts.get("amdgpu_targets") == "gfx90a"
    host.tool("amdgpu-arch")  # prints nothing: no GPU
    tc = host.probe("rocm")
    assert tc.facts.get("amdgpu_targets") is None
    assert tc.notes == ("no AMD GPU visible; using the default AMDGPU targets",)
    # given targets: no GPU query, no note
    assert host.probe("rocm", given={"AMDGPU_TARGETS": "gfx1100"}).notes == ()


def _headers(root: Path, version: int, *, layer_settings: bool, spirv: bool = True) -> Path:
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
    if spirv:
        (inc / "spirv" / "unified1").mkdir(parents=True)
        (inc / "spirv" / "unified1" / "spirv.hpp").write_text("// SPIR-V\n", encoding="utf-8")
    return inc


def test_vulkan_probe_without_glslc(host: Host) -> None:
    with pytest.raises(ToolchainMissing) as info:
        host.probe("vulkan")
    assert info.value.what == "the vulkan backend needs `glslc`, which is not on PATH"


def test_vulkan_probe_reads_the_given_headers(host: Host, tmp_path: Path) -> None:
    host.tool("glslc")
    old = _headers(tmp_path / "old", 239, layer_settings=False)
    tc = host.probe("vulkan", given={"Vulkan_INCLUDE_DIR": str(old)})
    assert tc.facts.get("vulkan_include_dir") == str(old)
    assert tc.facts.get("vulkan_header_version") == "1.3.239"
    assert any(t.name == "glslc" and t.version == "shaderc v2023.2 v2023.2" for t in tc.tools)
    vk = tmp_path / "tree" / "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    vk.parent.mkdir(parents=True)
    vk.write_text("vk::LayerSettingEXT setting{};\n", encoding="utf-8")
    tree = TreeInfo(tmp_path / "tree", frozenset(), frozenset(), "ggml-rpc-server")
    with pytest.raises(ToolchainMissing, match="VK_EXT_layer_settings"):
        check_tree_needs(tree, tc)
    new = _headers(tmp_path / "new", 309, layer_settings=True)
    check_tree_needs(tree, host.probe("vulkan", given={"Vulkan_INCLUDE_DIR": str(new)}))


def test_vulkan_probe_names_the_missing_headers(host: Host, tmp_path: Path) -> None:
    host.tool("glslc")
    nowhere = tmp_path / "nowhere"
    with pytest.raises(ToolchainMissing) as info:
        host.probe("vulkan", given={"Vulkan_INCLUDE_DIR": str(nowhere)})
    assert info.value.what == f"the vulkan backend needs the Vulkan headers (vulkan/vulkan_core.h not in {nowhere})"
    no_cpp = _headers(tmp_path / "c-only", 309, layer_settings=True)
    (no_cpp / "vulkan" / "vulkan.hpp").unlink()
    with pytest.raises(ToolchainMissing, match=r"needs the Vulkan C\+\+ headers"):
        host.probe("vulkan", given={"Vulkan_INCLUDE_DIR": str(no_cpp)})
    no_spirv = _headers(tmp_path / "no-spirv", 309, layer_settings=True, spirv=False)
    with pytest.raises(ToolchainMissing, match=r"needs the SPIR-V headers"):
        host.probe("vulkan", given={"Vulkan_INCLUDE_DIR": str(no_spirv)})
    # the SDK's include dir is looked in when no directory is given
    sdk = _headers(tmp_path / "sdk", 309, layer_settings=True)
    assert host.probe("vulkan", VULKAN_SDK=str(sdk.parent)).facts.get("vulkan_include_dir") == str(sdk)


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_table(tmp_path, {}, {"PATH": os.environ.get("PATH", os.defpath), **env})


def test_compiler_cache_choice(tmp_path: Path) -> None:
    none = probe_toolchain("cpu", settings(tmp_path, SKIPPY_COMPILER_CACHE="none"))
    assert none.launcher is None
    # refused when the settings are made, before any tool is probed
    with pytest.raises(SettingsError, match=r"SKIPPY_COMPILER_CACHE='distcc' .*one of auto, sccache, ccache, none"):
        settings(tmp_path, SKIPPY_COMPILER_CACHE="distcc")


def test_find_cuda_library(tmp_path: Path) -> None:
    root = tmp_path / "cuda"
    (root / "targets" / "x86_64-linux" / "lib").mkdir(parents=True)
    assert find_cuda_library("skippy_no_such_lib", [root]) is None
    lib = root / "targets" / "x86_64-linux" / "lib" / "libskippy_no_such_lib.so.13"
    lib.write_bytes(b"")
    assert find_cuda_library("skippy_no_such_lib", [root]) == lib


# --- Vulkan headers from the system's Debian mirror (fake apt-get and dpkg-deb) --------------

_INDEXTARGETS = (
    "Site: http://mirror.example/debian\\nOrigin: Debian\\nLabel: Debian\\nComponent: main\\nRelease: bookworm\\n\\n"
    "Site: http://mirror.example/debian-security\\nOrigin: Debian\\nLabel: Debian-Security\\n"
    "Component: main\\nRelease: bookworm-security\\n"
)

_FAKE_APT = (
    """#!/bin/sh
# a stand-in apt-get: records its arguments, answers indextargets, "downloads" a package
echo "$*" >> "$APT_LOG"
case "$*" in
  indextargets*) [ -n "$APT_NO_DEBIAN" ] && exit 0; printf '"""
    + _INDEXTARGETS
    + """' ;;
  *" update")
    for a in "$@"; do case "$a" in Dir::Etc::SourceList=*) cp "${a#*=}" "$APT_LOG.sources" ;; esac; done ;;
  *" download "*)
    if [ -n "$APT_FAIL" ]; then echo "E: Version '1.4.309.0-1' was not found" >&2; exit 100; fi
    : > libvulkan-dev_1.4.309.0-1_amd64.deb ;;
esac
"""
)

_VULKAN_CORE = (
    "#define VK_HEADER_VERSION 309\\n"
    "#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)\\n"
    "#define VK_EXT_layer_settings 1\\n"
)

_FAKE_DPKG_DEB = f"""#!/bin/sh
# a stand-in dpkg-deb -x DEB DIR: unpacks headers that define VK_EXT_layer_settings
mkdir -p "$3/usr/include/vulkan"
printf '{_VULKAN_CORE}' > "$3/usr/include/vulkan/vulkan_core.h"
echo '// C++ bindings' > "$3/usr/include/vulkan/vulkan.hpp"
"""

_PIN = {"suite": "trixie", "package": "libvulkan-dev", "version": "1.4.309.0-1"}


def _apt_host(host: Host, tmp_path: Path) -> tuple[Path, Path]:
    """Fake glslc, apt-get, dpkg-deb; old system headers (with SPIR-V) as the SDK; the apt log."""
    host.tool("glslc")
    for name, text in (("apt-get", _FAKE_APT), ("dpkg-deb", _FAKE_DPKG_DEB)):
        (host.bin / name).write_text(text, encoding="utf-8")
        (host.bin / name).chmod(0o755)
    return _headers(tmp_path / "sdk", 239, layer_settings=False), tmp_path / "apt.log"


def _probe_with_pin(host: Host, sdk: Path, log: Path, **env: str) -> Toolchain:
    table = {"build": {"vulkan_headers_debian": dict(_PIN)}, "cache_dir": "cache"}
    base = {"PATH": f"{host.bin}:/usr/bin:/bin", "VULKAN_SDK": str(sdk.parent), "APT_LOG": str(log)}
    settings = Settings.from_table(host.root, table, {**base, **env})
    return probe_toolchain(
        "vulkan", settings, system="Linux", os_release="ID=debian\n", library_dirs=(), well_known_dirs=False
    )


def test_vulkan_auto_takes_debians_newer_headers_into_the_cache_once(host: Host, tmp_path: Path) -> None:
    sdk, log = _apt_host(host, tmp_path)
    tc = _probe_with_pin(host, sdk, log)
    include = host.root / "cache" / "vulkan-headers" / "libvulkan-dev_1.4.309.0-1" / "usr" / "include"
    assert tc.facts.get("vulkan_include_dir") == str(include)
    assert (tc.facts.get("vulkan_headers"), tc.facts.get("vulkan_header_version")) == ("debian", "1.4.309")
    assert tc.facts.get("toolkit") == "vulkan headers debian 1.4.309", "other headers, another build dir"
    assert any("lack VK_EXT_layer_settings" in note for note in tc.notes)
    calls = log.read_text(encoding="utf-8").splitlines()
    assert [c.split()[-1] if "download" not in c else "download" for c in calls] == [
        "indextargets",
        "update",
        "download",
    ]
    # apt was confined to its own sources and state under the cache; the system's were not read or locked
    for call in calls[1:]:
        assert f"Dir::Etc::SourceList={host.root / 'cache' / 'vulkan-headers'}" in call
        assert "Debug::NoLocking=1" in call and "Dir::Etc::SourceParts=" in call
    assert "libvulkan-dev=1.4.309.0-1" in calls[2]
    sources = (log.parent / "apt.log.sources").read_text(encoding="utf-8")
    assert sources.split("] ", 1)[-1] == "http://mirror.example/debian trixie main\n", sources
    # reused: no second fetch
    again = _probe_with_pin(host, sdk, log)
    assert again.facts.get("vulkan_include_dir") == str(include)
    assert len(log.read_text(encoding="utf-8").splitlines()) == 3
    # asked for the system's: the old headers, no fetch (the tree check then names what is missing)
    system = _probe_with_pin(host, sdk, log, SKIPPY_VULKAN_HEADERS="system")
    assert (system.facts.get("vulkan_headers"), system.facts.get("vulkan_header_version")) == ("system", "1.3.239")
    assert "toolkit" not in system.facts


def test_vulkan_headers_that_cannot_be_fetched_name_the_pin_and_the_way_out(host: Host, tmp_path: Path) -> None:
    sdk, log = _apt_host(host, tmp_path)
    with pytest.raises(NetworkError) as info:
        _probe_with_pin(host, sdk, log, APT_FAIL="1")
    err = info.value
    assert err.what == "could not fetch the Vulkan headers (apt-get download libvulkan-dev=1.4.309.0-1)"
    assert "[tool.skippy.build.vulkan_headers_debian]" in (err.next_step or "")
    assert "SKIPPY_VULKAN_HEADERS=system" in (err.next_step or "")
    assert "the system's apt sources" in (err.untouched or "")
    assert not (host.root / "cache" / "vulkan-headers" / "libvulkan-dev_1.4.309.0-1").exists()
    with pytest.raises(SettingsError, match="unknown Vulkan headers choice 'newest'"):
        _probe_with_pin(host, sdk, log, SKIPPY_VULKAN_HEADERS="newest")
    # apt knows no Debian mirror (another distribution's sources): said, nothing fetched or written
    with pytest.raises(ToolchainMissing) as none:
        _probe_with_pin(host, sdk, log, APT_NO_DEBIAN="1")
    assert "apt has no Debian mirror to take them from" in none.value.what
    assert "-DVulkan_INCLUDE_DIR=<dir>" in (none.value.next_step or "")
    assert not (host.root / "cache" / "vulkan-headers" / "libvulkan-dev_1.4.309.0-1").exists()
