"""A proof already made is not made again (issue 43, item 5): the real spot check against the
stand-in llama-server and RPC server (real processes, real files).  A model whose proofs were made
for the same binaries, model, reference and settings is kept, and no server starts for it; any
of those changing makes the proof again, as does --recheck; a failed proof is never kept."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from skippy.cli.entries import spot_main
from skippy.core.errors import ModelCheckFailed
from skippy.core.ui import Console
from skippy.spot.fingerprint import Fingerprint, reference_path, render_reference
from skippy.spot.kept import PROOFS_NAME
from skippy.spot.proofs import reference_dir
from skippy.spot.report import SpotCheckReport, spot_proofs
from skippy.spot.spotcheck import spot_check
from tests.integration import fake_server
from tests.integration.test_spotcheck import Rig, _project

pytestmark = pytest.mark.integration


class Kept:
    """A stand-in build (llama-server and the RPC server beside it) and a model, checked as a
    build session checks them; each run says whether a server started."""

    def __init__(self, root: Path, *, rpc: bool = True) -> None:
        self.rig = Rig(root)
        self.rpc = fake_server.install_rpc(self.rig.server.parent) if rpc else None
        self.server_args: tuple[str, ...] = ()
        self.server_env: dict[str, str] = {"FAKE_LLAMA_LOAD": "0.05"}
        self.agreement_required = True

    @property
    def record(self) -> Path:
        return self.rig.server.parent.parent / PROOFS_NAME

    def check(self, *, recheck: bool = False, mode: str = "ready") -> tuple[SpotCheckReport, bool]:
        """The spot check's report, and whether llama-server (or the RPC server) was started."""
        started = [self.rig.state / "pid", self.rig.state / "rpc.pid"]
        for pid in started:
            pid.unlink(missing_ok=True)
        # the mode comes from the environment of the run, which is not part of what a proof depends
        # on (a stand-in for a flaky failure of the same binaries, model and settings)
        env = {"FAKE_LLAMA_STATE": str(self.rig.state), "FAKE_RPC_STATE": str(self.rig.state), **self.server_env}
        report = spot_check(
            self.rig.settings(FAKE_LLAMA_MODE=mode),
            self.rig.server,
            [str(self.rig.model)],
            console=Console(env={}, quiet=True),
            server_env=env,
            extra_server_args=self.server_args,
            rpc_server=self.rpc,
            agreement_required=self.agreement_required,
            recheck=recheck,
        )
        return report, any(p.exists() for p in started)


@pytest.fixture
def kept(tmp_path: Path) -> Kept:
    return Kept(tmp_path)


def test_a_passed_check_is_kept_and_the_next_starts_no_server(kept: Kept) -> None:
    first, started = kept.check()
    assert started and first.results[0].kept_from is None
    assert kept.record.is_file(), "the proofs are kept beside the build stamp"
    again, started = kept.check()
    assert not started, "a kept proof starts no server"
    (result,) = again.results
    assert result.kept_from is not None
    assert result.ok and result.content == first.results[0].content
    assert result.compute.rpc["ok"] is True
    proofs = {p.name: p for p in spot_proofs(again)}
    assert {name for name, p in proofs.items() if p.kept_from == result.kept_from} == {
        "chat answer",
        "fingerprint",
        "RPC",
    }
    assert again.as_dict()["results"][0]["kept_from"] == result.kept_from


def _replace(path: Path, text: str) -> None:
    """A new version of ``path`` (a rebuild: another file with the same name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".new")
    new.write_text(text, encoding="utf-8")
    new.chmod(path.stat().st_mode if path.exists() else 0o644)
    new.replace(path)


def _rebuilt(binary: Path) -> None:
    """Another build of ``binary``: the same program, other bytes."""
    _replace(binary, binary.read_text(encoding="utf-8") + "\n# rebuilt\n")


def _reference(kept: Kept) -> None:
    """A reference fingerprint committed for the model (of another model file: still no agreement to check)."""
    label = str(kept.rig.model)
    other = Fingerprint(model=label, model_sha256="0" * 64, runs=())
    _replace(reference_path(reference_dir(kept.rig.settings()), label), render_reference(other))


def _setting(kept: Kept, key: str, value: object) -> None:
    table = kept.rig.table["spot_check"]
    assert isinstance(table, dict)
    table[key] = value


CHANGES: dict[str, Callable[[Kept], object]] = {
    "llama-server": lambda k: _rebuilt(k.rig.server),
    "the RPC server": lambda k: _rebuilt(k.rig.server.parent / "ggml-rpc-server"),
    "a shared library beside llama-server": lambda k: _replace(k.rig.server.parent / "libggml-cpu.so", "ELF"),
    "the model": lambda k: k.rig.model.write_bytes(b"GGUF another stand-in"),
    "the committed reference": _reference,
    "a server argument": lambda k: setattr(k, "server_args", ("--threads", "2")),
    "the server's environment": lambda k: k.server_env.update(FAKE_LLAMA_LOAD="0.06"),
    "a spot-check setting": lambda k: _setting(k, "ctx_size", 512),
    "agreement required or not": lambda k: setattr(k, "agreement_required", False),
}


@pytest.mark.parametrize("change", CHANGES)
def test_each_thing_a_proof_depends_on_makes_it_again(tmp_path: Path, change: str) -> None:
    kept = Kept(tmp_path, rpc=change == "the RPC server")  # the RPC path where it is what changes
    kept.check()
    CHANGES[change](kept)
    report, started = kept.check()
    assert started, f"{change} changed: the proof is made again"
    assert report.results[0].kept_from is None
    _, started = kept.check()
    assert not started, "and kept again for the new one"


def test_a_model_touched_but_not_changed_is_still_kept(kept: Kept) -> None:
    kept.check()
    stat = kept.rig.model.stat()
    os.utime(kept.rig.model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    _, started = kept.check()
    assert not started, "the same bytes: the same proof (its digest is made again, not the proof)"


def test_a_failed_proof_is_never_kept_and_a_failed_recheck_drops_the_kept_one(kept: Kept) -> None:
    with pytest.raises(ModelCheckFailed):
        kept.check(mode="crashing")
    assert not kept.record.exists(), "nothing passed, nothing kept"
    _, started = kept.check()
    assert started, "the failure was not kept"
    _, started = kept.check()
    assert not started
    with pytest.raises(ModelCheckFailed):
        kept.check(recheck=True, mode="crashing")
    _, started = kept.check()
    assert started, "the pass kept before the failed recheck was dropped"


def test_recheck_makes_a_kept_proof_again(kept: Kept) -> None:
    kept.check()
    kept_one, _ = kept.check()
    made = kept_one.results[0].kept_from
    assert made is not None
    rechecked, started = kept.check(recheck=True)
    assert started and rechecked.results[0].kept_from is None
    later, started = kept.check()
    assert not started
    assert later.results[0].kept_from is not None and later.results[0].kept_from >= made


def test_the_json_report_says_which_proofs_were_kept_and_from_when(
    kept: Kept, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = kept.rig
    _project(rig)
    env = {"PATH": os.defpath, "FAKE_LLAMA_STATE": str(rig.state), "FAKE_LLAMA_LOAD": "0.05"}
    argv = ["--model", str(rig.model), "--no-provenance", "--json"]

    def run(*extra: str) -> dict[str, dict[str, object]]:
        assert spot_main([*argv, *extra], env=env, root=rig.root) == 0
        out = json.loads(capsys.readouterr().out)
        return {str(p["name"]): p for p in out["proofs"]}

    made = run()
    assert {name: (p["kept"], p["kept_from"]) for name, p in made.items()} == dict.fromkeys(made, (False, None))
    again = run()
    when = again["chat answer"]["kept_from"]
    assert isinstance(when, str) and when.endswith("Z")
    assert {name for name, p in again.items() if p["kept"]} == {"chat answer", "fingerprint", "RPC"}
    assert again["provenance"]["kept"] is False, "read again on every run"
    rechecked = run("--recheck")
    assert not any(p["kept"] for p in rechecked.values())
