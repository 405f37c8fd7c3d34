"""Pure pieces of the build: the configure decision, CMake output parsing,
cache assertions, compiler-cache statistics, toolchain parsers, session args
and the skip-unavailable rule."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from skippy.cli.build import session_request
from skippy.cli.entries import session_options
from skippy.compile.backends.cuda import parse_cuda_compute_caps
from skippy.compile.backends.rocm import parse_amdgpu_targets
from skippy.compile.backends.vulkan import parse_vulkan_header
from skippy.compile.cachestats import ccache_counts, sccache_counts
from skippy.compile.configure import cache_mismatches, decide_configure, parse_cmake_cache, parse_unused_variables
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.tool import Tool
from skippy.compile.toolchain import (
    Toolchain,
    TreeInfo,
    check_tree_needs,
    host_platform,
    parse_cmake_languages,
    parse_cmake_options,
    parse_ninja_targets,
    parse_os_release,
    parse_rpc_target,
    probe_toolchain,
)
from skippy.core.errors import SettingsError, ToolchainMissing
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import Collaborators, SessionRequest, SpotCheckRequest, run_build_session


def _plan(tmp_path: Path) -> BuildPlan:
    tc = Toolchain(
        backend="cpu",
        system="Linux",
        cmake=Tool("cmake", "/t/cmake", "3.30"),
        ninja=Tool("ninja", "/t/ninja", "1.12"),
    )
    tree = TreeInfo(tmp_path / "src", frozenset(), frozenset({"C", "CXX"}), "ggml-rpc-server")
    settings = Settings.from_table(tmp_path, {}, {})
    return plan_build(build_request("cpu", settings), settings, tree=tree, toolchain=tc, patched_sha="b" * 40)


def _cache(plan: BuildPlan, **over: str) -> dict[str, str]:
    base = {
        "CMAKE_GENERATOR": "Ninja",
        "CMAKE_HOME_DIRECTORY": str(plan.source_dir),
        "CMAKE_COMMAND": "/t/cmake",
        "CMAKE_MAKE_PROGRAM": "/t/ninja",
    }
    base.update(over)
    return base


def _decide(
    plan: BuildPlan, stamp: Mapping[str, Any] | None, cache: Mapping[str, str] | None, ninja: bool = True
) -> tuple[bool, bool, str]:
    d = decide_configure(plan, stamp=stamp, cache=cache, has_build_ninja=ninja, exists=lambda p: p.startswith("/t/"))
    return d.needed, d.wipe, d.reason


def test_configure_decision(tmp_path: Path) -> None:
    p = _plan(tmp_path)
    stamp = dict(p.stamp)
    assert _decide(p, None, None) == (True, False, "new build directory")
    assert _decide(p, stamp, _cache(p)) == (False, False, "up to date")
    needed, wipe, reason = _decide(p, stamp, _cache(p, CMAKE_GENERATOR="Unix Makefiles"))
    assert (needed, wipe) == (True, True)
    assert "generator mismatch" in reason
    assert "Unix Makefiles" in reason
    assert "cmake this dir was configured with is gone" in _decide(p, stamp, _cache(p, CMAKE_COMMAND="/old/cmake"))[2]
    assert "ninja" in _decide(p, stamp, _cache(p, CMAKE_MAKE_PROGRAM="/old/ninja"))[2]
    assert "another source tree" in _decide(p, stamp, _cache(p, CMAKE_HOME_DIRECTORY="/x"))[2]
    assert _decide(p, stamp, _cache(p), ninja=False)[:2] == (True, True)
    assert "outside skippy" in _decide(p, None, _cache(p))[2]
    moved_sha = {**stamp, "patched_sha": "c" * 40}
    assert _decide(p, moved_sha, _cache(p)) == (True, True, "the patched tree changed")
    new_tools = {**stamp, "tools": {"cmake": {"path": "/t/cmake", "version": "3.31"}}}
    assert _decide(p, new_tools, _cache(p))[2] == "the tools changed"
    both = {**moved_sha, "configure_args": []}
    assert _decide(p, both, _cache(p))[2] == "the configure arguments changed; the patched tree changed"


CMAKE_OUTPUT = """-- Configuring done (0.3s)
-- Generating done (0.0s)
CMake Warning:
  Manually-specified variables were not used by the project:

    GGML_TYPO
    LLAMA_GONE


-- Build files have been written to: /b
"""


def test_parse_unused_variables() -> None:
    assert parse_unused_variables(CMAKE_OUTPUT) == ["GGML_TYPO", "LLAMA_GONE"]
    assert parse_unused_variables("-- Configuring done\n-- Generating done\n") == []


def test_parse_cmake_cache_and_mismatches() -> None:
    cache = parse_cmake_cache(
        "# comment\n//help text\nGGML_RPC:BOOL=ON\nGGML_CUDA_FA_ALL_QUANTS:BOOL=FALSE\n"
        "CMAKE_CUDA_ARCHITECTURES:STRING=86;89\nEMPTY:STRING=\n"
    )
    assert cache == {
        "GGML_RPC": "ON",
        "GGML_CUDA_FA_ALL_QUANTS": "FALSE",
        "CMAKE_CUDA_ARCHITECTURES": "86;89",
        "EMPTY": "",
    }
    assert cache_mismatches({"GGML_RPC": "ON", "CMAKE_CUDA_ARCHITECTURES": "86;89"}, cache) == {}
    wrong = cache_mismatches({"GGML_CUDA_FA_ALL_QUANTS": "ON", "MISSING": "1", "GGML_RPC": "TRUE"}, cache)
    assert wrong == {"GGML_CUDA_FA_ALL_QUANTS": ("ON", "FALSE"), "MISSING": ("1", "<unset>")}


def test_sccache_and_ccache_counts() -> None:
    stats = {
        "stats": {
            "cache_hits": {"counts": {"C/C++": 7, "CUDA": 2}},
            "cache_misses": {"counts": {"C/C++": 1}},
        }
    }
    assert sccache_counts(json.dumps(stats)) == (9, 1)
    assert sccache_counts('{"stats": {}}') == (0, 0)
    with pytest.raises(ValueError):
        sccache_counts("sccache: Starting the server...")
    text = "stats_updated_timestamp\t1700000000\ndirect_cache_hit\t5\npreprocessed_cache_hit\t2\ncache_miss\t3\n"
    assert ccache_counts(text) == (7, 3)


def test_toolchain_parsers() -> None:
    assert parse_cuda_compute_caps("8.6\n8.9\n8.6\n") == "86;89"
    assert parse_cuda_compute_caps("No devices were found\n") is None
    rocminfo = "  Name:                    gfx000\n  Name:                    gfx1100\n  Name: gfx90a\n"
    assert parse_amdgpu_targets(rocminfo) == "gfx1100;gfx90a"
    assert parse_amdgpu_targets("") is None
    header = (
        "#define VK_HEADER_VERSION 239\n"
        "#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n"
        "#define VK_KHR_surface 1\n"
    )
    version, features = parse_vulkan_header(header)
    assert version == "1.3.239"
    assert "VK_KHR_surface" in features
    assert "VK_EXT_layer_settings" not in features
    assert "VK_EXT_layer_settings" in parse_vulkan_header(header + "#define VK_EXT_layer_settings 1\n")[1]
    assert parse_os_release("ID=ubuntu\nID_LIKE=debian\n") == "debian"
    assert parse_os_release("ID=arch\n") == "arch"
    assert parse_os_release("ID=fedora\n") is None
    assert host_platform("Darwin", None) == "macos"
    assert parse_rpc_target("set(TARGET rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)\n") == "rpc-server"
    assert parse_rpc_target("add_executable(ggml-rpc-server rpc-server.cpp)") == "ggml-rpc-server"
    assert parse_rpc_target("add_executable(other x.cpp)") is None
    assert parse_cmake_options('option(GGML_RPC "x" OFF)\n  OPTION( LLAMA_CURL "y" ON)') == {"GGML_RPC", "LLAMA_CURL"}
    assert parse_cmake_languages('project("ggml" C CXX ASM)\nenable_language(CUDA)') == {"C", "CXX", "CUDA"}
    assert parse_ninja_targets("llama-server: phony\nbin/llama-server: CXX_EXECUTABLE_LINKER\n") == {
        "llama-server",
        "bin/llama-server",
    }


def test_vulkan_headers_too_old_for_the_tree_fail_before_configure(tmp_path: Path) -> None:
    vk = tmp_path / "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    vk.parent.mkdir(parents=True)
    vk.write_text("vk::LayerSettingEXT setting{};\n", encoding="utf-8")
    tree = TreeInfo(tmp_path, frozenset(), frozenset(), "ggml-rpc-server")
    old = Toolchain(
        backend="vulkan",
        system="Linux",
        cmake=Tool("cmake", "/t/cmake", "3.30"),
        ninja=Tool("ninja", "/t/ninja", "1.12"),
        facts={"vulkan_include_dir": "/usr/include", "vulkan_header_version": "1.3.239"},
        features=frozenset({"VK_KHR_surface"}),
    )
    with pytest.raises(ToolchainMissing) as info:
        check_tree_needs(tree, old)
    text = info.value.render()
    assert "VK_EXT_layer_settings" in text
    assert "1.3.239" in text
    assert "-DVulkan_INCLUDE_DIR" in text
    check_tree_needs(tree, replace(old, features=frozenset({"VK_EXT_layer_settings"})))
    check_tree_needs(tree, replace(old, backend="cpu"))


#: settings with nothing set (no file is read: the project is not there)
NO_SETTINGS = Settings.from_table(Path("/nonexistent/proj"), {}, {})


def parse_session_args(argv: list[str], env: dict[str, str], backend: str = "cpu") -> SessionRequest:
    return session_request(session_options(argv, env, backend), NO_SETTINGS)


def test_session_args() -> None:
    a = parse_session_args(["--skip-unavailable", "-j2", "-DGGML_RPC=ON", "--no-spot-check"], {})
    assert (a.skip_unavailable, a.spot_check, a.build.jobs, dict(a.build.defines)) == (
        True,
        False,
        2,
        {"GGML_RPC": "ON"},
    )
    b = parse_session_args(["--jobs", "4", "--model", "tiny:llama"], {"SKIPPY_SKIP_UNAVAILABLE": "1"})
    assert (b.skip_unavailable, b.spot_check, b.build.jobs, dict(b.build.defines), b.models) == (
        True,
        True,
        4,
        {},
        ("tiny:llama",),
    )
    assert (a.backend, a.build.spec.name) == ("cpu", "cpu")
    assert not parse_session_args([], {"SKIPPY_SKIP_UNAVAILABLE": "0"}).skip_unavailable
    c = session_options(["-D", "A=1", "-DB:STRING=two words", "--json", "-v", "-j", "3"], {}, "cuda")
    assert (c.define, c.json, c.verbose, c.jobs, c.backend) == (
        (("A", "1"), ("B", "two words")),
        True,
        True,
        3,
        "cuda",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-spotcheck"], "unknown option --no-spotcheck (did you mean --no-spot-check?)"),
        (["-DGGML_RPC=ON", "--fresh"], "unknown option --fresh"),
        (["-G", "Ninja"], "unknown option -G"),
        (["Release"], "unexpected argument Release"),
        (["--no-spot"], "unknown option --no-spot (did you mean --no-spot-check?)"),
        (["-j", "zero"], "-j/--jobs: wants a positive number of jobs, got 'zero'"),
        (["-j0"], "-j/--jobs: wants a positive number of jobs, got '0'"),
        (["-DNOVALUE"], "-D/--define: -DNOVALUE is not a CMake define: it wants -DNAME=VALUE or -DNAME:TYPE=VALUE"),
        (["-D"], "expected one argument"),
    ],
)
def test_session_args_refuse_what_is_not_an_option(args: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_session_args(args, {}, "cpu")
    err = info.value
    # the parser's own errors name the session; a bad value names its option
    assert err.what.startswith("nox -s build-cpu --: ") or err.what.startswith("-")
    assert message in err.what
    assert err.untouched == "everything: nothing was started"
    if err.what.startswith("-"):
        assert err.next_step  # a bad value: its option is named, the others are not listed
        return
    assert "--help" in str(err.next_step)
    assert err.details is not None
    for option in (
        "-D, --define NAME[:TYPE]=VALUE",
        "-j, --jobs N",
        "--skip-unavailable",
        "--no-spot-check",
        "--json",
        "--workdir-as-is",
    ):
        assert option in err.details


def test_metal_on_linux_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    s = Settings.from_table(tmp_path, {}, {"PATH": str(tmp_path)})
    with pytest.raises(ToolchainMissing) as info:
        probe_toolchain("metal", s, system="Linux", os_release="ID=debian\n")
    text = info.value.render()
    assert "needs macOS with Xcode command line tools (this host is Linux)" in text
    assert "--skip-unavailable" in text
    assert info.value.exit_code != 0


class _Recorder:
    def __init__(self) -> None:
        self.prepared = 0
        self.checked = 0

    def prepare(self, settings: Settings, console: Console, backend: str) -> Any:
        self.prepared += 1
        raise AssertionError("an unavailable backend must not prepare the tree")

    def spot_check(self, settings: Settings, request: SpotCheckRequest, console: Console) -> object:
        self.checked += 1
        return None


def test_unavailable_backend_fails_unless_skipping_was_asked(tmp_path: Path) -> None:
    # no compiler on PATH: every backend is unavailable here, on any machine
    s = Settings.from_table(tmp_path, {}, {"PATH": str(tmp_path)})
    console = Console(env={}, stream=io.StringIO())
    rec = _Recorder()
    calls = Collaborators(prepare=rec.prepare, spot_check=rec.spot_check)
    rocm = build_request("rocm", s)
    with pytest.raises(ToolchainMissing):
        run_build_session(SessionRequest(rocm), s, console, calls)
    outcome = run_build_session(SessionRequest(rocm, skip_unavailable=True), s, console, calls)
    assert outcome.skipped
    assert outcome.build is None
    # SKIPPY_SKIP_UNAVAILABLE is the option's default, read once from the option table (not by the session)
    from_env = session_request(session_options([], {"SKIPPY_SKIP_UNAVAILABLE": "1"}, "rocm"), s)
    assert from_env.backend == "rocm"
    assert run_build_session(from_env, s, console, calls).skipped
    assert rec.prepared == 0
    assert rec.checked == 0


def test_provenance_defines_only_for_trees_that_declare_them(tmp_path: Path) -> None:
    """The queue's provenance goes to trees that know the variables, and stays out of the dir digest."""
    from skippy.compile.plan import PROVENANCE_DEFINES

    assert parse_cmake_options('set(SKIPPY_UPSTREAM_SHA "" CACHE STRING "x")\noption(GGML_RPC "rpc" OFF)\n') == {
        "SKIPPY_UPSTREAM_SHA",
        "GGML_RPC",
    }
    tc = Toolchain(
        backend="cpu",
        system="Linux",
        cmake=Tool("cmake", "/t/cmake", "3.30"),
        ninja=Tool("ninja", "/t/ninja", "1.12"),
    )
    settings = Settings.from_table(tmp_path, {}, {})

    def plan(options: frozenset[str], patched: str, digest: str) -> BuildPlan:
        tree = TreeInfo(tmp_path / "src", options, frozenset({"C", "CXX"}), "ggml-rpc-server")
        return plan_build(
            build_request("cpu", settings),
            settings,
            tree=tree,
            toolchain=tc,
            patched_sha=patched,
            upstream_sha="a" * 40,
            queue_digest=digest,
        )

    with_a = plan(frozenset(PROVENANCE_DEFINES), "b" * 40, "1" * 64)
    with_b = plan(frozenset(PROVENANCE_DEFINES), "c" * 40, "2" * 64)
    assert with_a.define("SKIPPY_UPSTREAM_SHA") == "a" * 40
    assert with_a.define("SKIPPY_QUEUE_DIGEST") == "1" * 64
    assert with_b.define("SKIPPY_QUEUE_DIGEST") == "2" * 64
    assert "-DSKIPPY_QUEUE_DIGEST=" + "2" * 64 in with_b.configure_argv
    assert with_a.build_dir == with_b.build_dir, "a queue change must reuse the build dir"
    # a tree without the provenance patch gets no such -D (CMake would report it unused)
    assert plan(frozenset(), "b" * 40, "1" * 64).define("SKIPPY_UPSTREAM_SHA") is None


def test_build_info_is_pinned_to_the_upstream_commit(tmp_path: Path) -> None:
    """A new patched commit must not recompile all of libllama: the tree's git-derived build info is
    replaced by the upstream commit, for trees that accept it from -D."""
    from skippy.compile.toolchain import inspect_tree

    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "project(llama C CXX)\n"
        "if (NOT DEFINED LLAMA_BUILD_NUMBER)\n  set(LLAMA_BUILD_NUMBER ${BUILD_NUMBER})\nendif()\n"
        "if (NOT DEFINED LLAMA_BUILD_COMMIT)\n  set(LLAMA_BUILD_COMMIT ${BUILD_COMMIT})\nendif()\n",
        encoding="utf-8",
    )
    tree = inspect_tree(src)
    assert tree.build_info_overridable
    tc = Toolchain(
        backend="cpu",
        system="Linux",
        cmake=Tool("cmake", "/t/cmake", "3.30"),
        ninja=Tool("ninja", "/t/ninja", "1.12"),
    )
    settings = Settings.from_table(tmp_path, {}, {})
    plan = plan_build(
        build_request("cpu", settings),
        settings,
        tree=tree,
        toolchain=tc,
        patched_sha="b" * 40,
        upstream_sha="a" * 40,
        build_number=42,
    )
    assert "-DLLAMA_BUILD_COMMIT=" + "a" * 12 in plan.configure_argv
    assert "-DLLAMA_BUILD_NUMBER=42" in plan.configure_argv
    other = plan_build(
        build_request("cpu", settings),
        settings,
        tree=tree,
        toolchain=tc,
        patched_sha="c" * 40,
        upstream_sha="d" * 40,
        build_number=43,
    )
    assert other.build_dir == plan.build_dir
    (src / "CMakeLists.txt").write_text("project(llama C CXX)\nset(LLAMA_BUILD_COMMIT ${BUILD_COMMIT})\n")
    old_tree = inspect_tree(src)
    assert not old_tree.build_info_overridable
    plain = plan_build(
        build_request("cpu", settings),
        settings,
        tree=old_tree,
        toolchain=tc,
        patched_sha="b" * 40,
        upstream_sha="a" * 40,
    )
    assert plain.define("LLAMA_BUILD_COMMIT") is None


def test_backend_uses_and_the_readers_their_lines_lack(tmp_path: Path) -> None:
    from skippy.compile.configure import backend_uses, unreached_readers

    src = tmp_path / "tree"
    commands: list[dict[str, Any]] = [
        {"file": str(src / "ggml/src/ggml-backend-reg.cpp"), "command": "c++ -DGGML_USE_CPU -DGGML_USE_VULKAN -c x"},
        {"file": str(src / "ggml/src/ggml-vulkan/ggml-vulkan.cpp"), "command": "c++ -c y"},
        {"file": str(src / "tools/cvector/cv.cpp"), "arguments": ["c++", "-DGGML_USE_CPU", "-DGGML_USE_VULKAN"]},
        {"file": str(src / "src/llama.cpp"), "command": "c++ -DLLAMA_VERSION=1 -c z"},
        {"file": str(src / "common/reads.cpp"), "command": "c++ -DGGML_USE_CPU -c w"},
        {"file": "/elsewhere/outside.cpp", "command": "c++ -DGGML_USE_CPU"},
    ]
    uses = backend_uses(commands, src)
    assert "/elsewhere/outside.cpp" not in uses and len(uses) == 5
    assert uses["ggml/src/ggml-backend-reg.cpp"] == {"CPU", "VULKAN"}
    texts = {
        "tools/cvector/cv.cpp": "#ifdef GGML_USE_VULKAN\n#endif",  # has it: fine
        "src/llama.cpp": "// GGML_USE_VULKANISH is not the name\n",
        "common/reads.cpp": "#if defined(GGML_USE_VULKAN) || defined(GGML_USE_CPU) || defined(GGML_USE_CUDA)",
    }
    read_files: list[str] = []

    def read(rel: str) -> str:
        read_files.append(rel)
        return texts.get(rel, "")

    # ggml's own sources are ggml's business; CUDA is not enabled, so its absence is no gap
    assert unreached_readers(uses, read) == {"common/reads.cpp": ["GGML_USE_VULKAN"]}
    assert "tools/cvector/cv.cpp" not in read_files, "a line with every enabled name is not read"
    # no registry line (an old tree, or one without ggml): nothing to compare with
    assert unreached_readers({k: v for k, v in uses.items() if not k.startswith("ggml/")}, read) == {}
