"""Compiles farmed out to an sccache-dist cluster (``[tool.skippy.build] dist``).

``dist = "http://scheduler:10600"`` (or ``SKIPPY_DIST``, which wins) sends every compile of
a build through sccache to the cluster's scheduler, with the client token from
``SKIPPY_DIST_TOKEN`` (never printed, never in a report: it is written only into sccache's
client config, a ``0600`` file under the cache dir). sccache packages the toolchain itself on
Linux (the compiler and the libraries it loads); the build servers run it in a bubblewrap
sandbox.

Pure decisions here (:func:`select_dist`, :func:`client_config`, the parsers of
``sccache --dist-status`` and of the stats); :func:`write_client_config` writes the file and
:mod:`skippy.compile.cachestats` checks the cluster before the build (reachable, at least one
build server, the token accepted by a probe compile) and falls back to local compiles with
one warning when it cannot be used.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from skippy.core.errors import SettingsError
from skippy.core.redact import MASK, redact_url

#: the environment variable and the [tool.skippy.build] key that name the scheduler
ENV_VAR: Final = "SKIPPY_DIST"
TOKEN_VAR: Final = "SKIPPY_DIST_TOKEN"  # noqa: S105 - the variable's name, not a token
TABLE_KEY: Final = "dist"
#: the folder under the cache dir holding the client configs and the packaged toolchains
FOLDER: Final = "sccache-dist"
#: values that switch distribution off explicitly
OFF: Final = ("", "off", "none", "local", "false", "0")


@dataclass(frozen=True)
class DistCluster:
    """The cluster a build sends its compiles to."""

    scheduler_url: str
    #: where the choice came from ("SKIPPY_DIST", "[tool.skippy.build] dist")
    source: str
    #: the client token (None: the scheduler runs without client authentication)
    token: str | None = field(default=None, repr=False)

    @property
    def description(self) -> str:
        """Safe for output and reports: the scheduler's URL without credentials."""
        return f"sccache-dist scheduler {redact_url(self.scheduler_url)}"

    def scrub(self, text: str) -> str:
        """``text`` with the token replaced by ``***``."""
        return text.replace(self.token, MASK) if self.token else text

    def tag(self) -> str:
        """A short tag naming this cluster's sccache server (another cluster or token, another
        server). A hash: the token does not show."""
        blob = f"{self.scheduler_url}\n{self.token or ''}"
        return hashlib.sha256(blob.encode()).hexdigest()[:8]


def select_dist(table_value: object, env: Mapping[str, str]) -> DistCluster | None:
    """The cluster for this build, from ``SKIPPY_DIST`` or ``[tool.skippy.build] dist``; None
    when distribution is off (the default). The token comes only from ``SKIPPY_DIST_TOKEN``:
    a token in pyproject.toml would be committed."""
    value = env.get(ENV_VAR)
    source = ENV_VAR
    if value is None:
        if table_value is not None and not isinstance(table_value, str):
            raise SettingsError(
                f"[tool.skippy.build] {TABLE_KEY} must be a string, got {type(table_value).__name__}",
                untouched="everything",
                next_step=f'set {TABLE_KEY} = "http://scheduler:10600" (or remove it to compile locally)',
            )
        value = table_value or ""
        source = f"[tool.skippy.build] {TABLE_KEY}"
    value = value.strip()
    if value.lower() in OFF:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(
            f"{source}: {redact_url(value)!r} is not the URL of an sccache-dist scheduler",
            untouched="everything: nothing was configured or built",
            next_step=f"{source.split(' ')[0]}=http://scheduler:10600 (the scheduler's public_addr), "
            "or `nox -s dist-cluster` to start one",
        )
    if parts.username or parts.password:
        raise SettingsError(
            f"{source}: {redact_url(value)!r}: the client token is not part of the URL",
            untouched="everything: nothing was configured or built",
            next_step=f"put the token in {TOKEN_VAR} and the bare URL in {source.split(' ')[0]}",
        )
    token = env.get(TOKEN_VAR) or None
    return DistCluster(scheduler_url=value.rstrip("/"), source=source, token=token)


@dataclass(frozen=True)
class DistSetup:
    """A build's part of the cluster: the client config to write before its sccache server
    starts, and the environment of the same build compiled locally (the fallback)."""

    cluster: DistCluster
    config: Path
    #: holds the token: never shown
    config_text: str = field(repr=False)
    #: the build's whole environment without the cluster (its storage kept)
    fallback_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def write(self) -> None:
        write_client_config(self.config, self.config_text)


def config_path(cache_dir: Path, cluster: DistCluster) -> Path:
    """Where the client config of ``cluster`` is written (named by its tag, not its token)."""
    return cache_dir / FOLDER / f"client-{cluster.tag()}.toml"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def client_config(cluster: DistCluster, toolchain_dir: Path) -> str:
    """sccache's client config for ``cluster`` (TOML, holds the token: written ``0600``)."""
    lines = [
        "# written by skippy for one cluster; holds the client token: do not commit or share",
        "[dist]",
        f"scheduler_url = {_toml_string(cluster.scheduler_url)}",
        "toolchains = []",
        f"cache_dir = {_toml_string(str(toolchain_dir))}",
        "",
        "[dist.auth]",
    ]
    if cluster.token:
        lines += ['type = "token"', f"token = {_toml_string(cluster.token)}"]
    else:
        lines.append('type = "DANGEROUSLY_INSECURE"')
    return "\n".join(lines) + "\n"


def dist_env(cache_dir: Path, cluster: DistCluster) -> dict[str, str]:
    """sccache's variables for a build sent to ``cluster``: its client config."""
    return {"SCCACHE_CONF": str(config_path(cache_dir, cluster))}


def write_client_config(path: Path, text: str) -> None:
    """Write the client config readable by its owner only (it holds the token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


# --- the cluster's state and the build's figures ------------------------------------


@dataclass(frozen=True)
class ClusterStatus:
    """``sccache --dist-status``: whether the scheduler answered, and with how many servers."""

    connected: bool
    servers: int = 0
    cpus: int = 0
    #: sccache's words when not connected ("enabled, not connected, will retry in 30.0s")
    detail: str = ""

    def unusable(self) -> str | None:
        """Why the cluster cannot take compiles now, or None."""
        if not self.connected:
            return f"the scheduler does not answer ({self.detail or 'not connected'})"
        if self.servers < 1:
            return "the scheduler has no build server (compiles would wait for one)"
        return None


def parse_dist_status(stdout: str) -> ClusterStatus:
    """``{"SchedulerStatus":[url,{"num_servers":2,"num_cpus":4,"in_progress":0}]}`` or
    ``{"NotConnected":[url,"..."]}`` (or ``"Disabled"``) -> :class:`ClusterStatus`."""
    text = stdout.strip()
    start = text.find("{")
    if start < 0:
        return ClusterStatus(False, detail=text[-200:] or "no answer")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return ClusterStatus(False, detail=text[-200:])
    if isinstance(data, dict) and "SchedulerStatus" in data:
        info = data["SchedulerStatus"][1] if len(data["SchedulerStatus"]) > 1 else {}
        return ClusterStatus(True, int(info.get("num_servers", 0)), int(info.get("num_cpus", 0)))
    if isinstance(data, dict) and "NotConnected" in data:
        words = data["NotConnected"]
        return ClusterStatus(False, detail=str(words[-1]) if words else "not connected")
    return ClusterStatus(False, detail=json.dumps(data)[:200])


@dataclass(frozen=True)
class DistCounts:
    """Where a build's compiles ran: on a build server, locally (never sent), or sent and run
    locally after the cluster failed them (failed over)."""

    remote: int = 0
    local: int = 0
    failed_over: int = 0
    #: compiles per build server ("127.0.0.1:10501": 12)
    servers: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "remote": self.remote,
            "local": self.local,
            "failed_over": self.failed_over,
            "servers": dict(sorted(self.servers.items())),
        }

    def render(self) -> str:
        return f"{self.remote} compiled remotely, {self.local} locally, {self.failed_over} failed over"


def dist_counts(stats_json: str) -> DistCounts:
    """``sccache --show-stats --stats-format=json`` -> :class:`DistCounts`."""
    stats = json.loads(stats_json).get("stats", {})
    servers = {str(k): int(v) for k, v in (stats.get("dist_compiles") or {}).items()}
    remote = sum(servers.values())
    failed = int(stats.get("dist_errors", 0) or 0)
    compiled = int(stats.get("compilations", 0) or 0)
    return DistCounts(remote=remote, local=max(compiled - remote - failed, 0), failed_over=failed, servers=servers)


#: what sccache says when the scheduler refuses the client token
_REFUSED: Final = ("401", "token mismatch", "Unauthorized")


def probe_failure(cluster: DistCluster, output: str) -> str:
    """Why the probe compile did not run remotely, from sccache's output (token scrubbed)."""
    if any(word in output for word in _REFUSED):
        return f"the scheduler refused the client token ({TOKEN_VAR}): {cluster.scrub(output.strip())[-200:]}"
    text = cluster.scrub(output.strip())[-300:]
    return "a probe compile was not run by the cluster" + (f": {text}" if text else "")


__all__ = [
    "ENV_VAR",
    "FOLDER",
    "TABLE_KEY",
    "TOKEN_VAR",
    "ClusterStatus",
    "DistCluster",
    "DistCounts",
    "DistSetup",
    "client_config",
    "config_path",
    "dist_counts",
    "dist_env",
    "parse_dist_status",
    "probe_failure",
    "select_dist",
    "write_client_config",
]
