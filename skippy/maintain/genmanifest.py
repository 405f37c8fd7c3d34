"""The generated lane's inputs manifest, ``generated/inputs.sha256``: what the lane was made from.

The inputs (the generator's identity, the pin, the spec's digest, the digest of the core and
model_support lanes), their digest, each shard's sha256 and the digest of all: ``invoke
regenerate`` remakes the lane only when its recorded inputs changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from skippy.core.settings import Settings
from skippy.maintain.genrun import Generator, generator_from_settings
from skippy.maintain.genspec import SPEC_NAME, Spec
from skippy.queue.model import Lane, Queue, queue_digest

GENERATOR_VERSION = "skippy-generated-v3"


def identity(generator: Generator, root: Path) -> str:
    return f"builtin {GENERATOR_VERSION}" if generator.builtin else f"command sha256:{generator.digest(root)}"


def input_lines(generator_id: str, spec_sha256: str, upstream_sha: str, lanes: str) -> list[str]:
    return [
        f"generator {generator_id}",
        f"pin {upstream_sha}",
        f"spec {SPEC_NAME} {spec_sha256}",
        f"lanes core+model_support {lanes}",
    ]


def manifest(inputs: Sequence[str], shards: Mapping[str, bytes], *, command: Sequence[str] = ()) -> str:
    """The manifest (``inputs.sha256``): the inputs, their digest, each shard's sha256, the digest of all."""
    inputs_digest = hashlib.sha256("\n".join(inputs).encode() + b"\n").hexdigest()
    lines = [*inputs, f"inputs {inputs_digest}"]
    lines += [f"shard {name} {hashlib.sha256(data).hexdigest()}" for name, data in shards.items()]
    digest = hashlib.sha256("\n".join(lines).encode() + b"\n").hexdigest()
    head = "# the generated lane's inputs and shards; `invoke generate` rewrites this file\n"
    if command:
        head += f"# command: {json.dumps(list(command))}\n"
    return head + "".join(line + "\n" for line in lines) + f"sha256 {digest}\n"


def manifest_lines(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = value
    return out


def inputs_of(manifest_text: str) -> dict[str, str]:
    """The input lines of a manifest (neither the shards nor the digests)."""
    return {k: v for k, v in manifest_lines(manifest_text).items() if not k.startswith("shard ") and k != "sha256"}


def lanes_digest(queue: Queue) -> str:
    return queue_digest(tuple(p for p in queue.patches if p.lane in (Lane.CORE, Lane.MODEL_SUPPORT)))


def expected_inputs(settings: Settings, spec: Spec, upstream_sha: str, queue: Queue) -> dict[str, str]:
    generator = generator_from_settings(settings)
    lines = input_lines(identity(generator, settings.root), spec.sha256, upstream_sha, lanes_digest(queue))
    return inputs_of(manifest(lines, {}))
