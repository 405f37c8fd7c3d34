"""``[tool.skippy.archives]``: which source archive stands for which upstream commit (pure).

Each entry maps a full upstream SHA to a ``url`` (``https://``, ``file:`` or
``pypi-sdist:NAME==VERSION``), the archive's ``sha256`` and the ``folder`` inside
it that holds the llama.cpp tree.  Validation reads no file and names the key at fault.
"""

from __future__ import annotations

import enum
import os
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import SettingsError
from skippy.core.paths import is_inside
from skippy.core.settings import Settings

_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# a PEP 508 name (letters, digits, . _ -) pinned with == to one version
_PYPI_REQ = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9.+!_-]+)$")
_SPEC_KEYS = frozenset({"url", "sha256", "folder"})
_PYPI_SCHEME = "pypi-sdist:"


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


def file_url_problem(url: str, root: Path, cache: Path | None) -> str | None:
    """Why the ``file:`` archive ``url`` may not be read, or None: it must lie inside the project
    ``root`` or the ``cache`` once every link is followed (``file:///etc/shadow`` must never be
    copied into the cache, nor a link to it)."""
    source = file_url_path(url, root)
    places = [root] if cache is None else [root, cache]
    if any(is_inside(source, place) for place in places):
        return None
    real = Path(os.path.realpath(source))
    shown = str(source) if real == Path(os.path.normpath(source)) else f"{source}, a link to {real},"
    where = f"the project ({root})" + ("" if cache is None else f" and the cache ({cache})")
    return f"{shown} is outside {where}"


def check_file_url(settings: Settings, spec: ArchiveSpec) -> None:
    """Refuse a ``file:`` archive outside the project and the cache, before anything is fetched."""
    if spec.kind is not UrlKind.FILE:
        return
    why = file_url_problem(spec.url, settings.root, settings.cache_dir)
    if why is None:
        return
    raise SettingsError(
        f"pyproject.toml {spec_key(spec.upstream_sha, 'url')} = {spec.url!r}: refused: {why}; "
        "a file: archive is read only from inside them",
        untouched="everything: nothing was fetched, copied or written",
        next_step=f'copy the archive into the project and set url = "file:<path relative to {settings.root}>" '
        "(or use its https:// URL), then re-run `invoke prepare --pinned`",
    )


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
    url, digest, folder = _fields(sha, value)
    _check_url(sha, url)
    if not _SHA256.match(digest):
        raise _bad(
            spec_key(sha, "sha256"),
            f"must be 64 lowercase hex digits, got {digest!r}",
            "compute it with `sha256sum <archive>`",
        )
    return ArchiveSpec(upstream_sha=sha, url=url, sha256=digest, folder=_folder(sha, folder))


def _fields(sha: str, value: object) -> tuple[str, str, str]:
    """``url``, ``sha256`` and ``folder`` of one entry: a table of exactly those, non-empty strings."""
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
    found: list[str] = []
    for name in ("url", "sha256", "folder"):
        item = value[name]
        if not isinstance(item, str) or not item.strip():
            raise _bad(spec_key(sha, name), f"must be a non-empty string, got {item!r}", f"set {name}")
        found.append(item)
    return found[0], found[1], found[2]


def _check_url(sha: str, url: str) -> None:
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


def _folder(sha: str, folder: str) -> str:
    """``folder`` without surrounding slashes (``.`` for the whole archive); refused when it could leave it."""
    clean = folder.strip().strip("/")
    parts = clean.split("/")
    if folder.startswith("/") or ".." in parts or "\\" in folder or any(p == "" for p in parts):
        raise _bad(
            spec_key(sha, "folder"),
            f"{folder!r} must be a relative path inside the archive without '..' or '//'",
            'e.g. folder = "llama_cpp_python-0.3.35/vendor/llama.cpp" (or "." for the whole archive)',
        )
    return clean or "."


def load_archive_specs(settings: Settings) -> Mapping[str, ArchiveSpec]:
    """The validated ``[tool.skippy.archives]`` mapping, keyed by upstream SHA."""
    return parse_archive_specs(settings.raw.get("archives"))
