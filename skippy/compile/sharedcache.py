"""A shared compiler cache that cannot serve a wrong object: a build with ``native = true``
keeps its objects under the host CPU's key namespace, and a job that builds a proposed change
reads the shared cache without writing it.

* :func:`host_cpu_tag` asks the C compiler what ``-march=native`` resolves to on this host
  (:func:`native_cpu_tag` reads its answer); :func:`native_namespace` puts that tag into the
  storage's key prefix, or refuses the remote storage with the reason.
* :func:`read_only_reason` decides, from GitHub Actions' variables and the event
  (:func:`github_event`), whether this job may write; :func:`read_only` sets sccache's
  ``*_RW_MODE`` for the storage, or refuses it where sccache cannot read without writing.

The storage itself (:class:`skippy.compile.cache.CacheStorage`) is chosen in
:mod:`skippy.compile.cache`; these only narrow it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

from skippy.compile.cache import CacheStorage
from skippy.core import proc
from skippy.core.errors import SkippyError

#: the variable of each storage kind whose value namespaces its keys (gha: its version)
_NAMESPACE_VARS: Final = {
    "redis": "SCCACHE_REDIS_KEY_PREFIX",
    "s3": "SCCACHE_S3_KEY_PREFIX",
    "webdav": "SCCACHE_WEBDAV_KEY_PREFIX",
    "gha": "SCCACHE_GHA_VERSION",
    "memcached": "SCCACHE_MEMCACHED_KEY_PREFIX",
    "gcs": "SCCACHE_GCS_KEY_PREFIX",
    "azure": "SCCACHE_AZURE_KEY_PREFIX",
    "oss": "SCCACHE_OSS_KEY_PREFIX",
    "cos": "SCCACHE_COS_KEY_PREFIX",
}
#: the variable that makes each storage kind read-only (sccache's ``*_RW_MODE``)
_READ_ONLY_VARS: Final = {kind: f"SCCACHE_{kind.upper()}_RW_MODE" for kind in _NAMESPACE_VARS}

#: what a compiler's ``-###`` says -march=native means: gcc's cc1 flags, clang's cc1 target
_NATIVE_WORDS: Final = re.compile(
    r"(?:^|\s)['\"]?(-march=\S+?|-mtune=\S+?|-mno-[\w.-]+|-m[\w.-]+|--param=[lL]\d?-cache[\w=-]*|"
    r"-target-cpu\s+\S+|-target-feature\s+\S+)['\"]?(?=\s|$)"
)


def native_cpu_tag(compiler_output: str) -> str | None:
    """A short tag of what ``-march=native`` resolves to on this host, from the C compiler's
    ``cc -march=native -### -E -x c -`` (gcc: the ``-march=``/``-m`` flags it hands cc1; clang:
    ``-target-cpu``/``-target-feature``); None when the output names none."""
    words: list[str] = []
    for line in compiler_output.splitlines():
        if "cc1" not in line and "-target-cpu" not in line:
            continue
        words += [m.group(1) for m in _NATIVE_WORDS.finditer(line.replace('"', ""))]
    resolved = [w for w in words if w not in {"-march=native", "-mtune=native"}]
    if not resolved:
        return None
    return "native-" + hashlib.sha256("\n".join(sorted(set(resolved))).encode()).hexdigest()[:12]


def host_cpu_tag(env: Mapping[str, str]) -> str | None:
    """:func:`native_cpu_tag` of this host's C compiler (``CC``, else ``cc``); None when it
    cannot be asked. One bounded compiler call."""
    compiler = env.get("CC") or "cc"
    if proc.which(compiler, env) is None:
        return None
    try:
        done = proc.run(
            [compiler, "-march=native", "-###", "-E", "-x", "c", "-"], env=env, input="", check=False, timeout=30
        )
    except (OSError, SkippyError):
        return None
    return native_cpu_tag(done.stdout + "\n" + done.stderr)


def native_namespace(storage: CacheStorage, cpu_tag: str | None, env: Mapping[str, str]) -> CacheStorage:
    """With ``native = true`` (-march=native), an object depends on the CPU of the host that
    compiled it, which no cache key holds (the flag is the same word everywhere): the host's
    CPU tag goes into the storage's key namespace, or the remote is refused with the reason
    (the build then uses the local directory, which only this host writes)."""
    if not storage.remote or storage.unusable:
        return storage
    var = _NAMESPACE_VARS.get(storage.kind)
    if cpu_tag is None:
        why = "native = true (-march=native): the host CPU's features could not be read from the C compiler"
        return replace(storage, unusable=why + ", so its objects cannot be kept apart from other hosts'")
    if var is None:
        return replace(
            storage,
            unusable=f"native = true (-march=native): {storage.kind} has no key prefix skippy can set to "
            "keep this host's objects apart from other CPUs'",
        )
    given = storage.env.get(var) or env.get(var) or ""
    value = (
        f"{given}-{cpu_tag}"
        if storage.kind == "gha" and given
        else (f"{given.rstrip('/')}/{cpu_tag}" if given else cpu_tag)
    )
    return replace(
        storage,
        env={**storage.env, var: value},
        description=f"{storage.description} (namespace {cpu_tag})",
    )


#: GitHub's events whose jobs build someone's proposed change
_PR_EVENTS: Final = frozenset({"pull_request", "pull_request_target", "merge_group"})


def read_only_reason(env: Mapping[str, str], event: Mapping[str, object] | None = None) -> str | None:
    """Why this job must read the shared cache without writing to it (None: it writes).

    On GitHub Actions only the default branch writes: a pull-request job (``GITHUB_EVENT_NAME``)
    reads, and so does a push to another branch when the event (``GITHUB_EVENT_PATH``, given as
    ``event``) names the repository's default branch. Elsewhere (a developer, another CI) it writes."""
    if env.get("GITHUB_ACTIONS") != "true":
        return None
    name = env.get("GITHUB_EVENT_NAME", "")
    if name in _PR_EVENTS:
        return f"a {name} job reads the shared cache, only the default branch writes it"
    repo = event.get("repository") if isinstance(event, Mapping) else None
    default = repo.get("default_branch") if isinstance(repo, Mapping) else None
    ref = env.get("GITHUB_REF_NAME", "")
    if env.get("GITHUB_REF_TYPE", "branch") == "branch" and isinstance(default, str) and ref and ref != default:
        return f"branch {ref} reads the shared cache, only {default} writes it"
    return None


def github_event(env: Mapping[str, str]) -> Mapping[str, object] | None:
    """The workflow event's payload (``GITHUB_EVENT_PATH``), or None (not on GitHub, unreadable)."""
    path = env.get("GITHUB_EVENT_PATH")
    if env.get("GITHUB_ACTIONS") != "true" or not path:
        return None
    try:
        with Path(path).open(encoding="utf-8") as fh:
            data = json.loads(fh.read(4 * 1024 * 1024))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_only(storage: CacheStorage, reason: str | None) -> CacheStorage:
    """``storage`` read without being written, where sccache can (its ``*_RW_MODE``)."""
    if reason is None or not storage.remote:
        return storage
    var = _READ_ONLY_VARS.get(storage.kind)
    if var is None:
        return replace(storage, unusable=f"{reason}, and {storage.kind} cannot be made read-only")
    return replace(storage, env={**storage.env, var: "READ_ONLY"}, description=f"{storage.description} (read-only)")


__all__ = [
    "github_event",
    "host_cpu_tag",
    "native_cpu_tag",
    "native_namespace",
    "read_only",
    "read_only_reason",
]
