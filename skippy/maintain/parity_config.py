"""The configuration of ``invoke parity``: which files it scans and the allowlist of deliberate drops.

Settings (``[tool.skippy.parity]``)::

    files = ["src/*.cpp", "src/models/*.cpp"]   # globs over the tree (``**`` spans folders)
    allowlist = "parity-allowlist.toml"          # relative to the patch dir

The allowlist (``<patch_dir>/parity-allowlist.toml``) names each arch case the
queue drops on purpose, with a reason::

    [[dropped]]
    file = "src/llama-model.cpp"
    function = "llama_model::load_hparams"   # or: table = "LLM_ARCH_NAMES"
    case = "LLM_ARCH_X"
    reason = "why the queue drops it"
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import QueueError, SettingsError
from skippy.core.paths import NotSmallFile, enclosing_project, read_small_text
from skippy.core.settings import Settings

DEFAULT_FILES: tuple[str, ...] = ("src/*.cpp", "src/models/*.cpp")
DEFAULT_ALLOWLIST = "parity-allowlist.toml"
_CONFIG_KEYS = frozenset({"files", "allowlist"})
_ALLOW_KEYS = frozenset({"file", "function", "table", "case", "reason"})


@dataclass(frozen=True)
class ParityConfig:
    files: tuple[str, ...]
    allowlist: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> ParityConfig:
        table = settings.subtable("parity", _CONFIG_KEYS, example='files = ["src/*.cpp"]')
        files = table.get("files", list(DEFAULT_FILES))
        if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
            raise SettingsError(
                "[tool.skippy.parity] files must be a non-empty list of glob strings",
                untouched="everything",
                next_step='files = ["src/*.cpp", "src/models/*.cpp"]',
            )
        allow = table.get("allowlist", DEFAULT_ALLOWLIST)
        if not isinstance(allow, str) or not allow:
            raise SettingsError(
                "[tool.skippy.parity] allowlist must be a path relative to the patch dir",
                untouched="everything",
                next_step=f'allowlist = "{DEFAULT_ALLOWLIST}"',
            )
        return cls(tuple(files), settings.patch_dir / allow)

    def matches(self, path: str) -> bool:
        return any(glob_match(path, pattern) for pattern in self.files)


def glob_match(path: str, pattern: str) -> bool:
    """Segment-wise glob: ``*`` stays inside one folder, ``**`` spans any number of them."""
    parts = path.split("/")
    pats = pattern.strip("/").split("/")

    def walk(i: int, j: int) -> bool:
        if j == len(pats):
            return i == len(parts)
        if pats[j] == "**":
            return any(walk(k, j + 1) for k in range(i, len(parts) + 1))
        return i < len(parts) and fnmatch.fnmatchcase(parts[i], pats[j]) and walk(i + 1, j + 1)

    return walk(0, 0)


@dataclass(frozen=True)
class Allowed:
    kind: str  # switch | table
    file: str
    scope: str
    case: str
    reason: str

    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.file, self.scope, self.case)

    def as_dict(self) -> dict[str, str]:
        scope_key = "function" if self.kind == "switch" else "table"
        return {"file": self.file, scope_key: self.scope, "case": self.case, "reason": self.reason}


#: the largest allowlist read
ALLOWLIST_LIMIT = 1024 * 1024


def _read_allowlist(path: Path, inside: Path | None) -> dict[str, object]:
    """The allowlist's TOML, read with a bound from a regular file inside the project."""
    container = inside or enclosing_project(path.parent) or path.parent.resolve()
    try:
        return tomllib.loads(read_small_text(path, ALLOWLIST_LIMIT, inside=container))
    except NotSmallFile as exc:
        raise QueueError(
            f"the parity allowlist {path} is refused, not read: it is {exc.why}",
            untouched="everything",
            next_step=f"make {path.name} a regular file of the project (the queue reads no file from outside it), "
            "or point [tool.skippy.parity] allowlist at one",
        ) from None
    except UnicodeDecodeError:
        raise QueueError(
            f"the parity allowlist {path} is not UTF-8 text",
            untouched="everything",
            next_step=f"save {path.name} as UTF-8",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise QueueError(
            f"{path}: not valid TOML ({exc})",
            untouched="everything",
            next_step=f"fix the syntax of {path.name}",
        ) from exc


def load_allowlist(path: Path, *, inside: Path | None = None) -> tuple[Allowed, ...]:
    """The allowlist entries (none when the file does not exist); QueueError on a malformed file
    and on one that is not a regular file inside the project ``inside`` (never read then)."""
    if not os.path.lexists(path):
        return ()
    data = _read_allowlist(path, inside)
    unknown_top = sorted(set(data) - {"dropped"})
    problems: list[str] = [f"unknown top-level key {k!r} (entries are [[dropped]] tables)" for k in unknown_top]
    entries: list[Allowed] = []
    raw = data.get("dropped", [])
    if not isinstance(raw, list):
        raw = []
        problems.append("`dropped` must be an array of tables ([[dropped]])")
    for index, item in enumerate(raw, start=1):
        if not isinstance(item, dict):
            problems.append(f"entry {index}: not a table")
            continue
        extra = sorted(set(item) - _ALLOW_KEYS)
        if extra:
            problems.append(f"entry {index}: unknown key(s) {', '.join(extra)}")
        scopes = [k for k in ("function", "table") if k in item]
        values = {k: item.get(k) for k in ("file", "case", "reason", *scopes)}
        missing = [k for k, v in values.items() if not isinstance(v, str) or not v.strip()]
        if len(scopes) != 1:
            problems.append(f"entry {index}: give exactly one of function = ... or table = ...")
            continue
        if missing:
            problems.append(f"entry {index}: {', '.join(missing)} must be non-empty strings (a reason is required)")
            continue
        kind = "switch" if scopes[0] == "function" else "table"
        entries.append(
            Allowed(kind, str(item["file"]), str(item[scopes[0]]), str(item["case"]), str(item["reason"]).strip())
        )
    if problems:
        raise QueueError(
            f"the parity allowlist {path.name} is invalid",
            details="\n".join(problems),
            untouched="everything",
            next_step=f"fix {path}; each [[dropped]] entry has file, function (or table), case and reason",
        )
    return tuple(entries)
