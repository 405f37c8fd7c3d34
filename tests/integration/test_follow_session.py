"""A build session follows the change: real git, a real CMake + Ninja build (tests/integration/cmake_probe
standing in for llama.cpp, with llama.cpp-shaped model sources beside it), the spot check's function
replaced at its parameter.  The models it is asked to check, the ending, the ``--json`` report and
the record of a passed check, over a sequence of queue changes."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skippy.cli.build import outcome_report
from skippy.compile.request import build_request
from skippy.core.errors import ModelCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows import follow
from skippy.flows.build_session import (
    Collaborators,
    SessionRequest,
    SpotCheckRequest,
    run_build_session,
    session_ending,
)
from skippy.spot.models import DEFAULT_MODEL
from skippy.spot.report import Ending, ModelResult, SpotCheckReport, model_check_failed
from tests.gitfixtures import Upstream
from tests.integration.test_follow_change import BERT, QWEN2, hooked
from tests.unit.test_touched import TREE

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "cmake_probe"
DIGEST = "d" * 64


@dataclass
class Prepared:
    patched_sha: str
    upstream_sha: str
    workdir: Path
    queue_digest: str = DIGEST


@dataclass
class Rig:
    up: Upstream
    settings: Settings
    requests: list[SpotCheckRequest] = field(default_factory=list)
    #: models whose check fails
    failing: set[str] = field(default_factory=set)

    @property
    def pin(self) -> str:
        return self.up.commits[0]

    def spot_check(self, settings: Settings, request: SpotCheckRequest, console: Console) -> SpotCheckReport:
        self.requests.append(request)
        report = SpotCheckReport(server=str(request.server_binary))
        for model in request.models or (DEFAULT_MODEL,):
            bad = model in self.failing
            result = ModelResult(model=model, path=None, verdict="fail" if bad else "pass", content="OK", tokens=1)
            result.reason = "no token" if bad else ""
            report.results.append(result)
        if not report.ok:  # the session's own failure (its next step and ending), as the real check raises it
            raise request.failure(report) if request.failure else model_check_failed(report, next_step="fix the patch")
        return report

    def session(self, patched: str, *, models: tuple[str, ...] = (), spot_check: bool = True) -> tuple[object, str]:
        out = io.StringIO()
        outcome = run_build_session(
            SessionRequest(build_request("cpu", self.settings), models=models, spot_check=spot_check),
            self.settings,
            Console(env={}, stream=out),
            Collaborators(
                prepare=lambda _s, _c, _b: Prepared(patched, self.pin, self.up.path), spot_check=self.spot_check
            ),
        )
        return outcome, out.getvalue()


@pytest.fixture
def rig(tmp_path: Path, git_env: dict[str, str]) -> Rig:
    root = tmp_path / "proj"
    up = Upstream.create(root / ".deps" / "llama.cpp", git_env)
    files = {str(p.relative_to(PROBE)): p.read_text(encoding="utf-8") for p in PROBE.rglob("*") if p.is_file()}
    # the stand-in server carries the CPU backend's registration symbols (the artifact gate's)
    files["src/common.c"] = (
        "int probe_answer(void) { return 42; }\n"
        "void ggml_backend_cpu_reg(void) {}\nvoid ggml_backend_rpc_reg(void) {}\n"
    )
    up.commit("upstream", {**files, **TREE})
    table = {"cache_dir": "cache", "build": {"compiler_cache": "none"}}
    settings = Settings.from_table(root, table, {"PATH": os.environ["PATH"], "HOME": git_env["HOME"]})
    return Rig(up, settings)


def asked(rig: Rig) -> tuple[str, ...]:
    """The models the last session asked the spot check for."""
    return rig.requests[-1].models


def families(outcome: object) -> list[str]:
    following = outcome.following  # type: ignore[attr-defined]
    return [f.touched.family for f in following.families]


def test_a_session_checks_the_families_its_change_touches(rig: Rig) -> None:
    first = rig.up.commit("queue: hooks in qwen2 and bert", {QWEN2: hooked(QWEN2), BERT: hooked(BERT)})
    outcome, said = rig.session(first)
    # no record: measured from the pin; qwen2 has a tiny model, bert and jina-bert-v2 have none
    assert asked(rig) == (DEFAULT_MODEL, "tiny:qwen2")
    assert families(outcome) == ["bert", "jina-bert-v2", "qwen2"]
    assert "model families touched since the pin" in said and "qwen2 (tiny:qwen2)" in said
    ending = session_ending(outcome, rig.settings)  # type: ignore[arg-type]
    lines = {p.name: (p.verdict, p.detail) for p in ending.proofs}
    assert lines[follow.FOLLOWED][0] == "pass" and lines[follow.FOLLOWED][1].startswith("bert, jina-bert-v2, qwen2")
    assert lines["family bert"][0] == "not run" and lines["family bert"][1].startswith("no tiny model for bert (")
    assert lines["family jina-bert-v2"][1].startswith("no tiny model for jina-bert-v2 (")
    assert "builds its graph with llama_model_bert" in lines["family jina-bert-v2"][1]
    assert lines["family qwen2"][0] == "pass"
    assert ending.ok
    report = outcome_report(outcome)  # type: ignore[arg-type]
    assert report["follow"]["baseline"]["kind"] == "pin" and report["follow"]["baseline"]["commit"] == rig.pin
    assert [(f["family"], f["model"]) for f in report["follow"]["families"]] == [
        ("bert", None),
        ("jina-bert-v2", None),
        ("qwen2", "tiny:qwen2"),
    ]
    assert report["follow"]["families"][2]["reasons"] == [
        "src/models/qwen2.cpp: llama_model_qwen2::graph::graph changed"
    ]
    record = follow.read_record(follow.record_path(rig.settings, rig.up.path, "cpu"))
    assert record is not None and record.patched_sha == first and record.models == (DEFAULT_MODEL, "tiny:qwen2")

    # the next change touches qwen2 alone: measured from the certified tree
    second = rig.up.commit("queue: qwen2 again", {QWEN2: hooked(QWEN2, hooked(QWEN2))})
    rig.failing = {"tiny:qwen2"}
    with pytest.raises(ModelCheckFailed) as info:
        rig.session(second)
    assert asked(rig) == (DEFAULT_MODEL, "tiny:qwen2")
    assert isinstance(info.value.ending, Ending)
    failed = {p.name: p for p in info.value.ending.proofs}
    assert failed["family qwen2"].verdict == "fail" and "no token" in failed["family qwen2"].detail
    assert "family bert" not in failed
    assert follow.read_record(follow.record_path(rig.settings, rig.up.path, "cpu")).patched_sha == first  # type: ignore[union-attr]

    rig.failing = set()
    outcome, _said = rig.session(second)
    assert families(outcome) == ["qwen2"]
    assert outcome.following.baseline.commit == first  # type: ignore[attr-defined]
    assert follow.read_record(follow.record_path(rig.settings, rig.up.path, "cpu")).patched_sha == second  # type: ignore[union-attr]

    # the same tree again: nothing touched, the models asked for as they were asked
    outcome, said = rig.session(second)
    assert asked(rig) == ()
    assert families(outcome) == [] and "no model family touched since the last cpu build" in said
    # models asked for stay first; a shared file touches nothing
    third = rig.up.commit("queue: a shared header", {"src/models/models.h": TREE["src/models/models.h"] + "// x\n"})
    rig.session(third, models=("tiny:llama",))
    assert asked(rig) == ("tiny:llama",)


def test_no_spot_check_no_following(rig: Rig) -> None:
    first = rig.up.commit("queue", {QWEN2: hooked(QWEN2)})
    outcome, said = rig.session(first, spot_check=False)
    assert rig.requests == [] and outcome.following is None  # type: ignore[attr-defined]
    assert "touched" not in said
    assert not (rig.settings.cache_dir / follow.RECORD_DIR).exists()
