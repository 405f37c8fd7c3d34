"""Readers of llama-server's output and of a binary: devices, offload, artifact markers, template leaks."""

from __future__ import annotations

from pathlib import Path

from skippy.spot.evidence import (
    artifact_markers_missing,
    device_evidence,
    parse_devices,
    parse_offload,
    template_leak,
)

LIST_DEVICES = """\
load_backend: loaded RPC backend
Available devices:
  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (24032 MiB, 24032 MiB free)
"""

LOAD_LOG_RPC = [
    "load_tensors: offloading 18 repeating layers to GPU",
    "load_tensors: offloading output layer to GPU",
    "load_tensors: offloaded 19/19 layers to GPU",
    "load_tensors:   CPU_Mapped model buffer size =   106.40 MiB",
    "load_tensors: RPC0[127.0.0.1:41234] model buffer size =   230.55 MiB",
]


def test_list_devices() -> None:
    assert parse_devices(LIST_DEVICES) == ["Vulkan0"]
    assert parse_devices("Available devices:\n  (none)\n") == []
    assert parse_devices("no listing at all") == []


def test_offload_to_the_rpc_device_is_evidence() -> None:
    offload = parse_offload(LOAD_LOG_RPC)
    assert (offload.layers, offload.total) == (19, 19)
    assert offload.buffers["RPC0[127.0.0.1:41234]"] == 230.55
    used, why = device_evidence(offload, "RPC")
    assert used
    assert "19/19 layers offloaded; model buffers on RPC0[127.0.0.1:41234] 230.6 MiB" in why


def test_cpu_only_load_is_not_evidence() -> None:
    cpu = parse_offload(["load_tensors: offloaded 0/19 layers to GPU", "load_tensors: CPU model buffer size = 1 MiB"])
    used, why = device_evidence(cpu, "Vulkan")
    assert not used
    assert why == "only 0/19 layers were offloaded"
    silent = parse_offload(["load_tensors: CPU model buffer size = 1 MiB"])
    assert device_evidence(silent, "Vulkan") == (False, "the load log does not say how many layers were offloaded")
    all_but = parse_offload(
        ["load_tensors: offloaded 19/19 layers to GPU", "load_tensors: CPU model buffer size = 1 MiB"]
    )
    assert device_evidence(all_but, "CUDA") == (False, "no model buffer on a CUDA device (buffers: CPU)")


def test_artifact_markers_read_from_the_bytes(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    # a marker straddling the read chunk boundary is still found
    binary.write_bytes(b"\0" * 10 + b"ggml_backend_vk_reg" + b"\0" * 5 + b"ggml_backend_rpc_reg")
    assert artifact_markers_missing(binary, ["ggml_backend_vk_reg", "ggml_backend_rpc_reg"], chunk=16) == []
    assert artifact_markers_missing(binary, ["ggml_backend_cuda_reg"], chunk=16) == ["ggml_backend_cuda_reg"]


def test_template_leak() -> None:
    assert template_leak("Say OK<|im") == "<|im"
    assert template_leak("OK<end_of_turn>") == "<end_of_turn>"
    assert template_leak("OK") is None
    # Mistral's and Phi-3's markers (the tiny mistral and phi3 models speak them)
    assert template_leak("OK [/INST]") == "[/INST]"
    assert template_leak("OK<|end|>") == "<|end|>"
