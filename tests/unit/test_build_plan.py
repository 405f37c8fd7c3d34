"""plan_build is pure: the full plan of every backend, on any machine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from skippy.cli.entries import session_options
from skippy.compile.backends import names, registry, spec
from skippy.compile.backends.base import Backend
from skippy.compile.backends.cuda import DEFAULT_COMPRESSION_MODE, DEFAULT_CUDA_ARCHITECTURES
from skippy.compile.backends.rocm import DEFAULT_AMDGPU_TARGETS, ROOT_DEFAULT_AMDGPU_TARGETS
from skippy.compile.plan import TESTS_DEFINE, TESTS_SWITCH, BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, TreeInfo
from skippy.core.errors import BuildError, SettingsError
from skippy.core.settings import Settings

SHA = "a" * 40
ALL_LANGS = frozenset({"C", "CXX", "CUDA", "HIP"})
TREE_OPTIONS = frozenset({"LLAMA_OPENSSL", "LLAMA_BUILD_UI", "LLAMA_USE_PREBUILT_UI", "GGML_RPC"})


def settings(tmp_path: Path, env: dict[str, str] | None = None, table: dict[str, object] | None = None) -> Settings:
    return Settings.from_table(tmp_path / "proj", table or {}, env or {})


def tree(tmp_path: Path, **kw: object) -> TreeInfo:
    base = TreeInfo(
        source_dir=tmp_path / "proj" / ".deps" / "llama.cpp",
        options=TREE_OPTIONS,
        languages=ALL_LANGS,
        rpc_target="ggml-rpc-server",
    )
    return replace(base, **kw)  # type: ignore[arg-type]  # test helper: fields by keyword


def toolchain(backend: Backend, **kw: object) -> Toolchain:
    base = Toolchain(
        backend=backend,
        system="Linux",
        cmake=Tool("cmake", "/opt/t/cmake", "cmake version 3.30.0"),
        ninja=Tool("ninja", "/opt/t/ninja", "1.12.1"),
        tools=(Tool("cc", "/usr/bin/cc", "gcc 12"), Tool("c++", "/usr/bin/c++", "g++ 12")),
        launcher=Tool("sccache", "/opt/t/sccache", "sccache 0.16.0"),
    )
    fields = {k: v for k, v in kw.items() if k in Toolchain.__dataclass_fields__}
    facts = {k: str(v) for k, v in kw.items() if k not in fields}  # what a backend's probe found
    return replace(base, facts=facts, **fields)  # type: ignore[arg-type]  # test helper: fields by keyword


def plan(
    tmp_path: Path,
    backend: Backend,
    *,
    defines: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    table: dict[str, object] | None = None,
    tc: dict[str, object] | None = None,
    tr: dict[str, object] | None = None,
) -> BuildPlan:
    s = settings(tmp_path, env, table)
    return plan_build(
        build_request(backend, s, defines=defines or {}),
        s,
        tree=tree(tmp_path, **(tr or {})),
        toolchain=toolchain(backend, **(tc or {})),
        patched_sha=SHA,
    )


def defines(p: BuildPlan) -> dict[str, str]:
    return {d.name: d.value for d in p.defines}


def test_cpu_full_plan(tmp_path: Path) -> None:
    p = plan(tmp_path, "cpu")
    root = tmp_path / "proj"
    assert p.build_dir == root / ".deps" / "llama-build" / f"cpu-{p.digest}"
    assert len(p.digest) == 10
    assert defines(p) == {
        "BUILD_SHARED_LIBS": "OFF",
        "CMAKE_BUILD_TYPE": "Release",
        "CMAKE_CXX_COMPILER_LAUNCHER": "/opt/t/sccache",
        "CMAKE_C_COMPILER_LAUNCHER": "/opt/t/sccache",
        "CMAKE_MAKE_PROGRAM": "/opt/t/ninja",
        "GGML_CCACHE": "OFF",
        "GGML_NATIVE": "OFF",
        "GGML_RPC": "ON",
        "LLAMA_BUILD_UI": "OFF",
        "LLAMA_OPENSSL": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",
    }
    src = str(root / ".deps" / "llama.cpp")
    assert p.configure_argv[:7] == ("/opt/t/cmake", "-S", src, "-B", str(p.build_dir), "-G", "Ninja")
    assert "-DGGML_RPC=ON" in p.configure_argv
    assert p.build_argv == ("/opt/t/ninja", "-C", str(p.build_dir), "llama-server", "ggml-rpc-server")
    assert p.targets == ("llama-server", "ggml-rpc-server")
    assert p.binaries["llama-server"] == p.build_dir / "bin" / "llama-server"
    # path-valued defines are not asserted in the cache; flags are
    assert "CMAKE_C_COMPILER_LAUNCHER" not in p.expectations
    assert p.expectations["GGML_RPC"] == "ON"
    assert p.spot_check_args == ()
    assert p.env_overrides == {
        "SCCACHE_DIR": str(root / ".deps" / "cache" / "sccache"),
        "SCCACHE_SERVER_UDS": str(root / ".deps" / "cache" / "sccache.sock"),
        # the server strips the tree and the build root from object keys
        "SCCACHE_BASEDIRS": f"{p.source_dir}:{p.build_dir.parent}",
    }
    assert p.stamp["patched_sha"] == SHA
    assert p.stamp["generator"] == "Ninja"
    assert p.stamp["tools"]["cmake"] == {"path": "/opt/t/cmake", "version": "cmake version 3.30.0"}
    assert "-DGGML_RPC=ON" in p.stamp["configure_args"]


def test_native_is_off_unless_asked_and_always_off_on_ci(tmp_path: Path) -> None:
    local = plan(tmp_path, "cpu")
    assert defines(local)["GGML_NATIVE"] == "OFF"
    on_ci = plan(tmp_path, "cpu", env={"CI": "true"})
    assert defines(on_ci)["GGML_NATIVE"] == "OFF"
    # same flags locally and on CI: same build dir name, shared compiler cache
    assert on_ci.digest == local.digest
    native = plan(tmp_path, "cpu", env={"SKIPPY_NATIVE": "1"})
    assert "GGML_NATIVE" not in defines(native)
    assert native.digest != local.digest
    assert "GGML_NATIVE" not in defines(plan(tmp_path, "cpu", table={"build": {"native": True}}))
    assert defines(plan(tmp_path, "cpu", env={"CI": "true", "SKIPPY_NATIVE": "1"}))["GGML_NATIVE"] == "OFF"


def test_tree_optional_defines_follow_the_tree(tmp_path: Path) -> None:
    old = plan(tmp_path, "cpu", tr={"options": frozenset({"LLAMA_CURL"})})
    d = defines(old)
    assert d["LLAMA_CURL"] == "OFF"
    assert "LLAMA_OPENSSL" not in d
    assert "LLAMA_BUILD_UI" not in d


def test_no_launcher_means_no_launcher_defines_and_no_cache_env(tmp_path: Path) -> None:
    p = plan(tmp_path, "cuda", tc={"launcher": None})
    assert not [d for d in p.defines if d.name.endswith("_COMPILER_LAUNCHER")]
    assert p.env_overrides == {}


def test_ccache_launcher_env(tmp_path: Path) -> None:
    p = plan(tmp_path, "cpu", tc={"launcher": Tool("ccache", "/usr/bin/ccache", "ccache 4.8")})
    assert defines(p)["CMAKE_CXX_COMPILER_LAUNCHER"] == "/usr/bin/ccache"
    # depend mode: no preprocessor on a hit, and sound for nvcc (see skippy.compile.cache.launcher_env)
    assert p.env_overrides == {
        "CCACHE_DIR": str(tmp_path / "proj" / ".deps" / "cache" / "ccache"),
        "CCACHE_DEPEND": "true",
    }


def test_metal_plan(tmp_path: Path) -> None:
    p = plan(tmp_path, "metal", tc={"system": "Darwin"})
    d = defines(p)
    assert d["GGML_METAL"] == "ON"
    # no other backend's switch is named: the tree leaves them OFF by default
    assert not {"GGML_CUDA", "GGML_HIP", "GGML_VULKAN"} & set(d)
    # the tree does not enable OBJC/OBJCXX: setting their launchers would be "unused"
    assert "CMAKE_OBJC_COMPILER_LAUNCHER" not in d
    with_objc = plan(tmp_path, "metal", tr={"languages": frozenset({"C", "CXX", "OBJC", "OBJCXX"})})
    assert defines(with_objc)["CMAKE_OBJCXX_COMPILER_LAUNCHER"] == "/opt/t/sccache"
    assert p.spot_check_args == ("-ngl", "99")


def test_cuda_plan_defaults(tmp_path: Path) -> None:
    p = plan(tmp_path, "cuda", tc={"cuda_compiler": "/usr/local/cuda/bin/nvcc"})
    d = defines(p)
    assert d["GGML_CUDA"] == "ON"
    assert d["CMAKE_CUDA_ARCHITECTURES"] == DEFAULT_CUDA_ARCHITECTURES
    assert p.provenance["CMAKE_CUDA_ARCHITECTURES"].startswith("default")
    assert d["GGML_CUDA_FA_ALL_QUANTS"] == "ON"
    assert d["CMAKE_CUDA_COMPILER_LAUNCHER"] == "/opt/t/sccache"
    assert d["CMAKE_CUDA_COMPILER"] == "/usr/local/cuda/bin/nvcc"
    assert "CMAKE_HIP_COMPILER_LAUNCHER" not in d
    # the FA value and the architectures are asserted from CMakeCache.txt after configure
    assert p.expectations["GGML_CUDA_FA_ALL_QUANTS"] == "ON"
    assert p.expectations["CMAKE_CUDA_ARCHITECTURES"] == DEFAULT_CUDA_ARCHITECTURES
    assert p.spot_check_args == ("-ngl", "99")


def test_cuda_architectures_precedence(tmp_path: Path) -> None:
    detected = plan(tmp_path, "cuda", tc={"cuda_architectures": "86;89"})
    assert defines(detected)["CMAKE_CUDA_ARCHITECTURES"] == "86;89"
    assert detected.provenance["CMAKE_CUDA_ARCHITECTURES"] == "detected (nvidia-smi)"
    table = plan(tmp_path, "cuda", table={"build": {"cuda_architectures": "75"}}, tc={"cuda_architectures": "86"})
    assert defines(table)["CMAKE_CUDA_ARCHITECTURES"] == "75"
    env = plan(tmp_path, "cuda", env={"CUDAARCHS": "80"}, table={"build": {"cuda_architectures": "75"}})
    assert defines(env)["CMAKE_CUDA_ARCHITECTURES"] == "80"
    given = plan(tmp_path, "cuda", defines={"CMAKE_CUDA_ARCHITECTURES": "90"}, env={"CUDAARCHS": "80"})
    assert defines(given)["CMAKE_CUDA_ARCHITECTURES"] == "90"
    assert given.provenance["CMAKE_CUDA_ARCHITECTURES"] == "given"
    assert given.expectations["CMAKE_CUDA_ARCHITECTURES"] == "90"
    assert len({detected.digest, table.digest, env.digest, given.digest}) == 4


def _declare_compression(tmp_path: Path) -> None:
    ggml = tree(tmp_path).source_dir / "ggml"
    ggml.mkdir(parents=True)
    (ggml / "CMakeLists.txt").write_text('set(GGML_CUDA_COMPRESSION_MODE "size" CACHE STRING "...")\n')


def test_cuda_compression_mode_only_where_the_tree_and_the_toolkit_read_it(tmp_path: Path) -> None:
    assert "GGML_CUDA_COMPRESSION_MODE" not in defines(plan(tmp_path, "cuda")), "an older tree: unused"
    _declare_compression(tmp_path)
    assert defines(plan(tmp_path, "cuda", tc={"cuda_version": "13.0.88"}))["GGML_CUDA_COMPRESSION_MODE"] == "balance"
    assert defines(plan(tmp_path, "cuda", tc={"cuda_version": "12.8"}))["GGML_CUDA_COMPRESSION_MODE"] == "balance"
    old_toolkit = plan(tmp_path, "cuda", tc={"cuda_version": "12.6.3"})
    assert "GGML_CUDA_COMPRESSION_MODE" not in defines(old_toolkit), "CUDA < 12.8: the tree does not read it"


def test_cuda_compression_mode_is_balance_unless_given(tmp_path: Path) -> None:
    _declare_compression(tmp_path)
    p = plan(tmp_path, "cuda")
    assert defines(p)["GGML_CUDA_COMPRESSION_MODE"] == DEFAULT_COMPRESSION_MODE == "balance"
    assert p.expectations["GGML_CUDA_COMPRESSION_MODE"] == "balance"
    assert "cache hit" in p.provenance["GGML_CUDA_COMPRESSION_MODE"]
    given = plan(tmp_path, "cuda", defines={"GGML_CUDA_COMPRESSION_MODE": "size"})
    assert defines(given)["GGML_CUDA_COMPRESSION_MODE"] == "size"
    assert given.expectations["GGML_CUDA_COMPRESSION_MODE"] == "size"
    assert given.digest != p.digest, "another compression, another build dir"
    assert "GGML_CUDA_COMPRESSION_MODE" not in defines(plan(tmp_path, "cpu"))
    assert "GGML_CUDA_COMPRESSION_MODE" not in defines(plan(tmp_path, "rocm"))


def test_cuda_fa_all_quants_opt_out(tmp_path: Path) -> None:
    posarg = plan(tmp_path, "cuda", defines={"GGML_CUDA_FA_ALL_QUANTS": "OFF"})
    assert defines(posarg)["GGML_CUDA_FA_ALL_QUANTS"] == "OFF"
    assert posarg.expectations["GGML_CUDA_FA_ALL_QUANTS"] == "OFF"
    table = plan(tmp_path, "cuda", table={"build": {"cuda_fa_all_quants": False}})
    assert defines(table)["GGML_CUDA_FA_ALL_QUANTS"] == "OFF"
    assert "GGML_CUDA_FA_ALL_QUANTS" not in defines(plan(tmp_path, "cpu"))


def test_vulkan_plan(tmp_path: Path) -> None:
    p = plan(tmp_path, "vulkan", tc={"vulkan_include_dir": "/opt/vk/include"})
    d = defines(p)
    assert d["GGML_VULKAN"] == "ON"
    assert d["Vulkan_INCLUDE_DIR"] == "/opt/vk/include"
    assert "Vulkan_INCLUDE_DIR" not in p.expectations
    assert p.spot_check_env["MESA_SHADER_CACHE_DIR"] == str(tmp_path / "proj" / ".deps" / "cache" / "mesa-shader-cache")
    assert p.spot_check_env["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert p.spot_check_args == ("-ngl", "99")
    # a different header dir is the same flags: same build dir, new stamp
    other = plan(tmp_path, "vulkan", tc={"vulkan_include_dir": "/elsewhere/include"})
    assert other.digest == p.digest
    assert other.stamp != p.stamp


def test_rocm_plan(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        "rocm",
        tc={"hip_compiler": "/opt/rocm/llvm/bin/clang++", "hip_path": "/opt/rocm", "amdgpu_targets": "gfx1100"},
    )
    d = defines(p)
    assert d["GGML_HIP"] == "ON"
    assert d["CMAKE_POSITION_INDEPENDENT_CODE"] == "ON"
    assert d["AMDGPU_TARGETS"] == "gfx1100"
    assert d["CMAKE_HIP_COMPILER"] == "/opt/rocm/llvm/bin/clang++"
    assert d["CMAKE_HIP_COMPILER_LAUNCHER"] == "/opt/t/sccache"
    assert "CMAKE_CUDA_COMPILER_LAUNCHER" not in d
    assert p.env_overrides["HIP_PATH"] == "/opt/rocm"
    assert p.env["HIP_PATH"] == "/opt/rocm"
    default = plan(tmp_path, "rocm")
    assert defines(default)["AMDGPU_TARGETS"] == DEFAULT_AMDGPU_TARGETS
    # the Debian root looks for no GPU: one target, unless one is given
    in_root = plan(tmp_path, "rocm", tc={"rocm_toolkit": "debian-root"})
    assert defines(in_root)["AMDGPU_TARGETS"] == ROOT_DEFAULT_AMDGPU_TARGETS == "gfx1100"
    given_in_root = plan(
        tmp_path, "rocm", defines={"AMDGPU_TARGETS": "gfx90a;gfx942"}, tc={"rocm_toolkit": "debian-root"}
    )
    assert defines(given_in_root)["AMDGPU_TARGETS"] == "gfx90a;gfx942"
    given = plan(tmp_path, "rocm", defines={"AMDGPU_TARGETS": "gfx90a"}, tc={"amdgpu_targets": "gfx1100"})
    assert defines(given)["AMDGPU_TARGETS"] == "gfx90a"
    gpu_targets = plan(tmp_path, "rocm", defines={"GPU_TARGETS": "gfx942"})
    assert "AMDGPU_TARGETS" not in defines(gpu_targets)
    assert defines(gpu_targets)["GPU_TARGETS"] == "gfx942"


def test_old_tree_rpc_target(tmp_path: Path) -> None:
    p = plan(tmp_path, "cpu", tr={"rpc_target": "rpc-server"})
    assert p.targets == ("llama-server", "rpc-server")
    assert p.build_argv[-1] == "rpc-server"
    assert p.rpc_target_known
    unknown = plan(tmp_path, "cpu", tr={"rpc_target": None})
    assert not unknown.rpc_target_known


def test_the_command_lines_defines_are_parsed_once_and_win(tmp_path: Path) -> None:
    """The option table's converter parses each -D into (name, value) once; the request holds them
    by name (a name given twice keeps its last value), and the plan passes each to CMake as
    ``-DNAME=VALUE`` over its own value: configure gets nothing else."""
    options = session_options(["-DGGML_RPC=OFF", "-D", "FOO:STRING=bar", "-DGGML_RPC=ON", "-DL=a;b", "-DE=x=y"], {})
    pairs = (("GGML_RPC", "OFF"), ("FOO", "bar"), ("GGML_RPC", "ON"), ("L", "a;b"), ("E", "x=y"))
    assert options.define == pairs
    s = settings(tmp_path)
    request = build_request("cpu", s, defines=options.define)
    assert dict(request.defines) == {"GGML_RPC": "ON", "FOO": "bar", "L": "a;b", "E": "x=y"}
    p = plan_build(request, s, tree=tree(tmp_path), toolchain=toolchain("cpu"), patched_sha=SHA)
    d = defines(p)
    assert (d["GGML_RPC"], d["FOO"], d["L"], d["E"]) == ("ON", "bar", "a;b", "x=y")
    assert p.provenance["GGML_RPC"] == "given"
    # each once, in the plan's order (by name)
    given = [a for a in p.configure_argv if a.split("=")[0] in ("-DGGML_RPC", "-DFOO", "-DL", "-DE")]
    assert given == ["-DE=x=y", "-DFOO=bar", "-DGGML_RPC=ON", "-DL=a;b"]
    assert p.configure_argv[7:] == tuple(x.arg for x in p.defines)
    assert p.stamp["configure_args"] == [x.arg for x in p.defines]
    # the same defines as a mapping: the same plan
    same = plan_build(
        build_request("cpu", s, defines=dict(request.defines)),
        s,
        tree=tree(tmp_path),
        toolchain=toolchain("cpu"),
        patched_sha=SHA,
    )
    assert (same.configure_argv, same.build_argv, same.build_dir) == (p.configure_argv, p.build_argv, p.build_dir)


def test_other_targets_or_defines_are_another_request_planned_again(tmp_path: Path) -> None:
    """Upstream's tests ask for the same build with other targets (the same dir, its build line
    naming them) or with LLAMA_BUILD_TESTS=ON (a dir of their own): each is a plan of its own."""
    s = settings(tmp_path)
    request = build_request("cpu", s, defines={"GGML_RPC": "ON"}, jobs=2)
    base = plan_build(request, s, tree=tree(tmp_path, rpc_target=None), toolchain=toolchain("cpu"), patched_sha=SHA)
    assert not base.rpc_target_known
    tests = plan_build(
        request.with_targets(["test-a", "test-b"]),
        s,
        tree=tree(tmp_path, rpc_target=None),
        toolchain=toolchain("cpu"),
        patched_sha=SHA,
    )
    assert tests.targets == ("test-a", "test-b") and tests.rpc_target_known
    assert tests.build_argv == (*base.build_argv[: -len(base.targets)], "test-a", "test-b")
    assert tests.build_argv[3:5] == ("-j", "2")
    assert (tests.configure_argv, tests.build_dir, tests.stamp) == (base.configure_argv, base.build_dir, base.stamp)
    assert dict(tests.binaries) == {t: base.build_dir / "bin" / t for t in ("test-a", "test-b")}
    own = plan_build(
        request.with_define(TESTS_SWITCH, "ON"), s, tree=tree(tmp_path), toolchain=toolchain("cpu"), patched_sha=SHA
    )
    assert TESTS_DEFINE in own.configure_argv and TESTS_DEFINE in own.stamp["configure_args"]
    assert own.build_dir != base.build_dir and defines(own)["GGML_RPC"] == "ON"
    assert dict(request.defines) == {"GGML_RPC": "ON"}, "the request asked first is unchanged"


def test_flags_change_the_build_dir_but_tools_do_not(tmp_path: Path) -> None:
    base = plan(tmp_path, "cpu")
    moved = plan(tmp_path, "cpu", tc={"cmake": Tool("cmake", "/new/venv/bin/cmake", "cmake version 3.31")})
    assert moved.build_dir == base.build_dir
    assert moved.stamp["tools"] != base.stamp["tools"]
    flagged = plan(tmp_path, "cpu", defines={"GGML_CPU_REPACK": "OFF"})
    assert flagged.build_dir != base.build_dir
    assert plan(tmp_path, "cuda").build_dir.name.startswith("cuda-")


def test_jobs(tmp_path: Path) -> None:
    s = settings(tmp_path)
    p = plan_build(build_request("cpu", s, jobs=3), s, tree=tree(tmp_path), toolchain=toolchain("cpu"), patched_sha=SHA)
    assert p.build_argv[3:5] == ("-j", "3")
    from_env = plan(tmp_path, "cpu", env={"SKIPPY_BUILD_JOBS": "2"})
    assert from_env.build_argv[3:5] == ("-j", "2")


def test_build_root_inside_the_tree_is_refused(tmp_path: Path) -> None:
    s = Settings.from_table(tmp_path / "proj", {"build_root": ".deps/llama.cpp/build"}, {})
    with pytest.raises(BuildError, match="inside the source tree"):
        plan_build(build_request("cpu", s), s, tree=tree(tmp_path), toolchain=toolchain("cpu"), patched_sha=SHA)


def test_requested_defines_precedence(tmp_path: Path) -> None:
    """The request's defines: what the backend reads from [tool.skippy.build] and the environment,
    under the command line's (any backend's name is passed on)."""
    s = settings(tmp_path, {"CUDAARCHS": "80"}, {"build": {"cuda_architectures": "75", "vulkan_include_dir": "/v"}})
    given = {"AMDGPU_TARGETS": "gfx90a"}
    assert dict(build_request("cuda", s, defines=given).defines) == {
        "CMAKE_CUDA_ARCHITECTURES": "80",
        "AMDGPU_TARGETS": "gfx90a",
    }
    vulkan = build_request("vulkan", s, defines=given)
    assert dict(vulkan.defines) == {"Vulkan_INCLUDE_DIR": "/v", "AMDGPU_TARGETS": "gfx90a"}
    assert vulkan.spec.name == vulkan.backend == "vulkan"
    assert build_request(" Vulkan ", s).spec is vulkan.spec, "the name is resolved to its registry entry"


def test_backend_settings_do_not_leak_into_other_backends(tmp_path: Path) -> None:
    table: dict[str, object] = {
        "build": {"cuda_architectures": "75", "cuda_fa_all_quants": False, "amdgpu_targets": "gfx90a"}
    }
    cpu = plan(tmp_path, "cpu", env={"CUDAARCHS": "80"}, table=table)
    names = set(defines(cpu))
    # they would be "manually-specified variables not used by the project"
    assert not names & {"CMAKE_CUDA_ARCHITECTURES", "GGML_CUDA_FA_ALL_QUANTS", "AMDGPU_TARGETS"}
    assert defines(plan(tmp_path, "rocm", table=table))["AMDGPU_TARGETS"] == "gfx90a"


def test_unknown_build_table_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cuda_arch"):
        plan(tmp_path, "cuda", table={"build": {"cuda_arch": "86"}})


def test_each_workdir_has_its_own_build_dir_and_the_default_keeps_its_name(tmp_path: Path) -> None:
    default = plan(tmp_path, "cpu")
    # the name of the default workdir's cpu build: existing machines keep their configured dir;
    # change this only knowingly (it costs one reconfigure; the compile lines, hence the compiler
    # cache's objects, stay the same).  It changed once, from cpu-7ec5ad5109, when the other
    # backends' switches (-DGGML_CUDA=OFF ...: CMake cache values, not compile flags) left the key
    assert default.build_dir.name == "cpu-ecc8cbedc2"
    # the default workdir named explicitly, or through a link, is the same tree
    (tmp_path / "proj" / ".deps" / "llama.cpp").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "proj" / ".deps" / "llama.cpp")
    assert plan(tmp_path, "cpu", tr={"source_dir": tmp_path / "link"}).build_dir == default.build_dir
    other = plan(tmp_path, "cpu", tr={"source_dir": tmp_path / "proj" / ".deps" / "other"})
    third = plan(tmp_path, "cpu", tr={"source_dir": tmp_path / "elsewhere" / "llama.cpp"})
    names = {default.build_dir.name, other.build_dir.name, third.build_dir.name}
    assert len(names) == 3, "two workdirs never share a build dir"
    assert {other.build_dir.parent, third.build_dir.parent} == {default.build_dir.parent}
    assert other.stamp["source_dir"] == str(tmp_path / "proj" / ".deps" / "other")
    # the same other workdir always gets the same dir (its objects are reused)
    assert plan(tmp_path, "cpu", tr={"source_dir": tmp_path / "proj" / ".deps" / "other"}).build_dir == other.build_dir


@pytest.mark.parametrize("backend", names())
def test_a_backend_names_no_other_backends_switch_but_one_the_tree_turns_on_by_default_there(
    tmp_path: Path, backend: str
) -> None:
    linux = defines(plan(tmp_path, backend))
    own = spec(backend).switch
    assert {b.switch for b in registry().values() if b.switch in linux} == ({own} if own else set())
    # on macOS the tree turns Metal on by default: the CPU build there turns it off
    mac = defines(plan(tmp_path, "cpu", tc={"system": "Darwin"}))
    assert mac["GGML_METAL"] == "OFF"
    assert "GGML_METAL" not in defines(plan(tmp_path, "cpu"))
