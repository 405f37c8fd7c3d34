"""Fetching a source archive into the download cache, its sha256 checked before it is used.

:func:`fetch_verified` is the entry: a cached archive is reused while its digest
matches; a download goes to a scratch folder of this run, is checked, then renamed
into the content-addressed cache.  Anything that does not match is moved to
``<cache>/quarantine`` (a folder only its owner can enter, each file mode 0600: what a wrong
URL fetched may be private), never deleted.  A ``file:`` archive is read only from inside the
project or the cache.  Fetchers (``file:``, ``https://``,
``pypi-sdist:``) are plain functions of :data:`Fetcher`'s shape.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import filelock

from skippy.core import pip, proc
from skippy.core.errors import ArchiveError, CommandError, LockBusyError, NetworkError, SkippyError
from skippy.core.files import sha256_of
from skippy.core.settings import Settings
from skippy.core.ui import Console, human_size
from skippy.queue.archive_specs import UrlKind, file_url_path, file_url_problem, pypi_requirement, url_kind
from skippy.queue.scratch import owned_scratch, report_swept, sweep_stale

#: seconds a single HTTP request may stall before it counts as a failed attempt
HTTP_TIMEOUT: Final = 60.0
#: seconds a whole ``pip download`` may take
PIP_TIMEOUT: Final = 1800.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FetchContext:
    """What a fetcher may use; built once at the entry, passed down."""

    root: Path
    env: Mapping[str, str] = field(repr=False)
    console: Console = field(repr=False)
    attempts: int = 3
    backoff: float = 2.0
    python: str = sys.executable
    http_timeout: float = HTTP_TIMEOUT
    on_ci: bool = False
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    #: besides ``root``, the one place a ``file:`` archive may be read from (the settings' cache dir)
    cache: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings, console: Console, *, python: str | None = None) -> FetchContext:
        return cls(
            root=settings.root,
            env=settings.env,
            console=console,
            attempts=settings.network_attempts,
            backoff=settings.network_backoff,
            python=python or sys.executable,
            on_ci=settings.on_ci,
            cache=settings.cache_dir,
        )


#: fetch ``url`` into the (empty) directory given; return the downloaded file
Fetcher = Callable[[str, Path, FetchContext], Path]


def fetch(url: str, into: Path, ctx: FetchContext) -> Path:
    """The default fetcher: dispatch on the URL kind."""
    kind = url_kind(url)
    if kind is UrlKind.FILE:
        return fetch_file(url, into, ctx)
    if kind is UrlKind.HTTPS:
        return fetch_http(url, into, ctx)
    return fetch_pypi_sdist(pypi_requirement(url), into, ctx)


def fetch_file(url: str, into: Path, ctx: FetchContext) -> Path:
    """Copy a ``file:`` archive (inside the project or the cache, links followed) into ``into``,
    mode 0600 until its digest is checked."""
    source = file_url_path(url, ctx.root)
    outside = file_url_problem(url, ctx.root, ctx.cache)
    if outside is not None:
        raise ArchiveError(
            f"archive {url} refused: {outside}; a file: archive is read only from inside them",
            untouched="everything: nothing was copied",
            next_step="copy the archive into the project and point the url in pyproject.toml "
            "[tool.skippy.archives] at it, then run it again",
        )
    if not source.is_file():
        raise ArchiveError(
            f"archive {url} not found ({source} is not a file)",
            untouched="the repository and the download cache",
            next_step="fix the url in pyproject.toml [tool.skippy.archives] or restore the file",
        )
    real = Path(os.path.realpath(source))
    target = into / source.name
    src_fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(src_fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise ArchiveError(
                f"archive {url} is not a regular file once opened (it was replaced meanwhile)",
                untouched="everything: nothing was copied",
                next_step="run it again",
            )
        out_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with (
            ctx.console.progress(source.name, os.fstat(src.fileno()).st_size, verb="copying") as progress,
            os.fdopen(out_fd, "wb") as out,
        ):
            while chunk := src.read(_CHUNK):
                out.write(chunk)
                progress.advance(len(chunk))
    return target


def _proxies(env: Mapping[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for scheme in ("http", "https"):
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            found[scheme] = value
    return found


def fetch_http(url: str, into: Path, ctx: FetchContext) -> Path:
    """GET ``url`` with a timeout, retrying transient failures with exponential backoff."""
    name = posixpath.basename(urllib.parse.urlsplit(url).path) or "archive"
    target = into / name
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(_proxies(ctx.env)))
    last: str = ""
    for attempt in range(1, ctx.attempts + 1):
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "skippy"})  # noqa: S310 (scheme checked by url_kind)
            with opener.open(request, timeout=ctx.http_timeout) as response, target.open("wb") as out:
                length = response.headers.get("Content-Length")
                with ctx.console.progress(name, int(length) if length else None) as progress:
                    while chunk := response.read(_CHUNK):
                        out.write(chunk)
                        progress.advance(len(chunk))
            return target
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code} {exc.reason}"
            if exc.code < 500 and exc.code not in (408, 429):
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if attempt < ctx.attempts:
            delay = ctx.backoff * 2 ** (attempt - 1)
            ctx.console.warn(f"fetching {url} failed ({last}); retry {attempt}/{ctx.attempts - 1} in {delay:g} s")
            ctx.sleep(delay)
    target.unlink(missing_ok=True)
    raise NetworkError(
        f"could not fetch {url}: {last}",
        untouched="the repository and the download cache",
        next_step="check the network or the url in pyproject.toml [tool.skippy.archives], then run it again",
    )


def pip_download_argv(python: str, requirement: str, into: Path, *, attempts: int) -> list[str]:
    """The ``pip download`` command line for one source distribution (pure)."""
    # the source distribution of this package only: with :all: pip would also build the
    # sdist's build dependencies (CMake included) from source just to read its metadata
    package = re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0]
    return pip.pip_download_argv(python, into, attempts=attempts, options=("--no-binary", package), what=(requirement,))


def fetch_pypi_sdist(requirement: str, into: Path, ctx: FetchContext) -> Path:
    """``pip download`` of one source distribution into ``into/sdist``; pip's temporary files
    (its download under way, shown as progress) go to ``into/pip-tmp``."""
    ctx.console.info(f"fetching sdist {requirement}")
    started = time.monotonic()
    tmpdir = into / "pip-tmp"
    into = into / "sdist"
    into.mkdir()
    try:
        with pip.pip_output(ctx.console, tmpdir) as output:
            proc.run(
                pip_download_argv(ctx.python, requirement, into, attempts=ctx.attempts),
                env=pip.pip_env(ctx.env, tmpdir),
                timeout=PIP_TIMEOUT,
                on_line=output,
                what=f"pip download {requirement}",
            )
    except CommandError as exc:
        raise NetworkError(
            f"could not fetch the source distribution {requirement}",
            untouched="the repository and the download cache",
            next_step="check the package index is reachable and the version exists, then run it again",
            details=exc.details,
        ) from exc
    files = sorted(p for p in into.iterdir() if p.is_file())
    if len(files) != 1:
        raise ArchiveError(
            f"pip download {requirement} left {len(files)} files, expected one source archive",
            untouched="the repository and the download cache",
            next_step="check the requirement names one package pinned with ==",
            details="\n".join(p.name for p in files) or None,
        )
    size = files[0].stat().st_size
    ctx.console.info(f"fetched {files[0].name} ({human_size(size)}) in {time.monotonic() - started:.1f} s")
    return files[0]


def cache_path(cache: Path, sha256: str) -> Path:
    """Where a verified archive lives in the download cache (content-addressed)."""
    return cache / f"{sha256}.archive"


def fetch_verified(
    url: str,
    sha256: str,
    cache: Path,
    ctx: FetchContext,
    *,
    fetcher: Fetcher = fetch,
    lock_timeout: float = 900.0,
) -> Path:
    """The cached archive for ``sha256``, fetched from ``url`` if not cached yet.

    A cached file is reused only while its digest still matches (one that no
    longer does is moved to ``<cache>/quarantine``, never deleted).  A download
    goes to a scratch folder of this run (:func:`owned_scratch`), is checked,
    then renamed into place; a mismatching download is moved to
    ``<cache>/quarantine`` and reported.
    """
    cache.mkdir(parents=True, exist_ok=True)
    final = cache_path(cache, sha256)
    try:
        with filelock.FileLock(str(cache / f"{sha256}.lock"), timeout=lock_timeout):
            report_swept(sweep_stale(cache, ".fetch-"), cache, ctx.console)
            moved: Path | None = None
            if final.is_file():
                actual = sha256_of(final)
                if actual == sha256:
                    ctx.console.detail(f"cached archive {final.name}")
                    return final
                moved = _quarantine(final, cache, f"{actual}-{final.name}")
                ctx.console.warn(
                    f"cached archive {final.name} no longer matches its digest: moved to {moved}; fetching it again"
                )
            try:
                downloaded = _fetch_into_cache(url, sha256, cache, ctx, fetcher=fetcher)
            except SkippyError as exc:
                if moved is None:
                    raise
                raise exc.restated(
                    untouched=f"the repository; the cached copy of this archive no longer matched its digest and was "
                    f"moved (not deleted) to {moved} before the fetch; nothing else in the download cache changed"
                ) from exc
            return downloaded
    except filelock.Timeout as exc:
        raise LockBusyError(
            f"another process is fetching the archive {sha256[:12]} (lock {exc.lock_file})",
            untouched="everything",
            next_step="wait for it to finish, then run the command again",
        ) from exc


def _quarantine(path: Path, cache: Path, name: str) -> Path:
    """Move ``path`` to ``<cache>/quarantine/<name>``: the folder mode 0700 and the file 0600,
    since what a wrong URL fetched may be private (``file:///etc/shadow``)."""
    quarantine = cache / "quarantine"
    quarantine.mkdir(mode=0o700, exist_ok=True)
    quarantine.chmod(0o700)  # one an older skippy made with the umask's mode
    path.chmod(0o600)
    kept = quarantine / name
    path.replace(kept)
    return kept


def _fetch_into_cache(url: str, sha256: str, cache: Path, ctx: FetchContext, *, fetcher: Fetcher) -> Path:
    """Download into a scratch folder of this run, check the digest, rename into the cache."""
    final = cache_path(cache, sha256)
    with owned_scratch(cache, ".fetch-", console=ctx.console) as tmp:
        downloaded = fetcher(url, tmp, ctx)
        actual = sha256_of(downloaded)
        if actual != sha256:
            kept = _quarantine(downloaded, cache, f"{actual}-{downloaded.name}")
            raise ArchiveError(
                f"archive {url} does not match its sha256",
                untouched="the repository (nothing was unpacked or committed)",
                next_step=(
                    "if the new archive is trusted, update sha256 in pyproject.toml "
                    "[tool.skippy.archives]; otherwise fix the url"
                ),
                details=f"expected {sha256}\nactual   {actual}\nthe download was moved to {kept}",
            )
        downloaded.replace(final)
    return final
