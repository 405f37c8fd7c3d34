"""skippy's own queue on the pinned llama.cpp (upstream 4df29be4, from its source archive).

The patched commit SHA is pinned here: the same pin and queue must give it on
every machine.  The build tests use the project's CPU build, the session
fixture ``cpu_build`` (tests/e2e/conftest.py), made when it does not exist.
"""

from __future__ import annotations

import io
import os
import tomllib
from pathlib import Path

import pytest

from skippy.compile.builder import BuildReport
from skippy.core import proc
from skippy.core.errors import SpotCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain.review import run_check
from skippy.queue import workdir as wd
from skippy.queue.model import load_queue
from skippy.queue.prepare import Target, prepare
from skippy.spot.report import Provenance
from skippy.spot.spotcheck import spot_check
from skippy.spot.tinymodels import family as tiny_family
from skippy.spot.tinymodels import shape_for

ROOT = Path(__file__).resolve().parents[2]
PIN = "4df29be4f4c3673f428170fda944a5b19f743bb8"
#: the pin + the shipped queue, on any machine (update when the queue changes: `invoke status` shows it)
PATCHED_SHA = "969258c1a6bbd6e939e60f58d134d1bd69308cce"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_")) and k != "CI"}


def project() -> Settings:
    return Settings.load(ROOT, _env())


def fresh(tmp_path: Path) -> Settings:
    """The project's settings with a workdir of its own (no compat link): a fresh machine."""
    table = dict(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["skippy"])
    table.update({"workdir": str(tmp_path / "llama.cpp"), "compat_link": False})
    table["cache_dir"] = str(ROOT / ".deps" / "cache")  # the archive download is shared
    return Settings.from_table(ROOT, table, _env())


def quiet() -> Console:
    return Console(env={}, stream=io.StringIO())


def test_fresh_prepare_gives_the_pinned_patched_sha(tmp_path: Path, pinned_sdist: Path) -> None:
    settings = fresh(tmp_path)
    report = prepare(settings, Target.pinned(), console=quiet(), offline=True, interactive=False)
    assert report.upstream_sha == PIN
    assert report.source == "archive"
    assert report.patched_sha == PATCHED_SHA
    assert report.queue_digest == load_queue(settings.patch_dir).digest


def test_check_passes_on_the_shipped_queue(tmp_path: Path, pinned_sdist: Path) -> None:
    report = run_check(fresh(tmp_path), console=quiet(), offline=True)
    assert report.ok, report.as_dict()


def _provenance() -> Provenance:
    stamp = wd.read_stamp(project().workdir / ".git")
    assert stamp is not None, "the project's workdir is prepared"
    return Provenance(stamp.upstream_sha, stamp.queue_digest)


def test_build_reports_its_provenance_and_other_digests_are_refused(cpu_build: BuildReport) -> None:
    build = cpu_build.build_dir
    server = build / "bin" / "llama-server"
    expected = _provenance()
    version = proc.run([server, "--version"], env=_env(), check=False)
    assert f"skippy: upstream={expected.upstream_sha} queue={expected.queue_digest}" in version.stderr
    rpc = proc.run([build / "bin" / "ggml-rpc-server", "--version"], env=_env(), check=False)
    assert f"queue={expected.queue_digest}" in rpc.stderr
    report = spot_check(project(), server, ["tiny:llama"], console=quiet(), expect_provenance=expected)
    assert report.ok
    other = Provenance(expected.upstream_sha, "0" * 64)
    with pytest.raises(SpotCheckFailed) as info:
        spot_check(project(), server, ["tiny:llama"], console=quiet(), expect_provenance=other)
    assert "queue" in info.value.render()


@pytest.mark.parametrize(("family", "hooks"), [("gemma3", 2), ("llama", 2), ("qwen2", 2), ("phi3", 0)])
def test_generated_families_run_their_layer_hooks(family: str, hooks: int, cpu_server: Path) -> None:
    """The generated lane's edits are compiled in and run: every graph of a family of the lane runs
    one layer hook per layer (the tiny models have 2), a family outside the lane (phi3) none."""
    assert shape_for(tiny_family(family)).n_layer == 2
    env = {"LLAMA_SKIPPY_TRACE": "1"}
    report = spot_check(project(), cpu_server, [f"tiny:{family}"], console=quiet(), server_env=env, recheck=True)
    (result,) = report.results
    assert result.verdict == "pass", result.reason
    assert result.log_path is not None
    log = Path(result.log_path).read_text(encoding="utf-8", errors="replace")
    traced = {line.split("skippy: graph ", 1)[1] for line in log.splitlines() if "skippy: graph " in line}
    assert traced, "no graph was traced"
    assert {t.split(" nodes=")[0] for t in traced} == {f"arch={family}"}
    assert {t.rsplit(" ", 1)[1] for t in traced} == {f"layer_hooks={hooks}"}


def test_trace_point_is_off_by_default(cpu_server: Path) -> None:
    server = cpu_server
    report = spot_check(project(), server, ["tiny:llama"], console=quiet(), recheck=True)
    (result,) = report.results
    assert result.log_path is not None
    assert "skippy: graph" not in Path(result.log_path).read_text(encoding="utf-8", errors="replace")


def test_gemma3_sliding_window_override_and_family_test(cpu_build: BuildReport) -> None:
    build = cpu_build.build_dir
    report = spot_check(
        project(),
        build / "bin" / "llama-server",
        ["tiny:gemma3"],
        console=quiet(),
        server_env={"LLAMA_SKIPPY_GEMMA3_SWA": "0"},
        recheck=True,  # its server's log is read
    )
    (result,) = report.results
    assert result.verdict == "pass", result.reason
    assert result.log_path is not None
    log = Path(result.log_path).read_text(encoding="utf-8", errors="replace")
    assert "skippy: gemma3 sliding window" in log and "-> 0 (LLAMA_SKIPPY_GEMMA3_SWA)" in log
    # the family's own test, shipped in the same patch
    proc.run(["ninja", "-C", build, "test-skippy-gemma3"], env=_env(), timeout=1800)
    ran = proc.run([build / "bin" / "test-skippy-gemma3"], env=_env())
    assert "test-skippy-gemma3: ok" in ran.stdout
