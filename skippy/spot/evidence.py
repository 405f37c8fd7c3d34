"""What proves that a build computes where it should: pure readers of llama-server's
output and of the binary itself.

- :func:`parse_devices`: ``llama-server --list-devices`` -> the device names.
- :func:`parse_offload`: the load log -> layers offloaded and the model buffers per
  device (``load_tensors: offloaded 19/19 layers to GPU``,
  ``load_tensors:   RPC0[127.0.0.1:5050] model buffer size =   123.45 MiB``).
- :func:`device_evidence`: whether the model's layers went to a device whose name
  starts with the backend's prefix (``Vulkan0``, ``CUDA0``, ``RPC0[...]``), not to the CPU.
- :func:`artifact_markers_missing`: the backend's registration symbol in the binary
  (a CPU-only fallback build lacks it), read from the file's bytes.
- :func:`template_leak`: chat template tokens in an answer (the wrong template).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

_DEVICE_LINE = re.compile(r"^\s{2}(?P<name>\S+?):\s")
_OFFLOADED = re.compile(r"offloaded (?P<n>\d+)/(?P<total>\d+) layers to GPU")
_BUFFER = re.compile(r"load_tensors:\s+(?P<device>\S+) model buffer size =\s*(?P<mib>[\d.]+) MiB")

#: tokens of chat templates that must never show in an answer (the server used the wrong template)
TEMPLATE_TOKENS: Final = (
    "<|im_start|>",
    "<|im_end|>",
    "<|im",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|start_header_id|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "[INST]",
    "[/INST]",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)


def parse_devices(text: str) -> list[str]:
    """Device names from ``--list-devices`` (``Available devices:`` then ``  NAME: description``)."""
    names: list[str] = []
    listing = False
    for line in text.splitlines():
        if line.startswith("Available devices:"):
            listing = True
            continue
        if listing:
            m = _DEVICE_LINE.match(line)
            if m and m.group("name") != "(none)":
                names.append(m.group("name"))
    return names


@dataclass(frozen=True)
class Offload:
    layers: int | None = None
    total: int | None = None
    #: device name -> model buffer size in MiB (CPU buffers included, e.g. ``CPU_Mapped``)
    buffers: dict[str, float] = field(default_factory=dict)


def parse_offload(lines: Iterable[str]) -> Offload:
    layers = total = None
    buffers: dict[str, float] = {}
    for line in lines:
        m = _OFFLOADED.search(line)
        if m:
            layers, total = int(m.group("n")), int(m.group("total"))
        b = _BUFFER.search(line)
        if b:
            buffers[b.group("device")] = buffers.get(b.group("device"), 0.0) + float(b.group("mib"))
    return Offload(layers=layers, total=total, buffers=buffers)


def device_evidence(offload: Offload, prefix: str) -> tuple[bool, str]:
    """(used, why): all layers offloaded and a model buffer on a ``prefix*`` device."""
    on_device = {name: mib for name, mib in offload.buffers.items() if name.startswith(prefix)}
    if offload.layers is None:
        return False, "the load log does not say how many layers were offloaded"
    if offload.layers < (offload.total or 0):
        return False, f"only {offload.layers}/{offload.total} layers were offloaded"
    if not on_device:
        seen = ", ".join(sorted(offload.buffers)) or "none"
        return False, f"no model buffer on a {prefix} device (buffers: {seen})"
    where = ", ".join(f"{name} {mib:.1f} MiB" for name, mib in sorted(on_device.items()))
    return True, f"{offload.layers}/{offload.total} layers offloaded; model buffers on {where}"


def artifact_markers_missing(binary: Path, markers: Sequence[str], *, chunk: int = 1 << 22) -> list[str]:
    """The ``markers`` (symbol names) that do not occur in ``binary``'s bytes."""
    wanted = {m.encode() for m in markers}
    found: set[bytes] = set()
    overlap = max((len(m) for m in wanted), default=1)
    tail = b""
    with binary.open("rb") as f:
        while wanted - found:
            block = f.read(chunk)
            if not block:
                break
            window = tail + block
            found |= {m for m in wanted - found if m in window}
            tail = window[-overlap:]
    return sorted(m.decode() for m in wanted - found)


def template_leak(answer: str) -> str | None:
    """The first chat-template token found in ``answer``, or None."""
    return next((token for token in TEMPLATE_TOKENS if token in answer), None)
