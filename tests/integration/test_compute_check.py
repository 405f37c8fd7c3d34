"""The spot check proves the build computes: fingerprint and reference, template leaks, the
device the layers went to, the RPC path (real processes: the stand-in server and RPC server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from skippy.core.errors import ModelCheckFailed
from skippy.core.ui import Console
from skippy.spot.proofs import reference_dir
from skippy.spot.report import SpotCheckReport, spot_report_of
from skippy.spot.server import port_is_free
from skippy.spot.spotcheck import spot_check
from tests.integration import fake_server
from tests.integration.test_spotcheck import Rig, wait_gone

pytestmark = pytest.mark.integration


def run(rig: Rig, **kw: object) -> SpotCheckReport:
    env = {"FAKE_LLAMA_MODE": "ready", "FAKE_LLAMA_STATE": str(rig.state), **kw.pop("env", {})}  # type: ignore[dict-item]
    return spot_check(
        rig.settings(),
        rig.server,
        [str(rig.model)],
        console=Console(env={}, quiet=True),
        server_env=env,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_no_reference_is_reported_then_written_then_agreed_with(rig: Rig) -> None:
    first = run(rig)
    (result,) = first.results
    assert result.ok
    assert result.compute.agreement is not None and result.compute.agreement.status == "no-reference"
    assert json.loads(json.dumps(first.as_dict()))["results"][0]["compute"]["agreement"]["status"] == "no-reference"
    written = run(rig, write_reference=True)
    ref_file = reference_dir(rig.settings()) / f"{written.results[0].model.replace('/', '-')}.json"
    assert any(reference_dir(rig.settings()).glob("*.json")), "no reference written"
    again = run(rig)
    agreement = again.results[0].compute.agreement
    assert agreement is not None and agreement.status == "agrees", agreement
    assert ref_file.name.endswith(".json")


def test_changed_numerics_fail_naming_the_first_diverging_token(rig: Rig) -> None:
    run(rig, write_reference=True)
    with pytest.raises(ModelCheckFailed) as info:
        run(rig, env={"FAKE_LLAMA_NUMERICS": "shifted"})
    (result,) = spot_report_of(info.value).results
    assert "differs from the CPU reference" in result.reason
    assert "token 2: a different greedy token" in result.reason
    assert "prompt 'The capital of France is'" in result.reason


def test_an_answer_with_template_tokens_fails(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        run(rig, env={"FAKE_LLAMA_MODE": "leak"})
    assert "chat template token '<|im'" in spot_report_of(info.value).results[0].reason


def test_a_gpu_backend_must_put_the_layers_on_its_device(rig: Rig) -> None:
    with pytest.raises(ModelCheckFailed) as info:
        # the device is listed, but the layers stay on the CPU (an ignored -ngl, a fallback)
        run(rig, device_prefix="Vulkan", extra_server_args=["-ngl", "99"], env={"FAKE_LLAMA_LISTED": "Vulkan0"})
    assert spot_report_of(info.value).devices == ["Vulkan0"]
    reason = spot_report_of(info.value).results[0].reason
    assert "did not run on a Vulkan device: only 0/5 layers were offloaded" in reason
    ok = run(rig, device_prefix="Vulkan", extra_server_args=["-ngl", "99"], env={"FAKE_LLAMA_DEVICE": "Vulkan0"})
    assert "5/5 layers offloaded; model buffers on Vulkan0" in ok.results[0].compute.device


def test_no_device_of_the_backend_listed_means_not_run_and_no_server_started(rig: Rig) -> None:
    report = run(rig, device_prefix="CUDA", extra_server_args=["-ngl", "99"], env={"FAKE_LLAMA_LISTED": "Vulkan0"})
    assert report.ok and report.results == []
    assert report.devices == ["Vulkan0"]
    assert report.not_run is not None and "no CUDA device on this machine" in report.not_run
    assert "--list-devices lists: Vulkan0" in report.not_run
    assert not (rig.state / "argv.json").exists(), "a server was started although no device was listed"
    shown = json.loads(json.dumps(report.as_dict()))
    assert (shown["ran"], shown["ok"], shown["devices"]) == (False, True, ["Vulkan0"])
    assert report.markdown().startswith("### Spot check: not run")
    none = run(rig, device_prefix="CUDA", extra_server_args=["-ngl", "99"])
    assert none.devices == [] and none.not_run is not None and "lists: none" in none.not_run
    # a binary that cannot even list its devices (a missing driver library) says so, with its last line
    broken = run(rig, device_prefix="CUDA", env={"FAKE_LLAMA_LIST_FAILS": "1"})
    assert broken.not_run is not None
    assert "--list-devices exited with code 127: llama-server: error while loading shared libraries" in broken.not_run


def test_the_rpc_path_offloads_to_a_fresh_rpc_server_which_is_stopped(rig: Rig) -> None:
    rpc = fake_server.install_rpc(rig.server.parent)
    state = rig.root / "rpc-state"
    report = run(rig, rpc_server=rpc, env={"FAKE_RPC_STATE": str(state)})
    (result,) = report.results
    assert result.ok, result.reason
    assert result.compute.rpc["ok"] is True
    assert result.compute.rpc["device"].startswith("5/5 layers offloaded; model buffers on RPC0[127.0.0.1:")
    assert result.compute.rpc["agreement"]["status"] == "agrees"
    argv = rig.argv()  # the last llama-server started: the one offloading to the RPC server
    rpc_endpoint = argv[argv.index("--rpc") + 1]
    assert argv[argv.index("-ngl") + 1] == "99"
    assert wait_gone(int((state / "rpc.pid").read_text())), "the RPC server outlived the spot check"
    deadline = time.monotonic() + 5
    while not port_is_free(int(rpc_endpoint.rsplit(":", 1)[1])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert port_is_free(int(rpc_endpoint.rsplit(":", 1)[1]))
