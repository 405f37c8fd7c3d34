"""A real llama.cpp test-bed: a local bare git "upstream" built from the
llama.cpp trees that llama-cpp-python's source distributions vendor.

Three linear commits on ``master`` (oldest first), one per sdist, each tagged
``llama-cpp-python-v<version>``.  Commits have a fixed identity and fixed
dates, so their SHAs are the same on every machine.  Each message names the
real upstream commit it stands for: from the table below, cross-checked
against (or, where the table has none, read from) the submodule ``HEAD`` that
the sdist ships in its own ``.git/modules``.

The build is cached under a directory keyed by the archive digests and made
atomically (built in a temporary directory, then renamed), so an interrupted
build is never mistaken for a good one.  Downloads go through
:mod:`skippy.queue.archives` (digest checked before unpacking, safe unpack).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import filelock

from skippy.core.errors import ArchiveError, LockBusyError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.clean import TESTBED_MANIFEST
from skippy.queue import archive_fetch, archive_unpack, archives

SCHEMA: Final = "skippy-testbed-v1"
#: the manifest in the bare repository: its commits, and the sdists it was made from (``invoke clean``
#: keeps the source archives a test-bed under the cache dir names in it)
MANIFEST: Final = TESTBED_MANIFEST
BRANCH: Final = "master"
#: first commit date (2024-01-01T00:00:00Z); each later commit one day on
BASE_DATE: Final = 1704067200
DAY: Final = 86400
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class SdistSource:
    """One llama-cpp-python sdist and the llama.cpp tree it vendors."""

    version: str
    sha256: str
    #: the upstream commit it vendors, when known in advance
    upstream_sha: str | None = None
    package: str = "llama-cpp-python"

    @property
    def url(self) -> str:
        return f"pypi-sdist:{self.package}=={self.version}"

    @property
    def top(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}"

    @property
    def folder(self) -> str:
        return f"{self.top}/vendor/llama.cpp"

    @property
    def head_member(self) -> str:
        """The submodule HEAD the sdist ships (names the vendored upstream commit)."""
        return f"{self.top}/.git/modules/vendor/llama.cpp/HEAD"

    @property
    def tag(self) -> str:
        return tag_for(self.version)


def tag_for(version: str) -> str:
    return f"llama-cpp-python-v{version}"


#: the sdists of the test-bed, oldest first (digests as published)
LLAMA_CPP_PYTHON: Final[tuple[SdistSource, ...]] = (
    SdistSource(
        "0.3.34",
        "d849d286d808284f1d3ec1bd6875572430d29d1f9574a010232caa4e9cef0e35",
        "e3546c7948e3af463d0b401e6421d5a4c2faf565",
    ),
    SdistSource(
        "0.3.35",
        "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12",
        "4df29be4f4c3673f428170fda944a5b19f743bb8",
    ),
    # a later upstream commit; read from the sdist's own submodule HEAD
    SdistSource("0.3.36", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"),
)


@dataclass(frozen=True)
class LlamaTestbed:
    """A built test-bed: a bare repo usable as an upstream URL."""

    __test__ = False  # not a pytest test class

    path: Path
    #: version -> commit SHA in the bare repo, oldest first
    commits: Mapping[str, str]
    #: version -> the real upstream commit it stands for (None where unknown)
    upstream: Mapping[str, str | None]
    branch: str = BRANCH
    key: str = field(default="", compare=False)

    @property
    def url(self) -> str:
        return self.path.as_uri()

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(self.commits)

    def tag(self, version: str) -> str:
        return tag_for(version)


def cache_key(sources: Sequence[SdistSource]) -> str:
    """Cache key: the schema and, in order, each version, digest and folder."""
    text = "\n".join([SCHEMA, *(f"{s.version} {s.sha256} {s.folder} {s.upstream_sha}" for s in sources)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def commit_message(source: SdistSource, upstream_sha: str | None) -> str:
    lines = [f"llama.cpp as vendored by {source.package} {source.version}", ""]
    if upstream_sha:
        lines.append(f"{archives.TRAILER_UPSTREAM}: {upstream_sha}")
    lines += [
        f"{archives.TRAILER_DIGEST}: {source.sha256}",
        f"{archives.TRAILER_FOLDER}: {source.folder}",
        f"Archive-URL: {source.url}",
    ]
    return "\n".join(lines) + "\n"


def build_testbed(
    cache_dir: Path,
    ctx: archive_fetch.FetchContext,
    *,
    archive_cache: Path | None = None,
    sources: Sequence[SdistSource] = LLAMA_CPP_PYTHON,
    fetcher: archive_fetch.Fetcher = archive_fetch.fetch,
    lock_timeout: float = 1800.0,
) -> LlamaTestbed:
    """The test-bed for ``sources``, built once under ``cache_dir`` and reused."""
    if not sources:
        raise ValueError("a test-bed needs at least one source")
    cache_dir.mkdir(parents=True, exist_ok=True)
    downloads = archive_cache or cache_dir / "archives"
    key = cache_key(sources)
    final = cache_dir / f"upstream-{key}.git"
    try:
        with filelock.FileLock(str(cache_dir / f"upstream-{key}.lock"), timeout=lock_timeout):
            found = _load(final, ctx)
            if found is not None:
                ctx.console.detail(f"test-bed {final} reused")
                return found
            if final.exists():
                ctx.console.warn(f"discarding the incomplete test-bed {final}")
                shutil.rmtree(final)
            with tempfile.TemporaryDirectory(prefix=".build-", dir=cache_dir) as tmp:
                built = _build(
                    Path(tmp), ctx, downloads=downloads, sources=sources, fetcher=fetcher, lock_timeout=lock_timeout
                )
                built.rename(final)
    except filelock.Timeout as exc:
        raise LockBusyError(
            f"another process is building the test-bed (lock {exc.lock_file})",
            untouched="everything",
            next_step="wait for it to finish, then run the tests again",
        ) from exc
    loaded = _load(final, ctx)
    assert loaded is not None, "a freshly built test-bed has a manifest"
    return loaded


def _build(
    tmp: Path,
    ctx: archive_fetch.FetchContext,
    *,
    downloads: Path,
    sources: Sequence[SdistSource],
    fetcher: archive_fetch.Fetcher,
    lock_timeout: float,
) -> Path:
    bare = tmp / "upstream.git"
    Repo(tmp, env=ctx.env).git("init", "--quiet", "--bare", bare)
    repo = Repo(bare, env=ctx.env)
    commits: dict[str, str] = {}
    upstream: dict[str, str | None] = {}
    parent: str | None = None
    for index, source in enumerate(sources):
        with ctx.console.step(f"test-bed: {source.package} {source.version}"):
            archive = archive_fetch.fetch_verified(
                source.url, source.sha256, downloads, ctx, fetcher=fetcher, lock_timeout=lock_timeout
            )
            upstream_sha = _vendored_commit(archive, source)
            with tempfile.TemporaryDirectory(prefix="unpack-", dir=tmp) as work:
                tree = archive_unpack.safe_unpack(archive, Path(work) / "tree", source.folder)
                sha = archives.commit_folder(
                    repo,
                    tree,
                    commit_message(source, upstream_sha),
                    parents=[parent] if parent else [],
                    date=f"{BASE_DATE + index * DAY} +0000",
                    scratch=Path(work) / "scratch",
                )
            repo.git("update-ref", f"refs/tags/{source.tag}", sha)
            commits[source.version] = sha
            upstream[source.version] = upstream_sha
            parent = sha
    assert parent is not None
    repo.git("update-ref", f"refs/heads/{BRANCH}", parent)
    repo.git("symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
    write_manifest(bare, sources, commits, upstream)
    return bare


def write_manifest(
    bare: Path, sources: Sequence[SdistSource], commits: Mapping[str, str], upstream: Mapping[str, str | None]
) -> None:
    """The manifest of the test-bed in ``bare``: each version's commit, the upstream commit it stands
    for and the sha256 of the sdist it was made from."""
    manifest = {
        "schema": SCHEMA,
        "key": cache_key(sources),
        "branch": BRANCH,
        "versions": [
            {"version": v, "commit": commits[v], "upstream": upstream[v], "sha256": s.sha256}
            for v, s in zip(commits, sources, strict=True)
        ],
    }
    (bare / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _vendored_commit(archive: Path, source: SdistSource) -> str | None:
    recorded = archive_unpack.read_member_text(archive, source.head_member)
    value = recorded.strip() if recorded else None
    if value is not None and not _SHA1.match(value):
        value = None  # a symbolic HEAD names no commit
    if source.upstream_sha and value and value != source.upstream_sha:
        raise ArchiveError(
            f"{source.package} {source.version} vendors upstream {value}, not {source.upstream_sha}",
            untouched="the cached test-bed (nothing was renamed into place)",
            next_step="fix the upstream commit of this version in tooling/testbed.py",
        )
    return source.upstream_sha or value


def _load(path: Path, ctx: archive_fetch.FetchContext) -> LlamaTestbed | None:
    """The test-bed at ``path`` if its manifest is there and every commit exists."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        entries = data["versions"]
        commits = {str(e["version"]): str(e["commit"]) for e in entries}
        upstream = {str(e["version"]): (str(e["upstream"]) if e["upstream"] else None) for e in entries}
    except (ValueError, KeyError, TypeError):
        return None
    if data.get("schema") != SCHEMA:
        return None
    repo = Repo(path, env=ctx.env)
    if not all(repo.has_commit(sha) for sha in commits.values()):
        return None
    return LlamaTestbed(path=path, commits=commits, upstream=upstream, key=str(data.get("key", "")))


def project_testbed(settings: Settings, console: Console, *, python: str | None = None) -> LlamaTestbed:
    """The project's test-bed: built under ``<cache_dir>/testbed``, downloads shared with archive imports."""
    ctx = archive_fetch.FetchContext.from_settings(settings, console, python=python)
    return build_testbed(
        settings.cache_dir / "testbed",
        ctx,
        archive_cache=settings.cache_dir / "archives",
        lock_timeout=settings.lock_timeout * 2,
    )


#: the first name of :func:`project_testbed` (the bench uses it); not collected by pytest
testbed_for = project_testbed
testbed_for.__test__ = False  # type: ignore[attr-defined]
