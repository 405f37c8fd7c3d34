"""Where the compiler cache keeps its objects: the local directory or a remote storage.

Pure decisions, no I/O except :func:`reachable` (one bounded TCP connect):

* :func:`select_storage` reads ``[tool.skippy.build] cache_storage`` or
  ``SKIPPY_CACHE_STORAGE`` (``local``, ``redis://...``, ``s3://bucket/prefix?region=...``,
  ``gha``, ``webdav://...``) and turns it into sccache's own environment variables
  (``SCCACHE_REDIS_ENDPOINT``, ``SCCACHE_BUCKET`` ...). When the user's environment
  already configures an sccache storage, that configuration is used as given.
* Every description meant for output, reports or stamps is redacted: passwords in
  URLs, secret query parameters and the values of credential variables never
  appear (:func:`redact_url`, :meth:`CacheStorage.scrub`).
* :func:`local_fallback_env` is the environment of a local build when the remote
  cannot be reached: every storage variable removed, the local directory kept.
* :func:`launcher_env` and :func:`rootfs_launcher_env` are the compiler cache's environment:
  its local directory, the remote storage's variables, the socket of a server of its own.

What keeps a shared storage from serving a wrong object (the host CPU of a ``-march=native``
build, read-only jobs) is in :mod:`skippy.compile.sharedcache`.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, parse_qsl, urlsplit, urlunsplit

from skippy.core.errors import SettingsError
from skippy.core.redact import MASK, redact_url
from skippy.core.redact import redact_urls as _redact_urls_in

LOCAL: Final = "local"
KINDS: Final = ("local", "redis", "s3", "gha", "webdav")
#: the environment variable and the [tool.skippy.build] key that choose the storage
ENV_VAR: Final = "SKIPPY_CACHE_STORAGE"
TABLE_KEY: Final = "cache_storage"
#: seconds to wait for a TCP connection to the remote before building locally
REACH_TIMEOUT: Final = 3.0

#: sccache variables that select a storage (any of them: the user configured sccache)
STORAGE_SELECTORS: Final = (
    "SCCACHE_REDIS_ENDPOINT",
    "SCCACHE_REDIS_CLUSTER_ENDPOINTS",
    "SCCACHE_REDIS",
    "SCCACHE_BUCKET",
    "SCCACHE_GHA_ENABLED",
    "SCCACHE_WEBDAV_ENDPOINT",
    "SCCACHE_MEMCACHED_ENDPOINT",
    "SCCACHE_MEMCACHED",
    "SCCACHE_GCS_BUCKET",
    "SCCACHE_AZURE_CONNECTION_STRING",
    "SCCACHE_OSS_BUCKET",
    "SCCACHE_COS_BUCKET",
    "SCCACHE_MULTILEVEL_CHAIN",
)
#: prefixes of every variable that configures a remote storage (removed for a local fallback)
_STORAGE_PREFIXES: Final = (
    "SCCACHE_REDIS",
    "SCCACHE_BUCKET",
    "SCCACHE_ENDPOINT",
    "SCCACHE_REGION",
    "SCCACHE_S3_",
    "SCCACHE_GHA_",
    "SCCACHE_WEBDAV_",
    "SCCACHE_MEMCACHED",
    "SCCACHE_GCS_",
    "SCCACHE_AZURE_",
    "SCCACHE_OSS_",
    "SCCACHE_COS_",
    "SCCACHE_MULTILEVEL_",
)
#: variables whose values are credentials: never shown, and scrubbed from any text we show
SECRET_VARS: Final = (
    "SCCACHE_REDIS_PASSWORD",
    "SCCACHE_WEBDAV_PASSWORD",
    "SCCACHE_WEBDAV_TOKEN",
    "SCCACHE_MEMCACHED_PASSWORD",
    "SCCACHE_AZURE_CONNECTION_STRING",
    "SCCACHE_GCS_KEY_PATH",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "ACTIONS_RUNTIME_TOKEN",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
)

#: s3://bucket/prefix?name=value: the query names sccache's [cache.s3] keys, mapped to its variables
_S3_PARAMS: Final = {
    "region": "SCCACHE_REGION",
    "endpoint": "SCCACHE_ENDPOINT",
    "use_ssl": "SCCACHE_S3_USE_SSL",
    "no_credentials": "SCCACHE_S3_NO_CREDENTIALS",
    "server_side_encryption": "SCCACHE_S3_SERVER_SIDE_ENCRYPTION",
    "enable_virtual_host_style": "SCCACHE_S3_ENABLE_VIRTUAL_HOST_STYLE",
}
_GHA_PARAMS: Final = {"version": "SCCACHE_GHA_VERSION"}
_WEBDAV_PARAMS: Final = {"key_prefix": "SCCACHE_WEBDAV_KEY_PREFIX"}
_REDIS_DEFAULT_PORT: Final = 6379
#: an inline PING: a simple-string or error reply ("+PONG", "-NOAUTH ...") shows a live Redis
_REDIS_HELLO: Final = (b"PING\r\n", b"+-")


@dataclass(frozen=True)
class CacheStorage:
    """The storage sccache should use for this build."""

    kind: str
    #: redacted: safe for output, reports and stamps
    description: str
    #: where the choice came from ("default", "SKIPPY_CACHE_STORAGE", "environment (SCCACHE_BUCKET)" ...)
    source: str
    #: variables to add for sccache (may hold credentials: never shown)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: (host, port) to check before starting the server, when one is known
    endpoint: tuple[str, int] | None = None
    #: why the remote cannot be used at all (e.g. gha outside GitHub Actions), decided up front
    unusable: str | None = None
    #: values to scrub from any text shown (sccache's messages and stats name the endpoint)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    #: (bytes to send, the first bytes a live server may answer with) checked after connecting
    hello: tuple[bytes, bytes] | None = None

    @property
    def remote(self) -> bool:
        return self.kind != LOCAL

    def scrub(self, text: str) -> str:
        """``text`` with every credential replaced by ``***`` (and URLs' passwords redacted)."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, MASK)
        return _redact_urls_in(text)

    def socket_tag(self) -> str:
        """A short tag naming this storage's server (a server per storage, so a running one
        with another storage is never reused). Derived from a hash: no credential shows."""
        if not self.remote:
            return ""
        blob = "\n".join(f"{k}={v}" for k, v in sorted(self.env.items())) + "\n" + self.description
        return hashlib.sha256(blob.encode()).hexdigest()[:8]


def local_storage(source: str = "default") -> CacheStorage:
    return CacheStorage(kind=LOCAL, description="local directory", source=source)


def select_storage(table_value: object, env: Mapping[str, str]) -> CacheStorage:
    """The storage for this build, from ``[tool.skippy.build] cache_storage`` and ``env``.

    Order: the user's own sccache storage variables (used as given), then
    ``SKIPPY_CACHE_STORAGE``, then the table, then the local directory.
    """
    configured = [name for name in STORAGE_SELECTORS if env.get(name)]
    if configured:
        return _from_sccache_env(configured, env)
    value = env.get(ENV_VAR)
    source = ENV_VAR
    if not value:
        if table_value is not None and not isinstance(table_value, str):
            raise SettingsError(
                f"[tool.skippy.build] {TABLE_KEY} must be a string, got {type(table_value).__name__}",
                untouched="everything",
                next_step=f'set {TABLE_KEY} = "local" or a storage URL such as "redis://cache.example:6379"',
            )
        value = table_value or ""
        source = f"[tool.skippy.build] {TABLE_KEY}"
    if not value or value.strip().lower() == LOCAL:
        return local_storage("default" if not value else source)
    return parse_storage(value.strip(), env, source=source)


def parse_storage(value: str, env: Mapping[str, str], *, source: str) -> CacheStorage:
    """One ``cache_storage`` value -> sccache's variables (raises SettingsError when malformed)."""
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme == "gha" or (not scheme and parts.path.lower() == "gha"):
        return _gha(parts.query, env, source, value)
    if scheme in ("redis", "rediss"):
        return _redis(parts, env, source, value)
    if scheme == "s3":
        return _s3(parts, env, source, value)
    if scheme in ("webdav", "webdavs"):
        return _webdav(parts, env, source, value)
    raise _bad(
        value,
        source,
        "use local, redis://host:port, s3://bucket/prefix (?region=...&endpoint=...), gha or webdav://host/path",
    )


def _redis(parts: SplitResult, env: Mapping[str, str], source: str, value: str) -> CacheStorage:
    scheme = parts.scheme.lower()
    if not parts.hostname:
        raise _bad(value, source, "a Redis URL names its host: redis://[:password@]host[:port][/db]")
    port = _port(parts, _REDIS_DEFAULT_PORT, value, source)
    # sccache ignores the user info of the endpoint URL (and then waits on the
    # server's refusal): credentials and the database go in its own variables
    out = {"SCCACHE_REDIS_ENDPOINT": urlunsplit((scheme, f"{parts.hostname}:{port}", "", "", parts.fragment))}
    if parts.username:
        out["SCCACHE_REDIS_USERNAME"] = parts.username
    if parts.password:
        out["SCCACHE_REDIS_PASSWORD"] = parts.password
    db = parts.path.strip("/")
    if db:
        if not db.isdigit():
            raise _bad(value, source, "the Redis database is a number: redis://host:port/0")
        out["SCCACHE_REDIS_DB"] = db
    if parts.query:
        raise _bad(value, source, "a Redis URL takes no query: redis://[user:password@]host[:port][/db]")
    secrets = (parts.password,) if parts.password else ()
    return CacheStorage(
        kind="redis",
        description=f"redis {redact_url(value)}",
        source=source,
        env=out,
        endpoint=(parts.hostname, port),
        secrets=(*secrets, *_env_secrets(env)),
        hello=_REDIS_HELLO if scheme == "redis" else None,
    )


def _gha(query: str, env: Mapping[str, str], source: str, value: str) -> CacheStorage:
    params = _params(query, _GHA_PARAMS, value, source)
    url = env.get("ACTIONS_RESULTS_URL") or env.get("ACTIONS_CACHE_URL") or ""
    unusable = None
    endpoint = None
    if not env.get("ACTIONS_RUNTIME_TOKEN") or not url:
        unusable = "the GitHub Actions cache needs ACTIONS_RUNTIME_TOKEN and ACTIONS_RESULTS_URL (set in workflow jobs)"
    else:
        parts = urlsplit(url)
        if parts.hostname:
            endpoint = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    return CacheStorage(
        kind="gha",
        description="GitHub Actions cache" + (f" (version {params['SCCACHE_GHA_VERSION']})" if params else ""),
        source=source,
        env={"SCCACHE_GHA_ENABLED": "true", **params},
        endpoint=endpoint,
        unusable=unusable,
        secrets=_env_secrets(env),
    )


def _s3(parts: SplitResult, env: Mapping[str, str], source: str, value: str) -> CacheStorage:
    bucket = parts.hostname or ""
    if not bucket:
        raise _bad(value, source, "an S3 storage names its bucket: s3://bucket/prefix?region=...")
    if parts.username or parts.password:
        raise _bad(
            redact_url(value),
            source,
            "S3 credentials are not part of the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        )
    params = _params(parts.query, _S3_PARAMS, value, source)
    out = {"SCCACHE_BUCKET": bucket, **params}
    prefix = parts.path.strip("/")
    if prefix:
        out["SCCACHE_S3_KEY_PREFIX"] = prefix
    endpoint = None
    given = params.get("SCCACHE_ENDPOINT")
    if given:
        ep = urlsplit(given if "://" in given else f"//{given}")
        ssl = ep.scheme == "https" or params.get("SCCACHE_S3_USE_SSL", "").lower() in ("1", "true", "yes", "on")
        if ep.hostname:
            endpoint = (ep.hostname, ep.port or (443 if ssl else 80))
    elif "SCCACHE_REGION" not in params:
        raise _bad(value, source, "S3 needs ?region=... (or ?endpoint=host:port&region=auto for S3-compatible stores)")
    where = f" at {redact_url(given)}" if given else ""
    return CacheStorage(
        kind="s3",
        description=f"s3 bucket {bucket}" + (f" prefix {prefix}" if prefix else "") + where,
        source=source,
        env=out,
        endpoint=endpoint,
        secrets=_env_secrets(env),
    )


def _webdav(parts: SplitResult, env: Mapping[str, str], source: str, value: str) -> CacheStorage:
    if not parts.hostname:
        raise _bad(value, source, "a WebDAV URL names its host: webdav://host[:port]/path (webdavs:// for https)")
    https = parts.scheme.lower() == "webdavs"
    params = _params(parts.query, _WEBDAV_PARAMS, value, source)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    endpoint_url = urlunsplit(("https" if https else "http", netloc, parts.path or "/", "", ""))
    out = {"SCCACHE_WEBDAV_ENDPOINT": endpoint_url, **params}
    if parts.username:
        out["SCCACHE_WEBDAV_USERNAME"] = parts.username
    if parts.password:
        out["SCCACHE_WEBDAV_PASSWORD"] = parts.password
    secrets = (parts.password,) if parts.password else ()
    return CacheStorage(
        kind="webdav",
        description=f"webdav {endpoint_url}" + (" (with credentials)" if parts.username or parts.password else ""),
        source=source,
        env=out,
        endpoint=(parts.hostname, parts.port or (443 if https else 80)),
        secrets=(*secrets, *_env_secrets(env)),
    )


def _env_redis(value: str) -> tuple[tuple[str, int] | None, list[str], tuple[bytes, bytes] | None, str]:
    parts = urlsplit(value if "://" in value else f"redis://{value}")
    hello = _REDIS_HELLO if parts.scheme in ("redis", "tcp") else None
    secrets = [parts.password] if parts.password else []
    endpoint = None
    if parts.hostname:
        try:
            endpoint = (parts.hostname, parts.port or _REDIS_DEFAULT_PORT)
        except ValueError:
            endpoint = None
    return endpoint, secrets, hello, redact_url(value)


def _env_webdav(value: str) -> tuple[tuple[str, int] | None, list[str], str]:
    parts = urlsplit(value)
    secrets = [parts.password] if parts.password else []
    endpoint = None
    if parts.hostname:
        endpoint = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    return endpoint, secrets, redact_url(value)


def _env_s3(value: str, env: Mapping[str, str]) -> tuple[tuple[str, int] | None, str]:
    given = env.get("SCCACHE_ENDPOINT", "")
    endpoint = None
    if given:
        ep = urlsplit(given if "://" in given else f"//{given}")
        if ep.hostname:
            endpoint = (ep.hostname, ep.port or (443 if ep.scheme == "https" else 80))
    return endpoint, f"bucket {value}" + (f" at {redact_url(given)}" if given else "")


def _from_sccache_env(configured: list[str], env: Mapping[str, str]) -> CacheStorage:
    """The user configured sccache themselves: keep it as given, describe it redacted."""
    first = configured[0]
    value = env[first]
    kind = {
        "SCCACHE_REDIS_ENDPOINT": "redis",
        "SCCACHE_REDIS": "redis",
        "SCCACHE_REDIS_CLUSTER_ENDPOINTS": "redis",
        "SCCACHE_BUCKET": "s3",
        "SCCACHE_GHA_ENABLED": "gha",
        "SCCACHE_WEBDAV_ENDPOINT": "webdav",
    }.get(first, first.removeprefix("SCCACHE_").split("_")[0].lower())
    endpoint: tuple[str, int] | None = None
    secrets: list[str] = list(_env_secrets(env))
    hello: tuple[bytes, bytes] | None = None
    if kind == "redis" and first != "SCCACHE_REDIS_CLUSTER_ENDPOINTS":
        endpoint, more, hello, detail = _env_redis(value)
        secrets += more
    elif kind == "webdav":
        endpoint, more, detail = _env_webdav(value)
        secrets += more
    elif kind == "s3":
        endpoint, detail = _env_s3(value, env)
    elif kind == "gha":
        if env.get("SCCACHE_GHA_ENABLED", "").lower() in ("0", "false", "off", "no"):
            return local_storage("environment (SCCACHE_GHA_ENABLED is off)")
        detail = "GitHub Actions cache"
    else:
        detail = "configured in the environment"
    unusable = None
    if kind == "gha" and not env.get("ACTIONS_RUNTIME_TOKEN"):
        unusable = "the GitHub Actions cache needs ACTIONS_RUNTIME_TOKEN and ACTIONS_RESULTS_URL (set in workflow jobs)"
    return CacheStorage(
        kind=kind,
        description=f"{kind} {detail}" if kind != "gha" else detail,
        source=f"environment ({', '.join(configured)})",
        env={},
        endpoint=endpoint,
        unusable=unusable,
        secrets=tuple(secrets),
        hello=hello,
    )


def basedirs_env(launcher: str, env: Mapping[str, str], roots: Sequence[Path]) -> dict[str, str]:
    """For sccache: ``SCCACHE_BASEDIRS`` naming the source tree and the build root, so object
    keys do not depend on where a tree is kept (a copy, a second checkout, another machine
    sharing a remote). A user's own ``SCCACHE_BASEDIRS`` is kept."""
    if launcher != "sccache" or env.get("SCCACHE_BASEDIRS"):
        return {}
    return {"SCCACHE_BASEDIRS": os.pathsep.join(str(root) for root in roots)}


def local_fallback_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without any remote storage variable: sccache falls back to its local directory."""
    return {k: v for k, v in env.items() if not k.startswith(_STORAGE_PREFIXES)}


def reachable(storage: CacheStorage, timeout: float = REACH_TIMEOUT) -> str | None:
    """None when the storage can be tried; else why not (one TCP connect, bounded)."""
    if not storage.remote:
        return None
    if storage.unusable:
        return storage.unusable
    if storage.endpoint is None:
        return None
    host, port = storage.endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if storage.hello:
                # a port that accepts but does not speak the protocol would hang sccache's start
                conn.settimeout(timeout)
                conn.sendall(storage.hello[0])
                reply = conn.recv(64)
                if not reply or reply[0] not in storage.hello[1]:
                    return f"{host}:{port} does not answer like {storage.kind} ({reply[:20]!r})"
            return None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {timeout:g} s"
        return f"cannot connect to {host}:{port} ({reason})"


# --- redaction ------------------------------------------------------------------


def _env_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(env[name] for name in SECRET_VARS if env.get(name))


def _params(query: str, known: Mapping[str, str], value: str, source: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, val in parse_qsl(query, keep_blank_values=True):
        var = known.get(name)
        if var is None:
            raise _bad(
                redact_url(value),
                source,
                f"unknown parameter {name!r}; known: {', '.join(sorted(known)) or 'none'}",
            )
        out[var] = val
    return out


def _port(parts: SplitResult, default: int, value: str, source: str) -> int:
    try:
        return parts.port or default
    except ValueError:
        raise _bad(redact_url(value), source, "the port is not a number") from None


def _bad(value: str, source: str, hint: str) -> SettingsError:
    return SettingsError(
        f"{source}: cannot use {redact_url(value)!r} as the compiler cache storage",
        untouched="everything: nothing was configured or built",
        next_step=hint,
    )


#: Unix sockets have a ~108-byte path limit; past this sccache uses its TCP port
_UDS_MAX: Final = 100


def launcher_env(
    kind: str, cache_dir: Path, storage: CacheStorage | None = None, *, dist_tag: str = ""
) -> dict[str, str]:
    """Environment for the compiler cache: its store under ``cache_dir``, or the remote
    ``storage`` in sccache's own variables (served by a server of its own); ``dist_tag`` names
    the server of a build sent to an sccache-dist cluster (its config is read when it starts)."""
    if kind == "sccache":
        env = {"SCCACHE_DIR": str(cache_dir / "sccache")}
        # a server of our own, so SCCACHE_DIR is honoured and the stats are ours; one per
        # storage (and cluster), so a running server with another storage is never reused
        tag = storage.socket_tag() if storage is not None else ""
        tag = f"{tag}-d{dist_tag}" if dist_tag and tag else (f"d{dist_tag}" if dist_tag else tag)
        sock = cache_dir / (f"sccache-{tag}.sock" if tag else "sccache.sock")
        if len(str(sock)) <= _UDS_MAX:
            env["SCCACHE_SERVER_UDS"] = str(sock)
        else:
            # too long for a Unix socket: a loopback port derived from the cache dir
            seed = int(hashlib.sha256((str(cache_dir) + tag).encode()).hexdigest()[:8], 16)
            env["SCCACHE_SERVER_PORT"] = str(20000 + seed % 20000)
        if storage is not None:
            env.update(storage.env)
        return env
    if kind == "ccache":
        # depend mode: the key is the files of the compiler's own depfile (CMake's Ninja rules
        # always ask for one), so a hit runs no preprocessor; and it is the sound mode for nvcc,
        # whose one `nvcc -E` (ccache's other modes) sees device code only: an edit of host-only
        # code got the old object back (the bench's cuda-profile section checks both)
        return {"CCACHE_DIR": str(cache_dir / "ccache"), "CCACHE_DEPEND": "true"}
    return {}


#: the folder of the sockets of the servers that run inside a root file system (bound in)
ROOT_SERVERS: Final = "sccache-root"


def rootfs_launcher_env(cache_dir: Path, tag: str) -> dict[str, str]:
    """sccache's environment for a build inside a root file system: the same local directory
    (bound into the root at its own path), a server of the root's own (socket ``<tag>.sock``
    in :data:`ROOT_SERVERS`, bound in too), never the host's. Local directory only."""
    env = {"SCCACHE_DIR": str(cache_dir / "sccache")}
    sock = cache_dir / ROOT_SERVERS / f"{tag}.sock"
    if len(str(sock)) <= _UDS_MAX:
        env["SCCACHE_SERVER_UDS"] = str(sock)
    else:
        seed = int(hashlib.sha256((str(cache_dir) + "root" + tag).encode()).hexdigest()[:8], 16)
        env["SCCACHE_SERVER_PORT"] = str(20000 + seed % 20000)
    return env


__all__ = [
    "ENV_VAR",
    "KINDS",
    "LOCAL",
    "ROOT_SERVERS",
    "TABLE_KEY",
    "CacheStorage",
    "basedirs_env",
    "launcher_env",
    "local_fallback_env",
    "local_storage",
    "reachable",
    "rootfs_launcher_env",
    "select_storage",
]
