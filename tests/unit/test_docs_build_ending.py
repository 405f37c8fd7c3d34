"""The sample endings of docs/building.md come from a real `nox -s build-cpu`, recorded in
docs/figures/build-cpu.json: the recording is of the queue shipped now and of runs that passed, it
is shown by the ending's own code, and a recording that failed or kept nothing is refused."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.model import load_queue
from skippy.queue.target import read_pin
from skippy.spot.report import Ending, Proof, shown_time
from tooling.docs.ending import BUILD_JSON, BUILD_RUNS, RECORD, SessionRun, record, render_build_ending
from tooling.docs.generate import RENDERERS, main, stale

ROOT = Path(__file__).resolve().parents[2]
AGAIN = f"the queue changed since docs/figures/build-cpu.json was recorded: run `{RECORD}` (a CPU build)"


def _recording() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / BUILD_JSON).read_text(encoding="utf-8"))
    return loaded


def test_the_recorded_runs_are_of_the_shipped_queue_and_pin() -> None:
    settings = Settings.load(ROOT, {})
    digest, pin = load_queue(settings.patch_dir).digest, read_pin(settings)
    for name, run in _recording()["runs"].items():
        provenance = run["report"]["spot_check"]["provenance"]
        assert provenance["queue_digest"] == digest, f"{name}: {AGAIN}"
        assert provenance["upstream_sha"] == pin, f"{name}: the pin moved since the recording: run `{RECORD}`"


def test_the_recorded_runs_passed_and_the_second_kept_the_spot_checks_proofs() -> None:
    runs = _recording()["runs"]
    assert list(runs) == list(BUILD_RUNS)
    for name, run in runs.items():
        ending = Ending.from_dict(run["ending"])
        assert run["report"]["ok"] is True and ending.ok, name
        assert ending.title == "build-cpu: every proof made holds", name
        # the report's proofs are the ending's (what --json prints beside it)
        assert run["report"]["proofs"] == run["ending"]["proofs"], name
        assert not Path(run["report"]["build"]["build_dir"]).is_absolute(), name
    assert str(ROOT) not in (ROOT / BUILD_JSON).read_text(encoding="utf-8"), "a path of this machine"
    fresh, kept = (Ending.from_dict(runs[n]["ending"]) for n in ("fresh", "kept"))
    assert all(p.verdict == "pass" for p in fresh.proofs) and not [p for p in fresh.proofs if p.kept_from]
    assert {p.name for p in kept.proofs if p.kept_from} >= {"chat answer", "fingerprint"}


def test_the_sample_is_what_the_ending_shows() -> None:
    recording = _recording()
    ending = Ending.from_dict(recording["runs"]["kept"]["ending"])
    assert Ending.from_dict(ending.as_dict()) == ending
    shown = io.StringIO()
    ending.show(Console(env={}, stream=shown))
    block = render_build_ending(recording, "kept")
    assert block.startswith(f"```text\n{shown.getvalue()}```\n")
    assert "(kept from " in block and "\x1b[" not in block
    when = shown_time(recording["recorded_at"])
    assert block.endswith(f"(`nox -s build-cpu`, recorded {when} by `{RECORD}`)")


# --- recording ------------------------------------------------------------------------------------


def _ending(root: Path, *, kept: str | None) -> Ending:
    proofs = (
        Proof("artifact gate", "pass", "llama-server contains its backend"),
        Proof("chat answer", "pass", "answered", kept_from=kept),
    )
    return Ending("build-cpu: every proof made holds", proofs, (f"llama-server: {root}/.deps/bin/llama-server",))


def _fake(root: Path, *, code: int = 0, kept_again: bool = True) -> tuple[SessionRun, list[Sequence[str]]]:
    asked: list[Sequence[str]] = []

    def run(args: Sequence[str]) -> tuple[int, Mapping[str, Any], Ending | None]:
        asked.append(args)
        kept = "2026-12-06T04:00:00Z" if not args and kept_again else None
        ending = _ending(root, kept=kept)
        report = {"ok": code == 0, "build": {"build_dir": f"{root}/.deps/b", "log": "/home/me/x.log"}}
        return code, {**report, "proofs": ending.as_dict()["proofs"]}, ending

    return run, asked


def _project(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# a project\n", encoding="utf-8")
    page = "".join(f"{RENDERERS[n].begin}\n{RENDERERS[n].end}\n" for n in ("build-ending", "build-ending-kept"))
    (tmp_path / "docs" / "page.md").write_text(page, encoding="utf-8")
    return tmp_path


def test_a_recording_is_written_with_relative_paths_and_the_blocks_made(tmp_path: Path) -> None:
    root = _project(tmp_path)
    run, asked = _fake(root)
    record(root, run, now="2026-12-06T04:00:00Z", home="/home/me")
    assert asked == [("--recheck",), ()]
    recording = json.loads((root / BUILD_JSON).read_text(encoding="utf-8"))
    assert recording["runs"]["fresh"]["command"] == "nox -s build-cpu -- --recheck"
    assert recording["runs"]["kept"]["report"]["build"] == {"build_dir": ".deps/b", "log": "~/x.log"}
    assert str(root) not in json.dumps(recording)
    assert main([], root) == 0
    page = (root / "docs" / "page.md").read_text(encoding="utf-8")
    assert "llama-server: .deps/bin/llama-server" in page
    assert "(kept from 2026-12-06 04:00:00 UTC) answered" in page
    assert stale(root) == []


@pytest.mark.parametrize(
    ("code", "kept_again", "said"),
    [(1, True, "failed (exit code 1)"), (0, False, "`nox -s build-cpu` kept no proof")],
)
def test_a_failed_run_or_one_that_kept_nothing_is_not_recorded(
    tmp_path: Path, code: int, kept_again: bool, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _project(tmp_path)
    run, _ = _fake(root, code=code, kept_again=kept_again)
    assert main(["--record-build"], root, run=run) == 2
    err = capsys.readouterr().err
    assert said in err and f"run `{RECORD}` again" in err
    assert not (root / BUILD_JSON).exists()
