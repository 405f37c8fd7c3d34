"""The CUDA toolkit from wheels, its pure parts: pins, the toolkit choice, the merge layout,
the driver stub's source, and what the plan makes of a wheel toolkit."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from skippy.compile.backends.cuda import DEFAULT_CUDA_ARCHITECTURES, WHEEL_DEFAULT_ARCHITECTURES, nvcc_release
from skippy.compile.backends.cuda_toolkit import (
    REQUIRED_WHEELS,
    WheelPin,
    driver_entry_points,
    parse_wheel_pins,
    pins_digest,
    pip_download_argv,
    plan_merge,
    requirements_text,
    resolve_toolkit_choice,
    stub_cc_argv,
    stub_source,
    toolkit_home,
    toolkit_version,
    wheels_supported,
)
from skippy.core.errors import SettingsError
from tests.unit.test_build_plan import defines, plan

ROOT = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef" * 4


def table(**override: object) -> dict[str, object]:
    out: dict[str, object] = {name: {"version": "13.0.88", "sha256": SHA} for name in REQUIRED_WHEELS}
    out.update(override)
    return out


# --- pins -----------------------------------------------------------------------------------


def test_the_projects_pins_name_every_wheel_of_one_cuda_13_release() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = parse_wheel_pins(data["tool"]["skippy"]["build"]["cuda_wheels"])
    assert [p.name for p in pins] == list(REQUIRED_WHEELS)
    assert all(p.version.startswith("13.0.") for p in pins)
    assert toolkit_version(pins) == "13.0.88"
    assert len({p.sha256 for p in pins}) == len(pins)


def test_pins_come_back_in_a_fixed_order_whatever_the_table_order() -> None:
    reordered = dict(reversed(list(table().items())))
    assert [p.name for p in parse_wheel_pins(reordered)] == list(REQUIRED_WHEELS)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (None, "missing"),
        ({}, "missing"),
        (table(**{"nvidia-cufft": {"version": "1", "sha256": SHA}}), "unknown wheel"),
        ({k: v for k, v in table().items() if k != "nvidia-cublas"}, "missing nvidia-cublas"),
        (table(**{"nvidia-nvvm": {"version": "13.0.88"}}), "exactly version and sha256"),
        (table(**{"nvidia-nvvm": {"version": ">=13", "sha256": SHA}}), "not a release number"),
        (table(**{"nvidia-nvvm": {"version": "13.0.88", "sha256": SHA.upper()}}), "64 lowercase hex"),
        (table(**{"nvidia-nvvm": "13.0.88"}), "exactly version and sha256"),
    ],
)
def test_bad_pins_are_refused_naming_the_table(bad: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        parse_wheel_pins(bad)
    assert "[tool.skippy.build.cuda_wheels]" in info.value.what


def test_the_pins_digest_names_the_cache_dir_and_changes_with_any_pin(tmp_path: Path) -> None:
    pins = parse_wheel_pins(table())
    other = parse_wheel_pins(table(**{"nvidia-cublas": {"version": "13.1.0.3", "sha256": SHA}}))
    assert pins_digest(pins) == pins_digest(reversed(pins))
    assert pins_digest(pins) != pins_digest(other)
    assert toolkit_home(tmp_path, pins) == tmp_path / "cuda" / f"13.0.88-{pins_digest(pins)}"


def test_pip_downloads_binary_wheels_in_hash_checking_mode(tmp_path: Path) -> None:
    pins = (WheelPin("nvidia-nvvm", "13.0.88", SHA),)
    assert requirements_text(pins) == f"nvidia-nvvm==13.0.88 --hash=sha256:{SHA}\n"
    argv = pip_download_argv("/py", tmp_path / "req.txt", tmp_path, attempts=3)
    assert argv[:4] == ["/py", "-m", "pip", "download"]
    for flag in ("--no-deps", "--require-hashes", "--no-cache-dir"):
        assert flag in argv
    assert argv[argv.index("--only-binary") + 1] == ":all:"
    assert argv[argv.index("--retries") + 1] == "2"
    assert argv[-2:] == ["-r", str(tmp_path / "req.txt")]


# --- the choice -------------------------------------------------------------------------------


def test_the_toolkit_choice_env_over_table_over_auto() -> None:
    assert resolve_toolkit_choice({}, {}) == "auto"
    assert resolve_toolkit_choice({"cuda_toolkit": "system"}, {}) == "system"
    assert resolve_toolkit_choice({"cuda_toolkit": "system"}, {"SKIPPY_CUDA_TOOLKIT": " Wheels "}) == "wheels"
    with pytest.raises(SettingsError, match="unknown CUDA toolkit 'conda'") as info:
        resolve_toolkit_choice({}, {"SKIPPY_CUDA_TOOLKIT": "conda"})
    assert "auto, system, wheels" in str(info.value.next_step)


def test_wheels_are_for_linux_x86_64_only() -> None:
    assert wheels_supported("Linux", "x86_64")
    assert not wheels_supported("Linux", "aarch64")
    assert not wheels_supported("Windows", "AMD64")
    assert not wheels_supported("Darwin", "arm64")


def test_nvcc_release_from_its_version_line() -> None:
    assert nvcc_release("Cuda compilation tools, release 13.0, V13.0.88") == "13.0.88"
    assert nvcc_release("Cuda compilation tools, release 12.4") == "12.4"
    assert nvcc_release("nvcc 1.0") is None


# --- the merge layout ---------------------------------------------------------------------------


def test_merge_plan_is_one_toolkit_shaped_tree() -> None:
    merged = plan_merge(
        {
            "nvidia-cuda-nvcc": ["bin/nvcc", "bin/nvcc.profile", "bin/ptxas", "include/crt/host_config.h"],
            "nvidia-cuda-runtime": ["include/cuda.h", "lib/libcudart.so.13", "lib/libcudart_static.a"],
            "nvidia-cublas": ["include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13"],
            "nvidia-nvvm": ["nvvm/bin/cicc", "lib/libnvvm.so.4", "lib/libnvvm.so"],
            "nvidia-cuda-crt": ["include/crt/host_config.h"],
        }
    )
    assert merged.files["bin/nvcc"] == ("nvidia-cuda-nvcc", "bin/nvcc")
    assert merged.files["bin/nvcc.profile"] == ("nvidia-cuda-nvcc", "bin/nvcc.profile")
    assert merged.files["nvvm/bin/cicc"] == ("nvidia-nvvm", "nvvm/bin/cicc")
    assert merged.files["include/crt/host_config.h"] == ("nvidia-cuda-nvcc", "include/crt/host_config.h")
    assert merged.overlaps == (("include/crt/host_config.h", ("nvidia-cuda-nvcc", "nvidia-cuda-crt")),)
    assert dict(merged.symlinks) == {
        # versionless links for the linker, beside the SONAME files (an existing one is kept)
        "lib/libcudart.so": "libcudart.so.13",
        "lib/libcublas.so": "libcublas.so.13",
        "lib/libcublasLt.so": "libcublasLt.so.13",
        "lib64": "lib",
        "targets/x86_64-linux/include": "../../include",
        "targets/x86_64-linux/lib": "../../lib",
    }


def test_merge_plan_refuses_paths_outside_the_tree() -> None:
    with pytest.raises(ValueError, match="unsafe path"):
        plan_merge({"nvidia-cuda-nvcc": ["../../etc/passwd"]})
    with pytest.raises(ValueError, match="unsafe path"):
        plan_merge({"nvidia-cuda-nvcc": ["/bin/sh"]})


# --- the driver stub ------------------------------------------------------------------------------

CUDA_H_EXCERPT = """
#define CUDA_VERSION 13000
#if defined(CUDA_FORCE_API_VERSION)
#error "CUDA_FORCE_API_VERSION is no longer supported."
#endif
#define cuDeviceTotalMem                    cuDeviceTotalMem_v2
#define cuCtxCreate                         cuCtxCreate_v4
#define cuMemAlloc                          cuMemAlloc_v2
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_STUB_LIBRARY = 34,
} CUresult;
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuDriverGetVersion(int *driverVersion);
CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev);
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                             unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize);
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
    const CUmemAllocationProp *prop, unsigned long long flags);
const char * CUDAAPI cuNotAResult(void);
/* CUresult CUDAAPI in a comment does not count without a name and a parenthesis */
"""


def test_driver_entry_points_include_the_versioned_names() -> None:
    assert driver_entry_points(CUDA_H_EXCERPT) == (
        "cuCtxCreate",
        "cuCtxCreate_v4",
        "cuDeviceTotalMem",
        "cuDeviceTotalMem_v2",
        "cuDriverGetVersion",
        "cuInit",
        "cuMemAlloc",
        "cuMemAlloc_v2",
        "cuMemCreate",
    )


def test_stub_source_returns_the_stub_library_error_everywhere() -> None:
    source = stub_source(("cuInit", "cuMemCreate"))
    assert "#define SKIPPY_STUB_RESULT 34" in source
    assert "int cuInit(void) { return SKIPPY_STUB_RESULT; }" in source
    assert "int cuMemCreate(void) { return SKIPPY_STUB_RESULT; }" in source
    assert "#include" not in source, "no prototypes to clash with"


def test_the_stub_is_a_shared_library_named_like_the_driver(tmp_path: Path) -> None:
    argv = stub_cc_argv("/usr/bin/cc", tmp_path / "s.c", tmp_path / "libcuda.so")
    assert argv[0] == "/usr/bin/cc"
    assert "-shared" in argv
    assert "-fPIC" in argv
    assert "-Wl,-soname,libcuda.so.1" in argv
    assert argv[-3:] == ["-o", str(tmp_path / "libcuda.so"), str(tmp_path / "s.c")]


# --- the plan of a wheel toolkit ----------------------------------------------------------------------

WHEELS_FACTS: dict[str, object] = {
    "cuda_compiler": "/c/cuda/13.0.88-abc/toolkit/bin/nvcc",
    "cuda_toolkit_root": "/c/cuda/13.0.88-abc/toolkit",
    "cuda_toolkit": "wheels",
    "cuda_version": "13.0.88",
    "toolkit": "cuda wheels 13.0.88 abc",
}


def test_a_wheel_toolkit_plan_sets_root_and_compiler_and_one_architecture(tmp_path: Path) -> None:
    p = plan(tmp_path, "cuda", tc=WHEELS_FACTS)
    d = defines(p)
    assert d["CUDAToolkit_ROOT"] == "/c/cuda/13.0.88-abc/toolkit"
    assert d["CMAKE_CUDA_COMPILER"] == "/c/cuda/13.0.88-abc/toolkit/bin/nvcc"
    assert d["CMAKE_CUDA_ARCHITECTURES"] == WHEEL_DEFAULT_ARCHITECTURES == "80"
    assert p.provenance["CUDAToolkit_ROOT"] == "CUDA toolkit: wheels 13.0.88"
    assert "CUDAToolkit_ROOT" not in p.expectations, "a path: not asserted in the cache"
    # a GPU or a given value still wins
    assert (
        defines(plan(tmp_path, "cuda", tc={**WHEELS_FACTS, "cuda_architectures": "89"}))["CMAKE_CUDA_ARCHITECTURES"]
        == "89"
    )
    system = plan(tmp_path, "cuda", tc={"cuda_compiler": "/usr/bin/nvcc", "cuda_toolkit": "system"})
    assert defines(system)["CMAKE_CUDA_ARCHITECTURES"] == DEFAULT_CUDA_ARCHITECTURES
    assert "CUDAToolkit_ROOT" not in defines(system)


def test_another_toolkit_is_another_build_dir(tmp_path: Path) -> None:
    given = {"CMAKE_CUDA_ARCHITECTURES": "80"}  # the same defines, only the toolkit differs
    wheels = plan(tmp_path, "cuda", defines=given, tc=WHEELS_FACTS)
    newer = plan(tmp_path, "cuda", defines=given, tc={**WHEELS_FACTS, "toolkit": "cuda wheels 13.1.80 def"})
    system = plan(tmp_path, "cuda", defines=given, tc={**WHEELS_FACTS, "toolkit": "cuda system 13.0.88"})
    assert len({wheels.build_dir, newer.build_dir, system.build_dir}) == 3
    # the toolkit is said in the plan and so in the build report (--json "toolkit")
    assert (wheels.toolkit, system.toolkit) == ("cuda wheels 13.0.88 abc", "cuda system 13.0.88")
    # the same toolkit in another cache dir is the same build dir (paths stay out of the digest)
    moved: dict[str, object] = {k: str(v).replace("/c/", "/elsewhere/") for k, v in WHEELS_FACTS.items()}
    assert plan(tmp_path, "cuda", defines=given, tc=moved).build_dir == wheels.build_dir
