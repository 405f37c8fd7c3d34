"""Real CMake + Ninja against tests/integration/cmake_probe: the -D values the
project receives, unused-variable detection, cache assertions, stamps
(skip / reconfigure), generator mismatch and moved-tool recovery, RPC target
detection, and the compiler cache."""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, execute_plan, newest_builds
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.configure import parse_cmake_cache
from skippy.compile.plan import TESTS_DEFINE, BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, inspect_tree, parse_ninja_targets, probe_toolchain, tool_version
from skippy.core import proc
from skippy.core.errors import BuildError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.upstream_tests.tree import Subject, _Tree, builds_tests

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"
SHA = "1" * 40


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.src = tmp_path / "src"
        shutil.copytree(PROBE, self.src)
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path / "home")}
        self.settings = Settings.from_table(tmp_path / "proj", {}, env)
        self.toolchain = probe_toolchain("cpu", self.settings)
        self.out = io.StringIO()
        self.console = Console(env={}, stream=self.out)
        self.plans: list[BuildPlan] = []

    def plan(self, *, sha: str = SHA, toolchain: Toolchain | None = None, **defines: str) -> BuildPlan:
        p = plan_build(
            build_request("cpu", self.settings, defines=defines),
            self.settings,
            tree=inspect_tree(self.src),
            toolchain=toolchain or self.toolchain,
            patched_sha=sha,
        )
        self.plans.append(p)
        return p

    def run(self, plan: BuildPlan) -> BuildReport:
        return execute_plan(plan, self.console)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    for p in e.plans[-1:]:
        stop_cache_server(p)


def values(plan: BuildPlan) -> dict[str, str]:
    text = (plan.build_dir / "probe-values.txt").read_text(encoding="utf-8")
    return dict(line.split("=", 1) for line in text.splitlines())


def test_configure_passes_our_values_and_builds_both_binaries(env: Env) -> None:
    plan = env.plan()
    report = env.run(plan)
    got = values(plan)
    assert got["GGML_RPC"] == "ON"
    assert got["BUILD_SHARED_LIBS"] == "OFF"
    assert got["GGML_CCACHE"] == "OFF"
    assert got["LLAMA_OPENSSL"] == "OFF"
    assert got["LLAMA_BUILD_UI"] == "OFF"
    # the other backends' switches are not given: the tree's defaults (OFF) apply
    assert got["GGML_CUDA"] == got["GGML_METAL"] == got["GGML_HIP"] == got["GGML_VULKAN"] == "OFF"
    assert not [d for d in plan.defines if d.name in ("GGML_CUDA", "GGML_METAL", "GGML_HIP", "GGML_VULKAN")]
    assert got["CMAKE_BUILD_TYPE"] == "Release"
    assert report.configured
    assert report.compiled == 3
    assert not plan.build_dir.is_relative_to(env.src)
    for name in ("llama-server", "ggml-rpc-server"):
        out = proc.run([report.binaries[name]], env=env.settings.env)
        assert "stand-in 42" in out.stdout
    cache = parse_cmake_cache((plan.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))
    assert cache["CMAKE_GENERATOR"] == "Ninja"
    if env.toolchain.launcher is not None:
        assert got["CMAKE_CXX_COMPILER_LAUNCHER"] == env.toolchain.launcher.path
        assert report.cache is not None
        assert report.cache.requests == 3
    assert plan.stamp_path.is_file()


def test_unchanged_stamp_skips_configure(env: Env) -> None:
    plan = env.plan()
    env.run(plan)
    cache_file = plan.build_dir / "CMakeCache.txt"
    before = cache_file.stat().st_mtime_ns
    again = env.run(env.plan())
    assert not again.configured
    assert again.configure_reason == "up to date"
    assert again.compiled == 0
    assert cache_file.stat().st_mtime_ns == before


def test_changed_patched_sha_reconfigures_fresh_in_the_same_dir(env: Env) -> None:
    first = env.plan()
    env.run(first)
    moved = env.plan(sha="2" * 40)
    assert moved.build_dir == first.build_dir
    report = env.run(moved)
    assert report.configured
    assert report.configure_reason == "the patched tree changed"
    assert "reconfiguring" in env.out.getvalue()
    if report.cache is not None and report.compiled:
        # objects under the wiped CMakeFiles/ came back from the compiler cache
        assert report.cache.hits == report.compiled


def test_changed_flags_get_a_new_dir(env: Env) -> None:
    first = env.plan()
    env.run(first)
    other = env.plan(GGML_NATIVE="ON")
    assert other.build_dir != first.build_dir
    report = env.run(other)
    assert report.configure_reason == "new build directory"
    assert values(other)["GGML_NATIVE"] == "ON"
    assert values(first)["GGML_NATIVE"] == "OFF"


def test_unused_variable_fails_the_build(env: Env) -> None:
    plan = env.plan(SKIPPY_NOT_A_VARIABLE="1")
    with pytest.raises(BuildError, match="SKIPPY_NOT_A_VARIABLE") as info:
        env.run(plan)
    assert "did not use" in info.value.what
    assert not plan.stamp_path.exists()
    assert not (plan.build_dir / "bin" / "llama-server").exists()


def test_a_given_variable_the_project_never_declared_fails_before_the_build(env: Env) -> None:
    """A -D typo the project reads anyway (ggml reads every GGML_*; the probe every PROBE_*) is
    "used" to CMake, which then says nothing: skippy names it, with the closest known names."""
    plan = env.plan(PROBE_FAKEGPU_ARHC="gfx1100", PROBE_FAKEGPU="ON")
    with pytest.raises(BuildError) as info:
        env.run(plan)
    error = info.value
    assert error.what == "the project does not know the -D variable(s) you gave: PROBE_FAKEGPU_ARHC"
    assert error.details == (
        f"PROBE_FAKEGPU_ARHC: CMake left it UNINITIALIZED in CMakeCache.txt and no CMake file of {env.src} "
        "names it; closest known: PROBE_FAKEGPU_ARCH, PROBE_FAKEGPU"
    )
    assert error.next_step == "fix or drop them: nox -s build-cpu -- -DPROBE_FAKEGPU_ARCH=gfx1100"
    assert error.exit_code == 12
    assert "PROBE_FAKEGPU_ARHC:UNINITIALIZED=gfx1100" in (plan.build_dir / "CMakeCache.txt").read_text()
    assert not plan.stamp_path.exists(), "the next run configures again"
    assert not (plan.build_dir / "bin" / "llama-server").exists(), "nothing was built"
    # the name spelled right builds
    good = env.run(env.plan(PROBE_FAKEGPU_ARCH="gfx1100", PROBE_FAKEGPU="ON"))
    assert good.configured and (good.build_dir / "bin" / "llama-server").exists()


def test_a_value_clobbered_by_the_project_fails_the_build(env: Env) -> None:
    plan = env.plan(PROBE_CLOBBER_RPC="ON")
    with pytest.raises(BuildError) as info:
        env.run(plan)
    assert "did not keep" in info.value.what
    assert "GGML_RPC: wanted 'ON', CMakeCache.txt has 'OFF'" in (info.value.details or "")


def test_configure_error_is_a_build_error_with_cmake_output(env: Env) -> None:
    with pytest.raises(BuildError) as info:
        env.run(env.plan(GGML_BOGUS="ON"))
    assert "configure failed" in info.value.what
    assert "cmake_probe: unknown option GGML_BOGUS" in (info.value.details or "")


def test_generator_mismatch_is_recovered(env: Env) -> None:
    if proc.which("make", env.settings.env) is None:
        pytest.skip("make is not installed: cannot make a Makefiles build dir")
    plan = env.plan()
    plan.build_dir.mkdir(parents=True)
    proc.run(
        [env.toolchain.cmake.path, "-S", env.src, "-B", plan.build_dir, "-G", "Unix Makefiles"],
        env=env.settings.env,
    )
    report = env.run(plan)
    assert report.configured
    assert "generator mismatch" in report.configure_reason
    assert "Unix Makefiles" in report.configure_reason
    assert (plan.build_dir / "bin" / "llama-server").is_file()


def test_a_cmake_that_moved_is_recovered(env: Env) -> None:
    plan = env.plan()
    env.run(plan)
    cache_file = plan.build_dir / "CMakeCache.txt"
    text = cache_file.read_text(encoding="utf-8")
    old = parse_cmake_cache(text)["CMAKE_COMMAND"]
    cache_file.write_text(text.replace(f"CMAKE_COMMAND:INTERNAL={old}", "CMAKE_COMMAND:INTERNAL=/gone/bin/cmake"))
    report = env.run(env.plan())
    assert report.configured
    assert "is gone" in report.configure_reason
    assert parse_cmake_cache(cache_file.read_text(encoding="utf-8"))["CMAKE_COMMAND"] != "/gone/bin/cmake"


def test_another_cmake_reconfigures(env: Env) -> None:
    """A recreated venv brings another cmake: the stamp notices, the dir is reconfigured."""
    plan = env.plan()
    env.run(plan)
    # the venv's (the wheel) and every other cmake on PATH (the system's: .ci/setup installs Debian's)
    dirs = [str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]
    found = [shutil.which("cmake", path=d) for d in dirs if d]
    others = [f for f in dict.fromkeys(found) if f and Path(f).resolve() != Path(env.toolchain.cmake.path).resolve()]
    if not others:
        pytest.skip("only one cmake on this machine (.ci/setup installs the system's beside the wheel's)")
    other = Tool("cmake", others[0], tool_version(others[0], env.settings.env))
    report = env.run(env.plan(toolchain=replace(env.toolchain, cmake=other)))
    assert report.configured
    assert report.configure_reason == "the tools changed"
    assert parse_cmake_cache((plan.build_dir / "CMakeCache.txt").read_text(encoding="utf-8"))["CMAKE_COMMAND"]


def test_old_tree_builds_rpc_server(env: Env) -> None:
    rpc = env.src / "tools" / "rpc" / "CMakeLists.txt"
    rpc.write_text(rpc.read_text(encoding="utf-8").replace("ggml-rpc-server", "rpc-server"), encoding="utf-8")
    plan = env.plan()
    assert plan.targets == ("llama-server", "rpc-server")
    report = env.run(plan)
    assert report.binaries["rpc-server"].is_file()


def test_rpc_target_found_after_configure_when_the_tree_does_not_say(env: Env) -> None:
    shutil.rmtree(env.src / "tools")
    top = env.src / "CMakeLists.txt"
    top.write_text(
        top.read_text(encoding="utf-8").replace(
            "add_subdirectory(tools/rpc)",
            "add_executable(rpc-server src/rpc.cpp)\ntarget_link_libraries(rpc-server PRIVATE probe_common)",
        ),
        encoding="utf-8",
    )
    plan = env.plan()
    assert not plan.rpc_target_known
    report = env.run(plan)
    assert set(report.binaries) == {"llama-server", "rpc-server"}
    assert report.binaries["rpc-server"].is_file()
    # and again from the stamp, without configuring
    again = env.run(env.plan())
    assert not again.configured
    assert set(again.binaries) == {"llama-server", "rpc-server"}


def test_probe_finds_real_tools(env: Env) -> None:
    tc = env.toolchain
    assert Path(tc.cmake.path).is_file()
    assert tc.cmake.version.startswith("cmake version")
    assert tc.ninja.version[0].isdigit()
    assert {t.name for t in tc.tools} >= {"cc", "c++"}


def test_configure_only_checks_without_building(env: Env) -> None:
    plan = env.plan()
    report = execute_plan(plan, env.console, build=False)
    assert report.configured
    assert report.binaries == {}
    assert plan.stamp_path.is_file()
    assert not (plan.build_dir / "bin" / "llama-server").exists()
    # the next full run resumes from the stamp: no second configure
    full = env.run(env.plan())
    assert not full.configured
    assert full.compiled == 3


def test_given_targets_are_built_alone_and_no_binaries_are_looked_for(env: Env) -> None:
    plan = env.plan()
    execute_plan(plan, env.console, build=False)
    listed = proc.run([env.toolchain.ninja.path, "-C", str(plan.build_dir), "-t", "targets", "all"], env=plan.env)
    objects = sorted(t for t in parse_ninja_targets(listed.stdout) if t.endswith(".o"))
    report = execute_plan(env.plan(), env.console, targets=(objects[0],))
    assert not report.configured
    assert report.compiled == 1
    assert report.binaries == {}
    assert (plan.build_dir / objects[0]).is_file()
    assert not (plan.build_dir / objects[1]).exists()
    assert not (plan.build_dir / "bin" / "llama-server").exists()


def test_ccache_launcher_and_hit_rate(tmp_path: Path) -> None:
    if shutil.which("ccache") is None:
        pytest.skip("ccache is not installed")
    src = tmp_path / "src"
    shutil.copytree(PROBE, src)
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path), "SKIPPY_COMPILER_CACHE": "ccache"}
    settings = Settings.from_table(tmp_path / "proj", {}, env)
    toolchain = probe_toolchain("cpu", settings)
    assert toolchain.launcher is not None
    assert toolchain.launcher.name == "ccache"
    plan = plan_build(
        build_request("cpu", settings), settings, tree=inspect_tree(src), toolchain=toolchain, patched_sha=SHA
    )
    assert plan.env_overrides == {"CCACHE_DIR": str(settings.cache_dir / "ccache"), "CCACHE_DEPEND": "true"}
    console = Console(env={}, stream=io.StringIO())
    cold = execute_plan(plan, console)
    assert values(plan)["CMAKE_C_COMPILER_LAUNCHER"] == toolchain.launcher.path
    assert cold.cache is not None
    assert (cold.cache.hits, cold.cache.misses) == (0, 3)
    shutil.rmtree(plan.build_dir)
    warm = execute_plan(plan, console)
    assert warm.cache is not None
    assert (warm.cache.hits, warm.cache.misses) == (3, 0)
    assert (settings.cache_dir / "ccache").is_dir()


def test_artifact_gate_refuses_a_binary_without_its_backend(env: Env) -> None:
    from skippy.flows.gates import artifact_gate

    plan = env.plan()
    report = env.run(plan)
    # the stand-in server has no backend registration: like a build whose backend switch was ignored
    with pytest.raises(BuildError, match="does not contain the cpu backend: ggml_backend_cpu_reg") as info:
        artifact_gate(plan, report, env.console)
    assert "GGML_RPC=ON" in (info.value.next_step or "")
    assert "GGML_CUDA" not in (info.value.next_step or ""), "no other backend's switch is set"
    assert str(plan.build_dir) in (info.value.next_step or "")
    # the same server with the registration symbols linked in passes
    (env.src / "src" / "common.c").write_text(
        "int probe_answer(void) { return 42; }\n"
        "void ggml_backend_cpu_reg(void) {}\n"
        "void ggml_backend_rpc_reg(void) {}\n",
        encoding="utf-8",
    )
    again = env.run(env.plan())
    artifact_gate(plan, again, env.console)
    assert "contains its backend" in env.out.getvalue()


def test_status_and_the_build_say_where_the_binaries_are(env: Env) -> None:
    from skippy.flows.build_session import where

    plan = env.plan()
    report = env.run(plan)
    out = "\n".join(where(report, env.settings))
    assert f"llama-server: {env.settings.relative(report.binaries['llama-server'])}" in out
    assert "run: " in out and "--model <model.gguf>" in out
    assert "rpc: " in out and "--rpc 127.0.0.1:50052 -ngl 99" in out
    builds = newest_builds(env.settings.build_root)
    assert builds["cpu"]["build_dir"] == str(plan.build_dir)
    assert builds["cpu"]["binaries"]["llama-server"] == str(report.binaries["llama-server"])
    assert builds["cpu"]["patched_sha"] == SHA
    assert builds["cpu"]["mode"] == "prepared"


def test_a_source_reading_a_backend_use_its_line_lacks_fails_before_the_build(env: Env) -> None:
    """Queue patch 0005 gives GGML_USE_<backend> only to ggml and the targets that link
    ggml-backend-use: a source outside ggml that tests one without getting it would silently
    take its other branch.  The configure names it (read from compile_commands.json)."""
    readers = env.src / "src" / "readers"
    readers.mkdir()
    (readers / "uses_rpc.c").write_text("#ifdef GGML_USE_RPC\nint rpc_on = 1;\n#else\nint rpc_on = 0;\n#endif\n")
    (readers / "plain.c").write_text("/* GGML_USE_RPCX is another name */\nint plain = 1;\n")
    plan = env.plan(GGML_RPC="ON")
    with pytest.raises(BuildError) as info:
        env.run(plan)
    error = info.value
    assert error.what == "1 source(s) outside ggml test a backend's GGML_USE_ definition their compile line lacks"
    assert error.details == "src/readers/uses_rpc.c: reads GGML_USE_RPC"
    assert error.next_step is not None
    assert "target_link_libraries(<target> PRIVATE ggml-backend-use)" in error.next_step
    assert error.next_step.endswith("`nox -s build-cpu`")
    assert not plan.stamp_path.exists(), "the next run configures again"
    assert not (plan.build_dir / "bin" / "llama-server").exists(), "nothing was built"
    # given the definitions (as linking ggml-backend-use does), the same tree builds
    good = env.run(env.plan(GGML_RPC="ON", PROBE_READERS_GET_USE="ON"))
    assert good.configured and (good.build_dir / "bin" / "llama-server").exists()


def _tests_tree(env: Env, plan: BuildPlan, **defines: str) -> _Tree:
    """What ``--upstream-tests`` runs after the build of ``plan`` (made with ``defines``)."""
    subject = Subject(
        toolchain=env.toolchain,
        request=build_request("cpu", env.settings, defines=defines),
        upstream_sha=SHA,
        patched_sha=SHA,
        queue_digest=None,
        build_number=None,
        plan=plan,
    )
    return _Tree("cpu", env.settings, env.console, subject)


def test_upstream_tests_build_in_the_binaries_dir_and_are_not_binaries(env: Env) -> None:
    """--upstream-tests after a build: the tests are configured in the binaries' own dir (on by
    default for a top-level tree), nothing is configured again, and the test programs built
    there are not listed among the backend's binaries."""
    plan = env.plan()
    env.run(plan)
    assert builds_tests(plan.build_dir)
    stamp = plan.stamp_path.read_bytes()
    tree = _tests_tree(env, plan)
    tests = tree.patched()
    assert tests.plan is plan, "the binaries' own plan"
    assert plan.stamp_path.read_bytes() == stamp, "not configured again"
    programs = tree.programs(tests, ["test-probe"])
    assert (programs.build_dir, programs.configure_argv, programs.stamp) == (
        plan.build_dir,
        plan.configure_argv,
        plan.stamp,
    )
    assert programs.build_argv == (*plan.build_argv[: -len(plan.targets)], "test-probe")
    report, run, chosen = tree.build_and_run(tests, None, ())
    assert [c.name for c in chosen] == ["test-probe"]
    assert (plan.build_dir / "bin" / "test-probe").is_file()
    assert [r.verdict for r in run.results] == ["passed"]
    assert report.binaries["test-probe"].parent == plan.build_dir / "bin"
    binaries = newest_builds(env.settings.build_root)["cpu"]["binaries"]
    assert "llama-server" in binaries and "test-probe" not in binaries


def test_upstream_tests_get_a_dir_of_their_own_where_the_binaries_have_them_off(env: Env) -> None:
    plan = env.plan(LLAMA_BUILD_TESTS="OFF")
    env.run(plan)
    assert not builds_tests(plan.build_dir)
    tests_plan = _tests_tree(env, plan, LLAMA_BUILD_TESTS="OFF").patched().plan
    assert tests_plan.build_dir != plan.build_dir
    assert builds_tests(tests_plan.build_dir)
    assert TESTS_DEFINE in tests_plan.stamp["configure_args"]
    assert "LLAMA_BUILD_TESTS is off there" in env.out.getvalue()
    # the binaries' dir is the backend's newest build still, not the tests' dir beside it
    assert newest_builds(env.settings.build_root)["cpu"]["build_dir"] == str(plan.build_dir)


def test_a_build_given_llama_build_tests_on_is_still_the_backends_build(env: Env) -> None:
    """A maintainer's own ``-DLLAMA_BUILD_TESTS=ON`` build has binaries: status shows it (only a
    dir of upstream's tests alone, without llama-server, is left out)."""
    plan = env.plan(LLAMA_BUILD_TESTS="ON")
    env.run(plan)
    assert TESTS_DEFINE in plan.stamp["configure_args"]
    found = newest_builds(env.settings.build_root)
    assert found["cpu"]["build_dir"] == str(plan.build_dir)
    assert "llama-server" in found["cpu"]["binaries"]
