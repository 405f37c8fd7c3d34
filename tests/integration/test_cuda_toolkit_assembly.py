"""The wheel toolkit's assembly on small wheels of our own (real zip files, the real C
compiler for the driver stub, no network): they sit in the cache's download folder with
their pinned hashes, so nothing is downloaded.  Then the CUDA probe's toolkit choice
against fake system toolkits (tests/integration/test_build_toolchain.py's hosts)."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from skippy.compile.backends.cuda_toolkit import (
    REQUIRED_WHEELS,
    AssemblyContext,
    WheelPin,
    assemble,
    toolkit_home,
    wheels_home,
)
from skippy.compile.fetched import MARKER
from skippy.compile.toolchain import Toolchain, probe_toolchain
from skippy.core import proc
from skippy.core.errors import ToolchainMissing
from skippy.core.settings import Settings
from tests.integration.test_build_toolchain import Host, fake_tool

pytestmark = pytest.mark.integration

NVCC = '#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.88"\n'
CUDA_H = """#define cuMemAlloc cuMemAlloc_v2
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize);
"""

#: what each small wheel holds under nvidia/cu13 (path -> (content, executable))
CONTENTS: dict[str, dict[str, tuple[str, bool]]] = {
    "nvidia-cuda-nvcc": {"bin/nvcc": (NVCC, True), "bin/nvcc.profile": ("TOP = $(_HERE_)/..\n", False)},
    "nvidia-cuda-crt": {"include/crt/host_config.h": ("/* crt */\n", False)},
    "nvidia-nvvm": {"nvvm/bin/cicc": ("#!/bin/sh\n", True), "lib/libnvvm.so.4": ("nvvm", False)},
    "nvidia-cuda-runtime": {"include/cuda.h": (CUDA_H, False), "lib/libcudart.so.13": ("rt", False)},
    "nvidia-cuda-cccl": {"include/cccl/cub/cub.cuh": ("/* cub */\n", False)},
    "nvidia-cublas": {"include/cublas_v2.h": ("/* cublas */\n", False), "lib/libcublas.so.13": ("b", False)},
}


def make_wheel(directory: Path, name: str, version: str) -> WheelPin:
    """A wheel named like the index's, holding CONTENTS[name] (and a dist-info, which is skipped)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    wheel = directory / f"{dist}-{version}-py3-none-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel, (text, executable) in CONTENTS[name].items():
            info = zipfile.ZipInfo(f"nvidia/cu13/{rel}")
            info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
            zf.writestr(info, text)
        zf.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {name}\n")
    return WheelPin(name, version, hashlib.sha256(wheel.read_bytes()).hexdigest())


def small_pins(cache: Path) -> tuple[WheelPin, ...]:
    """Small wheels already in the download folder of the pins they make."""
    scratch = cache / "scratch"
    pins = tuple(make_wheel(scratch, name, "13.0.88") for name in REQUIRED_WHEELS)
    wheels = wheels_home(cache)
    wheels.mkdir(parents=True)
    for wheel in scratch.iterdir():
        shutil.move(wheel, wheels / wheel.name)
    return pins


def context(cache: Path, lines: list[str]) -> AssemblyContext:
    return AssemblyContext(
        cache_dir=cache, env={"PATH": "/usr/bin:/bin"}, cc=shutil.which("cc") or "cc", log=lines.append
    )


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    return tmp_path / "cache"


def test_assembly_merges_the_wheels_into_a_toolkit_tree(cache: Path) -> None:
    pins = small_pins(cache)
    lines: list[str] = []
    kit = assemble(pins, context(cache, lines))
    root = kit.root
    assert (kit.version, kit.reused) == ("13.0.88", False)
    assert root == toolkit_home(cache, pins) / "toolkit"
    assert (root / "bin").is_dir()
    assert not (root / "bin").is_symlink(), "nvcc reads nvcc.profile beside itself"
    assert (root / "bin" / "nvcc.profile").is_file()
    assert kit.nvcc.stat().st_mode & 0o111, "modes survive the unpacking"
    assert proc.run([kit.nvcc], env={"PATH": "/usr/bin:/bin"}).stdout.strip().endswith("V13.0.88")
    assert (root / "lib" / "libcublas.so").readlink() == Path("libcublas.so.13")
    assert (root / "lib64" / "libcudart.so").resolve() == (root / "lib" / "libcudart.so.13").resolve()
    assert (root / "targets" / "x86_64-linux" / "include" / "cublas_v2.h").is_file()
    assert (root / "targets" / "x86_64-linux" / "lib" / "libnvvm.so.4").is_file()
    assert (root / "include" / "cccl" / "cub" / "cub.cuh").is_file()
    assert not list(root.rglob("*.dist-info")), "only nvidia/cu13 is unpacked"
    # files are links to the unpacked wheels, not copies, and resolve inside the tree
    assert kit.nvcc.resolve() == kit.nvcc
    assert kit.nvcc.stat().st_nlink == 2
    # the driver stub: a shared library named like the driver, exporting cuda.h's entry points
    stub = root / "lib64" / "stubs" / "libcuda.so"
    readelf = shutil.which("readelf")
    if readelf:
        dynamic = proc.run([readelf, "-d", "--dyn-syms", stub], env={"PATH": "/usr/bin:/bin"}).stdout
        assert "[libcuda.so.1]" in dynamic
        for name in ("cuInit", "cuMemAlloc", "cuMemAlloc_v2"):
            assert f" {name}\n" in dynamic + "\n"
    assert not (root / "lib" / "stubs" / "libcuda.so.1").exists(), "the real driver must win at run time"
    assert json.loads((toolkit_home(cache, pins) / MARKER).read_text(encoding="utf-8"))["schema"] == 1
    assert any("libcuda link-time stub (3 driver entry points)" in line for line in lines)


def test_a_finished_toolkit_is_reused_and_an_interrupted_one_redone(cache: Path) -> None:
    pins = small_pins(cache)
    first = assemble(pins, context(cache, []))
    again = assemble(pins, context(cache, []))
    assert again.reused
    assert again.root == first.root
    # a run killed mid-way: no marker, a half-merged tree, a half-unpacked wheel
    home = toolkit_home(cache, pins)
    (home / MARKER).unlink()
    (first.root / "include" / "cuda.h").unlink()
    (home / "unpacked" / "nvidia-cublas.partial").mkdir()
    killed = home.with_name(home.name + ".partial-killed")
    (killed / "toolkit").mkdir(parents=True)
    redone = assemble(pins, context(cache, []))
    assert not redone.reused
    assert (redone.root / "include" / "cuda.h").is_file()
    assert not (home / "unpacked" / "nvidia-cublas.partial").exists()
    assert not killed.exists(), "an interrupted run's folder is removed"
    assert (home / MARKER).is_file()
    # the wheels were kept apart: the assembly was redone without a download
    assert redone.downloaded_bytes == 0


def test_other_pins_are_another_toolkit(cache: Path) -> None:
    pins = small_pins(cache)
    other = (*pins[:-1], WheelPin(pins[-1].name, pins[-1].version, "f" * 64))
    assert toolkit_home(cache, pins) != toolkit_home(cache, other)


# --- the probe's choice ----------------------------------------------------------------------------


def _settings(host: Host, build: dict[str, object], **env: str) -> Settings:
    return Settings.from_table(
        host.root, {"build": build, "cache_dir": str(host.root / "cache")}, {"PATH": str(host.bin), **env}
    )


def _probe(host: Host, build: dict[str, object], *, machine: str = "x86_64", **env: str) -> Toolchain:
    return probe_toolchain(
        "cuda",
        _settings(host, build, **env),
        system="Linux",
        os_release="ID=debian\n",
        library_dirs=(),
        well_known_dirs=False,
        machine=machine,
    )


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path / "host")
    for name in ("cmake", "ninja", "c++", "sccache"):
        h.tool(name)
    real_cc = shutil.which("cc")
    if real_cc is None:
        pytest.skip("no C compiler")
    h.bin.mkdir(parents=True, exist_ok=True)
    # the real C compiler (for the driver stub) and the binutils it runs from PATH
    for name, path in (("cc", real_cc), ("as", shutil.which("as")), ("ld", shutil.which("ld"))):
        if path is None:
            pytest.skip(f"no {name}")
        (h.bin / name).symlink_to(path)
    return h


def _wheel_table(host: Host) -> dict[str, object]:
    pins = small_pins(host.root / "cache")
    return {p.name: {"version": p.version, "sha256": p.sha256} for p in pins}


def test_auto_takes_the_wheels_when_the_system_nvcc_has_no_cublas(host: Host) -> None:
    fake_tool(host.bin, "nvcc")  # a partial system toolkit: nvcc, no cuBLAS
    tc = _probe(host, {"cuda_wheels": _wheel_table(host)})
    assert tc.facts["cuda_toolkit"] == "wheels"
    assert tc.facts["cuda_version"] == "13.0.88"
    assert tc.facts["cuda_compiler"].endswith("/toolkit/bin/nvcc")
    assert tc.facts["toolkit"].startswith("cuda wheels 13.0.88 ")
    versions = tc.tool_versions()
    assert versions["nvcc"]["version"] == "Cuda compilation tools, release 13.0, V13.0.88"
    assert versions["cuda-toolkit"]["version"].startswith("wheels 13.0.88 (pins ")
    assert any("auto: no complete system toolkit" in note and "cuBLAS" in note for note in tc.notes)


def test_system_is_refused_without_a_complete_toolkit_and_wheels_need_linux_x86_64(host: Host) -> None:
    fake_tool(host.bin, "nvcc")
    wheels = _wheel_table(host)
    with pytest.raises(ToolchainMissing, match="needs cuBLAS"):
        _probe(host, {"cuda_wheels": wheels, "cuda_toolkit": "system"})
    with pytest.raises(ToolchainMissing, match="needs cuBLAS"):
        _probe(host, {"cuda_wheels": wheels}, machine="aarch64")  # auto: the system's problem
    with pytest.raises(ToolchainMissing, match="cannot use the CUDA wheels on Linux aarch64"):
        _probe(host, {"cuda_wheels": wheels}, machine="aarch64", SKIPPY_CUDA_TOOLKIT="wheels")


def test_a_complete_system_toolkit_wins_under_auto(host: Host) -> None:
    root = host.root / "cuda"
    nvcc = fake_tool(root / "bin", "nvcc")
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "libcublas.so.13").write_bytes(b"")
    tc = _probe(host, {"cuda_wheels": _wheel_table(host)}, CUDA_PATH=str(root))
    assert tc.facts["cuda_toolkit"] == "system"
    assert tc.facts["cuda_compiler"] == str(nvcc)
    assert tc.facts["toolkit"] == "cuda system 13.0.48"
    assert "cuda_toolkit_root" not in tc.facts
