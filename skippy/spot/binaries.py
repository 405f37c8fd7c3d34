"""A build's binaries as the spot check meets them: which build and backend a server belongs
to, what it says it was built from (``--version``), which devices it lists, the newest build."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skippy.compile.backends import names as backend_names
from skippy.compile.backends import reference_backend
from skippy.compile.backends.base import RPC_TARGETS, SERVER_TARGET
from skippy.compile.builder import built_from, read_stamp
from skippy.compile.plan import STAMP_NAME
from skippy.core import proc
from skippy.core.errors import SpotCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot.evidence import parse_devices
from skippy.spot.report import Provenance
from skippy.spot.server import (
    describe_exit,
)

_PROVENANCE_RE = re.compile(r"skippy:\s*upstream=(?P<upstream>\S+)\s+queue=(?P<queue>\S+)")


_VERSION_RE = re.compile(r"^version: .*$", re.MULTILINE)


def parse_provenance(text: str) -> Provenance | None:
    """``skippy: upstream=<sha> queue=<digest>`` from ``llama-server --version`` output."""
    match = _PROVENANCE_RE.search(text)
    if match is None:
        return None
    return Provenance(match["upstream"], match["queue"])


def version_line(text: str) -> str | None:
    match = _VERSION_RE.search(text)
    return match.group(0).removeprefix("version: ").strip() if match else None


def provenance_mismatch(expected: Provenance, reported: Provenance | None) -> str | None:
    """Why ``reported`` is not ``expected`` (None when it is)."""
    if reported is None:
        return (
            "the binary reports no provenance (no `skippy: upstream=... queue=...` line in --version): "
            "it was built before provenance was added, or not by skippy"
        )
    diffs = []
    if reported.upstream_sha != expected.upstream_sha:
        diffs.append(f"upstream is {reported.upstream_sha}, expected {expected.upstream_sha}")
    if reported.queue_digest != expected.queue_digest:
        diffs.append(f"queue digest is {reported.queue_digest}, expected {expected.queue_digest}")
    return "; ".join(diffs) or None


def build_dir_of(server: Path, settings: Settings) -> Path | None:
    """The build directory (``<build_root>/<backend>-<digest>``) a server binary is in, if any."""
    try:
        rel = server.resolve().relative_to(settings.build_root.resolve())
    except ValueError:
        return None
    return settings.build_root / rel.parts[0] if len(rel.parts) > 1 else None


def backend_of(server: Path, settings: Settings) -> str:
    """The backend a server binary was built for (``<build_root>/<backend>-<digest>/bin/...``)."""
    build_dir = build_dir_of(server, settings)
    if build_dir is None:
        return reference_backend()
    name = build_dir.name
    for backend in backend_names():
        if name == backend or name.startswith(backend + "-"):
            return backend
    return reference_backend()


def read_version(server_binary: Path, env: Mapping[str, str], console: Console) -> str:
    """``llama-server --version`` output (it prints to stderr and exits 0)."""
    if proc.which(str(server_binary), env) is None:
        raise SpotCheckFailed(
            f"server binary {server_binary} is missing or not executable",
            untouched="everything: no server was started",
            next_step="nox -s build-cpu, or pass --server PATH",
        )
    result = _ask(server_binary, "--version", env, console, timeout=60)
    return (result.stdout + "\n" + result.stderr).strip()


def _ask(server_binary: Path, flag: str, env: Mapping[str, str], console: Console, *, timeout: float) -> proc.Result:
    """``llama-server <flag>``: a question it answers and exits (never fails here)."""
    return proc.run(
        [server_binary, flag], env=env, check=False, timeout=timeout, echo=console.command, what=f"llama-server {flag}"
    )


@dataclass(frozen=True)
class DeviceListing:
    """What ``llama-server --list-devices`` said: the devices, or why it could not say."""

    devices: list[str]
    #: the command's failure (exit code and its last line), None when it ran
    failure: str | None = None


def list_devices(server_binary: Path, env: Mapping[str, str], console: Console) -> DeviceListing:
    """The devices ``llama-server --list-devices`` reports (in the spot check's environment)."""
    result = _ask(server_binary, "--list-devices", env, console, timeout=120)
    failure = None
    if not result.ok:
        last = result.tail(1) or "no output"
        failure = f"llama-server --list-devices {describe_exit(result.returncode)}: {last}"
    return DeviceListing(parse_devices(result.stdout + "\n" + result.stderr), failure)


def no_device_reason(listing: DeviceListing, prefix: str) -> str | None:
    """Why the models cannot be checked on a ``prefix`` device, or None when one is listed."""
    if any(name.startswith(prefix) for name in listing.devices):
        return None
    seen = listing.failure or f"llama-server --list-devices lists: {', '.join(listing.devices) or 'none'}"
    return f"no {prefix} device on this machine ({seen}); the artifact gate (the backend is in the binary) stands in"


def default_server(settings: Settings, backend: str | None = None) -> Path:
    """The newest llama-server of ``backend`` under build_root built from this workdir; without
    one, the newest CPU build, else the newest of any backend.

    Builds live in ``<build_root>/<backend>-<digest>/bin/`` (see :mod:`skippy.compile.builder`).
    """

    def ours(server: Path) -> bool:
        # another workdir may share the build root: its builds are not this one's
        stamp = read_stamp(server.parent.parent / STAMP_NAME)
        return stamp is None or built_from(stamp, settings.workdir)

    def newest(pattern: str) -> Path | None:
        found = sorted(filter(ours, settings.build_root.glob(pattern)), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    wanted = backend or reference_backend()
    patterns = [f"{wanted}-*/bin/{SERVER_TARGET}", f"{wanted}/bin/{SERVER_TARGET}"]
    if backend is None:
        patterns.append(f"*/bin/{SERVER_TARGET}")
    for pattern in patterns:
        found = newest(pattern)
        if found is not None:
            return found
    raise SpotCheckFailed(
        f"no {backend + ' ' if backend else ''}{SERVER_TARGET} build under {settings.relative(settings.build_root)}",
        untouched="everything: nothing was started",
        next_step=f"nox -s build-{wanted} (or pass --server PATH)",
    )


def rpc_server_beside(server: Path) -> Path | None:
    """The RPC server built beside ``server`` (``ggml-rpc-server``, or ``rpc-server`` on older trees)."""
    return next((server.parent / name for name in RPC_TARGETS if (server.parent / name).is_file()), None)
