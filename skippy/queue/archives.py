"""Upstream sources from verified archives.

``[tool.skippy.archives."<upstream sha>"]`` in pyproject.toml maps an upstream
commit to a source archive that vendors the same tree::

    [tool.skippy.archives."4df29be4f4c3673f428170fda944a5b19f743bb8"]
    url = "pypi-sdist:llama-cpp-python==0.3.35"   # or https://..., or file:...
    sha256 = "1139dbb5..."
    folder = "llama_cpp_python-0.3.35/vendor/llama.cpp"

:func:`import_archive` fetches the archive into a download cache, checks its
sha256 *before* unpacking anything, unpacks it safely into a temporary
directory and turns the named folder into a parentless local commit whose tree
is exactly that folder's content.  The commit has a fixed identity and date,
so the same archive gives the same commit SHA on every machine; it is recorded
under ``refs/skippy/archive/<upstream sha>``.  The repository's work tree and
index are never touched.

The pieces are usable on their own (the test-bed builds on them):
:func:`fetch_verified` (download + digest check + cache),
:func:`plan_unpack` (pure member checks) and :func:`safe_unpack`, and
:func:`commit_folder` (tree of a directory -> commit, deterministically).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import hashlib
import os
import posixpath
import re
import shutil
import stat
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

import filelock

from skippy.core import proc
from skippy.core.errors import ArchiveError, CommandError, LockBusyError, NetworkError, SettingsError, SkippyError
from skippy.core.git import IDENTITY_EMAIL, Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console

#: refs under which imported archive commits are recorded
REF_PREFIX: Final = "refs/skippy/archive/"
#: identity and date of every import commit: the same archive gives the same SHA everywhere
IMPORT_NAME: Final = "skippy archive import"
IMPORT_EMAIL: Final = IDENTITY_EMAIL
#: 2000-01-01T00:00:00Z, in git's raw date format
IMPORT_DATE: Final = "946684800 +0000"
#: seconds a single HTTP request may stall before it counts as a failed attempt
HTTP_TIMEOUT: Final = 60.0
#: seconds a whole ``pip download`` may take
PIP_TIMEOUT: Final = 1800.0

TRAILER_UPSTREAM: Final = "Upstream-Commit"
TRAILER_DIGEST: Final = "Archive-SHA256"
TRAILER_FOLDER: Final = "Archive-Folder"

_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# a PEP 508 name (letters, digits, . _ -) pinned with == to one version
_PYPI_REQ = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9.+!_-]+)$")
_SPEC_KEYS = frozenset({"url", "sha256", "folder"})
_PYPI_SCHEME = "pypi-sdist:"
_CHUNK = 1 << 20

#: config that decides how `git add` turns files into blobs, forced over the repo's own
_TREE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fileMode", "true"),
    ("core.symlinks", "true"),
    ("core.ignoreCase", "false"),
    ("core.precomposeUnicode", "false"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.hooksPath", os.devnull),
    ("gc.auto", "0"),
)
#: in-tree .gitattributes must not rewrite archive bytes (eol, ident, filters, encodings)
_NO_CONVERSION_ATTRIBUTES = "* -text -eol -crlf -ident -filter -working-tree-encoding\n"


# --------------------------------------------------------------------------- specs


class UrlKind(enum.Enum):
    FILE = "file"
    HTTPS = "https"
    PYPI_SDIST = "pypi-sdist"


@dataclass(frozen=True)
class ArchiveSpec:
    upstream_sha: str
    url: str
    sha256: str
    folder: str

    @property
    def kind(self) -> UrlKind:
        return url_kind(self.url)


def url_kind(url: str) -> UrlKind:
    if url.startswith(_PYPI_SCHEME):
        return UrlKind.PYPI_SDIST
    if url.startswith("https://"):
        return UrlKind.HTTPS
    if url.startswith("file:"):
        return UrlKind.FILE
    raise ValueError(f"unsupported archive URL {url!r}")


def pypi_requirement(url: str) -> str:
    """``pypi-sdist:NAME==VERSION`` -> ``NAME==VERSION``."""
    return url.removeprefix(_PYPI_SCHEME).strip()


def file_url_path(url: str, root: Path) -> Path:
    """``file:///abs/path`` or ``file:relative/path`` (relative to the project root)."""
    rest = url.removeprefix("file:")
    if rest.startswith("//"):
        rest = rest[2:]
        host, sep, path = rest.partition("/")
        if host not in ("", "localhost"):
            raise ValueError(f"file URL with a remote host: {url!r}")
        rest = "/" + path if sep else "/"
    local = Path(urllib.request.url2pathname(rest))
    return local if local.is_absolute() else root / local


def spec_key(upstream_sha: str, field_name: str | None = None) -> str:
    base = f'[tool.skippy.archives."{upstream_sha}"]'
    return f"{base} {field_name}" if field_name else base


def parse_archive_specs(table: object) -> dict[str, ArchiveSpec]:
    """Validate the ``[tool.skippy.archives]`` table (pure; no file is read)."""
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise SettingsError(
            f"pyproject.toml [tool.skippy.archives] must be a table, got {type(table).__name__}",
            untouched="everything",
            next_step='write [tool.skippy.archives."<40-hex upstream sha>"] tables',
        )
    specs: dict[str, ArchiveSpec] = {}
    for key, value in table.items():
        specs[str(key)] = _parse_one(str(key), value)
    return specs


def _bad(key: str, problem: str, fix: str) -> SettingsError:
    return SettingsError(
        f"pyproject.toml {key}: {problem}",
        untouched="everything: nothing was fetched or written",
        next_step=fix,
    )


def _parse_one(sha: str, value: object) -> ArchiveSpec:
    if not _SHA1.match(sha):
        raise _bad(
            spec_key(sha),
            "the key must be a full 40-hex lowercase upstream commit SHA",
            "use the full SHA, e.g. the content of skippy/llama_cpp/upstream.txt",
        )
    if not isinstance(value, Mapping):
        raise _bad(spec_key(sha), "must be a table with url, sha256 and folder", "add url, sha256, folder")
    unknown = sorted(set(map(str, value)) - _SPEC_KEYS)
    if unknown:
        raise _bad(
            spec_key(sha, unknown[0]),
            f"unknown key(s) {', '.join(unknown)}",
            "known keys: folder, sha256, url",
        )
    missing = sorted(_SPEC_KEYS - set(map(str, value)))
    if missing:
        raise _bad(spec_key(sha, missing[0]), f"missing {', '.join(missing)}", "add url, sha256 and folder")
    url, digest, folder = value["url"], value["sha256"], value["folder"]
    for name, item in (("url", url), ("sha256", digest), ("folder", folder)):
        if not isinstance(item, str) or not item.strip():
            raise _bad(spec_key(sha, name), f"must be a non-empty string, got {item!r}", f"set {name}")
    assert isinstance(url, str) and isinstance(digest, str) and isinstance(folder, str)
    try:
        kind = url_kind(url)
    except ValueError:
        raise _bad(
            spec_key(sha, "url"),
            f"unsupported URL {url!r}",
            'use "https://...", "file:path" or "pypi-sdist:NAME==VERSION"',
        ) from None
    if kind is UrlKind.PYPI_SDIST and not _PYPI_REQ.match(pypi_requirement(url)):
        raise _bad(
            spec_key(sha, "url"),
            f"{url!r} must pin one version as pypi-sdist:NAME==VERSION",
            'e.g. url = "pypi-sdist:llama-cpp-python==0.3.35"',
        )
    if kind is UrlKind.FILE:
        try:
            file_url_path(url, Path())
        except ValueError as exc:
            raise _bad(spec_key(sha, "url"), str(exc), "use file:///absolute/path or file:relative/path") from None
    if not _SHA256.match(digest):
        raise _bad(
            spec_key(sha, "sha256"),
            f"must be 64 lowercase hex digits, got {digest!r}",
            "compute it with `sha256sum <archive>`",
        )
    clean = folder.strip().strip("/")
    parts = clean.split("/")
    if folder.startswith("/") or ".." in parts or "\\" in folder or any(p == "" for p in parts):
        raise _bad(
            spec_key(sha, "folder"),
            f"{folder!r} must be a relative path inside the archive without '..' or '//'",
            'e.g. folder = "llama_cpp_python-0.3.35/vendor/llama.cpp" (or "." for the whole archive)',
        )
    return ArchiveSpec(upstream_sha=sha, url=url, sha256=digest, folder=clean or ".")


def load_archive_specs(settings: Settings) -> Mapping[str, ArchiveSpec]:
    """The validated ``[tool.skippy.archives]`` mapping, keyed by upstream SHA."""
    return parse_archive_specs(settings.raw.get("archives"))


# --------------------------------------------------------------------------- fetching


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
    source = file_url_path(url, ctx.root)
    if not source.is_file():
        raise ArchiveError(
            f"archive {url} not found ({source} is not a file)",
            untouched="the repository and the download cache",
            next_step="fix the url in pyproject.toml [tool.skippy.archives] or restore the file",
        )
    target = into / source.name
    ctx.console.info(f"copying {source.name} ({_size(source.stat().st_size)})")
    shutil.copyfile(source, target)
    return target


class Progress:
    """Bytes and rate: one line updated in place on a terminal, one line per step elsewhere."""

    def __init__(self, console: Console, label: str, total: int | None, *, live: bool) -> None:
        self.console = console
        self.label = label
        self.total = total
        self.live = live
        self.done_bytes = 0
        self.started = time.monotonic()
        self._shown = 0.0
        if not live:
            console.info(f"fetching {label}" + (f" ({_size(total)})" if total else ""))

    def update(self, nbytes: int) -> None:
        self.done_bytes += nbytes
        now = time.monotonic()
        if self.live and not self.console.quiet and now - self._shown >= 0.2:
            self._shown = now
            self.console.stream.write("\r" + self._line(now) + "\x1b[K")
            self.console.stream.flush()

    def finish(self) -> None:
        line = self._line(time.monotonic())
        if self.live and not self.console.quiet:
            self.console.stream.write("\r" + line + "\x1b[K\n")
            self.console.stream.flush()
        else:
            self.console.info(line)

    def _line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-6)
        of = f" / {_size(self.total)}" if self.total else ""
        return f"{self.label}: {_size(self.done_bytes)}{of} in {elapsed:.1f} s ({_size(self.done_bytes / elapsed)}/s)"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


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
    live = _is_terminal(ctx.console.stream) and not ctx.on_ci
    last: str = ""
    for attempt in range(1, ctx.attempts + 1):
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "skippy"})  # noqa: S310 (scheme checked by url_kind)
            with opener.open(request, timeout=ctx.http_timeout) as response, target.open("wb") as out:
                length = response.headers.get("Content-Length")
                progress = Progress(ctx.console, name, int(length) if length else None, live=live)
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    progress.update(len(chunk))
                progress.finish()
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
    return [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        # the source distribution of this package only: with :all: pip would also build the
        # sdist's build dependencies (CMake included) from source just to read its metadata
        "--no-binary",
        re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0],
        "--disable-pip-version-check",
        "--no-input",
        "--retries",
        str(max(attempts - 1, 0)),
        "-d",
        str(into),
        requirement,
    ]


def fetch_pypi_sdist(requirement: str, into: Path, ctx: FetchContext) -> Path:
    ctx.console.info(f"fetching sdist {requirement}")
    started = time.monotonic()
    try:
        proc.run(
            pip_download_argv(ctx.python, requirement, into, attempts=ctx.attempts),
            env=ctx.env,
            timeout=PIP_TIMEOUT,
            on_line=ctx.console.detail if ctx.console.verbose else None,
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
    ctx.console.info(f"fetched {files[0].name} ({_size(size)}) in {time.monotonic() - started:.1f} s")
    return files[0]


def sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
            _report_swept(sweep_stale(cache, ".fetch-"), cache, ctx.console)
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
                if moved is not None:
                    exc.untouched = (
                        f"the repository; the cached copy of this archive no longer matched its digest and was "
                        f"moved (not deleted) to {moved} before the fetch; nothing else in the download cache changed"
                    )
                raise
            return downloaded
    except filelock.Timeout as exc:
        raise LockBusyError(
            f"another process is fetching the archive {sha256[:12]} (lock {exc.lock_file})",
            untouched="everything",
            next_step="wait for it to finish, then run the command again",
        ) from exc


def _quarantine(path: Path, cache: Path, name: str) -> Path:
    quarantine = cache / "quarantine"
    quarantine.mkdir(exist_ok=True)
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


# --------------------------------------------------------------------------- scratch folders

#: a scratch folder with no lock file beside it (left by a run older than the locks) is removed
#: once it is this old (seconds): no import runs that long
STALE_UNLOCKED_AGE: Final = 3600.0
LOCK_SUFFIX: Final = ".lock"


@contextlib.contextmanager
def owned_scratch(root: Path, prefix: str, *, console: Console | None = None) -> Iterator[Path]:
    """A new folder ``root/<prefix><random>`` for this run, removed afterwards.

    ``<folder>.lock`` beside it is held with ``flock`` while the folder exists; the kernel releases
    it when the process dies, even on SIGKILL.  Before creating its own, the run removes the folders
    (and locks) of ``prefix`` that dead runs left behind; a folder whose lock is held belongs to a
    live run and is never touched.
    """
    root.mkdir(parents=True, exist_ok=True)
    if console is not None:
        _report_swept(sweep_stale(root, prefix), root, console)
    else:
        sweep_stale(root, prefix)
    while True:
        path = root / f"{prefix}{uuid.uuid4().hex[:12]}"
        lock_path = path.with_name(path.name + LOCK_SUFFIX)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(fd, lock_path):
            break
        os.close(fd)  # a sweeper took the lock file between open and flock: take another name
    try:
        path.mkdir()
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
        os.close(fd)


def _report_swept(removed: list[Path], root: Path, console: Console) -> None:
    if removed:
        console.info(f"removed {len(removed)} scratch folder(s) that interrupted runs left in {root}")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def sweep_stale(root: Path, prefix: str, *, now: float | None = None) -> list[Path]:
    """Remove the scratch folders of ``prefix`` under ``root`` whose run is gone; the removed ones."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    now = time.time() if now is None else now
    for entry in sorted(root.iterdir()):
        name = entry.name
        if not name.startswith(prefix) or name.endswith(LOCK_SUFFIX):
            continue
        lock_path = entry.with_name(name + LOCK_SUFFIX)
        if lock_path.exists():
            continue  # handled below, under its lock
        with contextlib.suppress(FileNotFoundError):
            if now - entry.lstat().st_mtime > STALE_UNLOCKED_AGE:
                _remove(entry)
                removed.append(entry)
    for lock_path in sorted(root.glob(f"{prefix}*{LOCK_SUFFIX}")):
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue  # a live run holds it
                raise
            if not _same_file(fd, lock_path):
                continue
            folder = lock_path.with_name(lock_path.name[: -len(LOCK_SUFFIX)])
            if folder.exists() or folder.is_symlink():
                _remove(folder)
                removed.append(folder)
            lock_path.unlink()
        finally:
            os.close(fd)
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- unpacking


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    SPECIAL = "special"  # devices, fifos, sockets, anything else


@dataclass(frozen=True)
class Member:
    """One archive entry, independent of the archive format."""

    name: str
    kind: Kind
    link: str = ""
    executable: bool = False
    #: bytes the entry unpacks to (0 for everything but files)
    size: int = 0


@dataclass(frozen=True)
class UnpackPlan:
    selected: tuple[Member, ...]
    skipped_git: int
    top_level: tuple[str, ...]


def _normalise(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _inside(path: str, folder: str) -> bool:
    return folder in (".", path) or path.startswith(folder + "/")


def _escapes(path: str) -> bool:
    """A normalised relative path that leaves its base."""
    return path == ".." or path.startswith("../") or path.startswith("/")


#: what the selected folder of an archive may unpack to (a llama.cpp tree is ~0.1 GiB): a
#: guard against a decompression bomb, checked from the headers before anything is written
MAX_UNPACKED_BYTES: Final = 4 << 30


def plan_unpack(members: Sequence[Member], folder: str, *, max_bytes: int = MAX_UNPACKED_BYTES) -> UnpackPlan:
    """Check every member of an archive and pick those under ``folder`` (pure).

    Refused, for the whole archive: absolute names, ``..`` components, paths
    through a symlink member, duplicate non-directory entries, devices, fifos
    and other special files, symlinks and hardlinks that leave ``folder``
    (or the archive, for members outside ``folder``).  Entries named ``.git``
    are skipped: git can never record them.
    """
    refusals: list[str] = []
    symlinks: set[str] = set()
    seen: dict[str, Kind] = {}
    selected: list[Member] = []
    skipped_git = 0
    top: set[str] = set()
    for member in members:
        raw = member.name
        if not raw or "\x00" in raw:
            refusals.append(f"{raw!r}: empty or NUL in name")
            continue
        if raw.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", raw):
            refusals.append(f"{raw}: absolute path")
            continue
        name = _normalise(raw)
        if not name or name == ".":
            continue
        parts = name.split("/")
        if ".." in parts:
            refusals.append(f"{raw}: '..' in path")
            continue
        top.add(parts[0])
        through = next((p for p in ("/".join(parts[:i]) for i in range(1, len(parts))) if p in symlinks), None)
        if through is not None:
            refusals.append(f"{raw}: path goes through the symlink {through}")
            continue
        if name in seen and not (member.kind is Kind.DIR and seen[name] is Kind.DIR):
            refusals.append(f"{raw}: duplicate entry")
            continue
        seen[name] = member.kind
        base = folder if _inside(name, folder) else "."
        if member.kind is Kind.SPECIAL:
            refusals.append(f"{raw}: device, fifo or other special file")
            continue
        if member.kind is Kind.SYMLINK:
            symlinks.add(name)
            if not member.link or member.link.startswith("/") or "\x00" in member.link:
                refusals.append(f"{raw}: symlink to an absolute path {member.link!r}")
                continue
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.link))
            if _escapes(resolved) or not _inside(resolved, base):
                refusals.append(f"{raw}: symlink points outside {base!r} ({member.link})")
                continue
        if member.kind is Kind.HARDLINK:
            target = _normalise(member.link)
            if (
                not target
                or member.link.startswith("/")
                or ".." in target.split("/")
                or not _inside(target, base)
                or seen.get(target) is not Kind.FILE
            ):
                refusals.append(f"{raw}: hardlink to {member.link!r} outside {base!r} or not an earlier file")
                continue
        if ".git" in parts:
            skipped_git += 1
            continue
        if _inside(name, folder) and name != folder:
            selected.append(Member(name, member.kind, member.link, member.executable, member.size))
        elif name == folder and member.kind is not Kind.DIR:
            refusals.append(f"{raw}: the folder {folder!r} is not a directory in the archive")
    if refusals:
        shown = refusals[:20]
        more = len(refusals) - len(shown)
        raise ArchiveError(
            f"refusing to unpack the archive: {len(refusals)} unsafe member(s)",
            untouched="the repository (nothing was unpacked or committed)",
            next_step="check the archive's origin; do not import it",
            details="\n".join(shown) + (f"\n... and {more} more" if more else ""),
        )
    if not selected:
        listing = ", ".join(sorted(top)[:30]) or "(empty archive)"
        raise ArchiveError(
            f"folder {folder!r} not found in the archive",
            untouched="the repository (nothing was committed)",
            next_step="set folder in pyproject.toml [tool.skippy.archives] to one of the paths inside the archive",
            details=f"top-level entries: {listing}",
        )
    total = sum(m.size for m in selected if m.kind is Kind.FILE)
    if total > max_bytes:
        raise ArchiveError(
            f"refusing to unpack the archive: {folder!r} would unpack to {_size(total)}, "
            f"over the {_size(max_bytes)} limit",
            untouched="the repository (nothing was unpacked or committed)",
            next_step="check that folder names the llama.cpp tree and that the archive is the one intended",
        )
    return UnpackPlan(tuple(selected), skipped_git, tuple(sorted(top)))


def _tar_member(info: tarfile.TarInfo) -> Member:
    if info.isreg():
        kind = Kind.FILE
    elif info.isdir():
        kind = Kind.DIR
    elif info.issym():
        kind = Kind.SYMLINK
    elif info.islnk():
        kind = Kind.HARDLINK
    else:
        kind = Kind.SPECIAL
    return Member(info.name, kind, info.linkname, bool(info.mode & 0o111), info.size if kind is Kind.FILE else 0)


def _zip_member(info: zipfile.ZipInfo) -> Member:
    mode = info.external_attr >> 16
    if info.is_dir() or stat.S_ISDIR(mode):
        kind = Kind.DIR
    elif stat.S_ISLNK(mode):
        kind = Kind.SYMLINK
    elif mode == 0 or stat.S_ISREG(mode):
        kind = Kind.FILE
    else:
        kind = Kind.SPECIAL
    return Member(info.filename, kind, "", bool(mode & 0o111), info.file_size if kind is Kind.FILE else 0)


def archive_members(archive: Path) -> list[Member]:
    """Every entry of a tar (any compression) or zip archive, format-independent."""
    with _open(archive) as opened:
        if isinstance(opened, tarfile.TarFile):
            return [_tar_member(m) for m in opened.getmembers()]
        members = []
        for info in opened.infolist():
            member = _zip_member(info)
            if member.kind is Kind.SYMLINK:
                member = Member(member.name, member.kind, opened.read(info).decode("utf-8", "replace"))
            members.append(member)
        return members


@contextlib.contextmanager
def _open(archive: Path) -> Iterator[tarfile.TarFile | zipfile.ZipFile]:
    try:
        tar = tarfile.open(archive, "r:*")  # noqa: SIM115 (closed by the `with tar` below)
    except (tarfile.ReadError, EOFError, OSError):
        tar = None
    if tar is not None:
        with tar:
            yield tar
        return
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            yield zf
        return
    raise ArchiveError(
        f"{archive.name} is neither a tar nor a zip archive",
        untouched="the repository (nothing was unpacked)",
        next_step="check the url in pyproject.toml [tool.skippy.archives] points at a source archive",
    )


def read_member_text(archive: Path, name: str) -> str | None:
    """The text of one regular member (e.g. metadata beside the folder), or None."""
    with _open(archive) as opened:
        try:
            if isinstance(opened, tarfile.TarFile):
                info = opened.getmember(name)
                fh = opened.extractfile(info) if info.isreg() else None
                return fh.read().decode("utf-8", "replace") if fh is not None else None
            return opened.read(name).decode("utf-8", "replace")
        except KeyError:
            return None


def safe_unpack(archive: Path, dest: Path, folder: str) -> Path:
    """Unpack the members under ``folder`` into the empty directory ``dest``; return ``dest/folder``.

    Every member is checked first (:func:`plan_unpack`); tar extraction also
    runs through Python's ``data`` filter, and the result is scanned again so
    that no symlink chain resolves outside the folder.
    """
    plan = plan_unpack(archive_members(archive), folder)
    wanted = {m.name for m in plan.selected}
    root = dest.resolve()
    with _open(archive) as opened:
        if isinstance(opened, tarfile.TarFile):
            infos = [m for m in opened.getmembers() if _normalise(m.name) in wanted]
            try:
                opened.extractall(root, members=infos, filter="data")
            except tarfile.FilterError as exc:
                raise ArchiveError(
                    f"refusing to unpack the archive: {exc}",
                    untouched="the repository (nothing was committed)",
                    next_step="check the archive's origin; do not import it",
                ) from exc
        else:
            by_name = {_normalise(i.filename): i for i in opened.infolist()}
            for member in plan.selected:
                target = root / member.name
                if member.kind is Kind.DIR:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if member.kind is Kind.SYMLINK:
                    target.symlink_to(member.link)
                    continue
                with opened.open(by_name[member.name]) as src, target.open("xb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
                target.chmod(0o755 if member.executable else 0o644)
    top = root / folder if folder != "." else root
    if not top.is_dir():
        raise ArchiveError(
            f"folder {folder!r} is not a directory in the archive",
            untouched="the repository (nothing was committed)",
            next_step="set folder in pyproject.toml [tool.skippy.archives] to a directory inside the archive",
            details="top-level entries: " + ", ".join(plan.top_level),
        )
    _rescan(top)
    return top


def _rescan(top: Path) -> None:
    real_top = os.path.realpath(top)
    bad: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                real = os.path.realpath(path)
                if real != real_top and not real.startswith(real_top + os.sep):
                    bad.append(f"{path.relative_to(top)}: symlink resolves outside the folder")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                bad.append(f"{path.relative_to(top)}: special file")
    if bad:
        raise ArchiveError(
            "refusing to import the archive: unsafe entries after unpacking",
            untouched="the repository (nothing was committed)",
            next_step="check the archive's origin; do not import it",
            details="\n".join(bad[:20]),
        )


# --------------------------------------------------------------------------- committing


def _config_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def commit_env(name: str = IMPORT_NAME, email: str = IMPORT_EMAIL, date: str = IMPORT_DATE) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }


def _absolute(repo: Repo, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (repo.path / path).resolve()


def commit_folder(
    repo: Repo,
    folder: Path,
    message: str,
    *,
    parents: Sequence[str] = (),
    date: str = IMPORT_DATE,
    scratch: Path,
) -> str:
    """A commit in ``repo`` whose tree is exactly ``folder``'s content; its SHA.

    Runs ``git add -A --force`` with a temporary index, ``folder`` as the work
    tree and a scratch git dir that shares ``repo``'s object store, so neither
    the repository's work tree, its index nor its config (filters, attributes)
    take part; in-tree ``.gitattributes`` are overridden so the bytes are
    committed as they are.  Identity and date are fixed: the same folder,
    message, parents and date give the same SHA on every machine.
    """
    objects = _absolute(repo, repo.out("rev-parse", "--git-path", "objects"))
    fmt = repo.git("rev-parse", "--show-object-format", check=False).stdout.strip() or "sha1"
    gitdir = scratch / "git"
    (gitdir / "info").mkdir(parents=True)
    (gitdir / "refs").mkdir()
    (gitdir / "HEAD").write_text("ref: refs/heads/master\n", encoding="ascii")
    (gitdir / "config").write_text(
        f"[core]\n\trepositoryformatversion = 1\n\tbare = false\n[extensions]\n\tobjectformat = {fmt}\n",
        encoding="ascii",
    )
    (gitdir / "info" / "attributes").write_text(_NO_CONVERSION_ATTRIBUTES, encoding="ascii")
    env = {
        "GIT_DIR": str(gitdir),
        "GIT_WORK_TREE": str(folder),
        "GIT_INDEX_FILE": str(scratch / "index"),
        "GIT_OBJECT_DIRECTORY": str(objects),
        **_config_env(_TREE_CONFIG),
        **commit_env(date=date),
    }
    repo.git("-C", folder, "add", "-A", "--force", "--", ".", env=env, what="git add (archive tree)")
    tree = repo.git("write-tree", env=env, what="git write-tree (archive tree)").stdout.strip()
    argv: list[str] = ["commit-tree", tree]
    for parent in parents:
        argv += ["-p", parent]
    argv += ["-F", "-"]
    return repo.git(*argv, env=env, input=message, what="git commit-tree (archive import)").stdout.strip()


def import_message(spec: ArchiveSpec) -> str:
    """The message of an import commit: a subject and the trailers that identify it."""
    return (
        f"Import upstream {spec.upstream_sha[:12]} from a verified archive\n"
        "\n"
        f"{TRAILER_UPSTREAM}: {spec.upstream_sha}\n"
        f"{TRAILER_DIGEST}: {spec.sha256}\n"
        f"{TRAILER_FOLDER}: {spec.folder}\n"
    )


def parse_trailers(message: str) -> dict[str, str]:
    """``Key: value`` lines of a commit message's last paragraph."""
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return {}
    found: dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        key, sep, value = line.partition(": ")
        if sep and re.match(r"^[A-Za-z0-9-]+$", key):
            found[key] = value.strip()
    return found


def archive_ref(upstream_sha: str) -> str:
    return REF_PREFIX + upstream_sha


def _recorded(repo: Repo, upstream_sha: str) -> tuple[str, dict[str, str]] | None:
    sha = repo.rev_parse(archive_ref(upstream_sha) + "^{commit}")
    if sha is None:
        return None
    message = repo.out("cat-file", "commit", sha).partition("\n\n")[2]
    trailers = parse_trailers(message)
    if trailers.get(TRAILER_UPSTREAM) != upstream_sha:
        return None
    return sha, trailers


def archive_commit(repo: Repo, upstream_sha: str) -> str | None:
    """The local commit already imported for ``upstream_sha``, if any."""
    found = _recorded(repo, upstream_sha)
    return found[0] if found else None


def import_archive(
    settings: Settings,
    repo: Repo,
    upstream_sha: str,
    console: Console,
    *,
    python: str | None = None,
    fetcher: Fetcher = fetch,
) -> str:
    """Import the archive mapped to ``upstream_sha`` into ``repo``; the commit SHA.

    Idempotent: when ``refs/skippy/archive/<sha>`` already holds an import of
    the same archive (same digest and folder), that commit is returned without
    fetching anything.
    """
    specs = load_archive_specs(settings)
    spec = specs.get(upstream_sha)
    if spec is None:
        known = ", ".join(s[:12] for s in sorted(specs)) or "none"
        raise ArchiveError(
            f"no archive mapped for {upstream_sha}",
            untouched="everything: nothing was fetched or written",
            next_step=(
                f"add {spec_key(upstream_sha)} with url, sha256 and folder to "
                f"{settings.relative(settings.root / 'pyproject.toml')}"
            ),
            details=f"archives mapped for: {known}",
        )
    scratch_root = settings.cache_dir / "tmp"
    _report_swept(sweep_stale(scratch_root, "archive-"), scratch_root, console)
    found = _recorded(repo, upstream_sha)
    if found and found[1].get(TRAILER_DIGEST) == spec.sha256 and found[1].get(TRAILER_FOLDER) == spec.folder:
        console.detail(f"archive for {upstream_sha[:12]} already imported as {found[0][:12]}")
        return found[0]
    ctx = FetchContext.from_settings(settings, console, python=python)
    cache = settings.cache_dir / "archives"
    archive = fetch_verified(spec.url, spec.sha256, cache, ctx, fetcher=fetcher, lock_timeout=settings.lock_timeout)
    with console.step(f"importing upstream {upstream_sha[:12]} from {archive.name}"):
        with owned_scratch(scratch_root, "archive-", console=console) as tmp:
            unpacked = safe_unpack(archive, tmp / "tree", spec.folder)
            sha = commit_folder(repo, unpacked, import_message(spec), scratch=tmp / "scratch")
        repo.git(
            "update-ref",
            "-m",
            f"skippy: import archive {spec.sha256[:12]}",
            archive_ref(upstream_sha),
            sha,
            what="git update-ref (archive import)",
        )
    console.info(f"imported upstream {upstream_sha[:12]} from archive as {sha[:12]}")
    return sha


def _size(n: float | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


__all__ = [
    "REF_PREFIX",
    "ArchiveSpec",
    "FetchContext",
    "Fetcher",
    "Kind",
    "Member",
    "UnpackPlan",
    "UrlKind",
    "archive_commit",
    "archive_members",
    "archive_ref",
    "commit_folder",
    "fetch",
    "fetch_verified",
    "import_archive",
    "import_message",
    "load_archive_specs",
    "owned_scratch",
    "parse_archive_specs",
    "parse_trailers",
    "pip_download_argv",
    "plan_unpack",
    "read_member_text",
    "safe_unpack",
    "sha256_of",
    "sweep_stale",
]
