"""Frozen settings: ``[tool.skippy]`` in pyproject.toml, overridden by the
environment variables maintainers already use.

Nothing below this module reads ``os.environ``: callers pass ``env`` in (the
entry points pass ``os.environ``; tests pass a dict).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.errors import SettingsError

DEFAULT_UPSTREAM = "https://github.com/ggml-org/llama.cpp.git"

#: environment variable -> settings key it overrides
ENV_OVERRIDES: Mapping[str, str] = {
    "LLAMA_UPSTREAM_URL": "upstream_url",
    "LLAMA_WORKDIR": "workdir",
    "LLAMA_PIN_FILE": "pin_file",
    "LLAMA_PATCH_DIR": "patch_dir",
}

_DEFAULTS: Mapping[str, Any] = {
    "upstream_url": DEFAULT_UPSTREAM,
    "pin_file": "skippy/llama_cpp/upstream.txt",
    "patch_dir": "skippy/llama_cpp/patches",
    "workdir": ".deps/llama.cpp",
    "compat_link": "llama.cpp",
    "build_root": ".deps/llama-build",
    "cache_dir": ".deps/cache",
    "upstream_branch": "master",
    "network_attempts": 3,
    "network_backoff": 2.0,
    "lock_timeout": 900.0,
    "tolerated_untracked": ["build/", "build-*/", "*.gguf"],
    "pin_mirror": "",
}


def find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` whose pyproject.toml has [tool.skippy]."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file() and "[tool.skippy" in pyproject.read_text(encoding="utf-8"):
            return candidate
    raise SettingsError(
        f"no pyproject.toml with a [tool.skippy] table at or above {start}",
        untouched="everything: nothing was read or written",
        next_step="run the command from the skippy project root",
    )


@dataclass(frozen=True)
class Settings:
    root: Path
    upstream_url: str
    pin_file: Path
    patch_dir: Path
    workdir: Path
    compat_link: Path | None
    build_root: Path
    cache_dir: Path
    upstream_branch: str
    network_attempts: int
    network_backoff: float
    lock_timeout: float
    tolerated_untracked: tuple[str, ...]
    #: a second file some projects keep with the same pin (written by pin-bump), or None
    pin_mirror: Path | None
    #: the environment the entry point was given (CI detection, tool lookup)
    env: Mapping[str, str] = field(repr=False)
    #: the whole [tool.skippy] table, for modules that own a sub-table
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def load(cls, root: Path, env: Mapping[str, str]) -> Settings:
        root = root.resolve()
        pyproject = root / "pyproject.toml"
        table: dict[str, Any] = {}
        if pyproject.is_file():
            try:
                data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as exc:
                raise SettingsError(
                    f"{pyproject}: not valid TOML ({exc})",
                    untouched="everything",
                    next_step=f"fix the syntax in {pyproject}",
                ) from exc
            table = dict(data.get("tool", {}).get("skippy", {}))
        return cls.from_table(root, table, env)

    @classmethod
    def from_table(cls, root: Path, table: Mapping[str, Any], env: Mapping[str, str]) -> Settings:
        merged: dict[str, Any] = dict(_DEFAULTS)
        unknown = sorted(set(table) - set(_DEFAULTS) - _SUBTABLES)
        if unknown:
            raise SettingsError(
                f"pyproject.toml [tool.skippy]: unknown key(s) {', '.join(unknown)}",
                untouched="everything",
                next_step="remove or rename them; known keys: " + ", ".join(sorted(_DEFAULTS)),
            )
        merged.update({k: v for k, v in table.items() if k in _DEFAULTS})
        for var, key in ENV_OVERRIDES.items():
            value = env.get(var)
            if value:
                merged[key] = value

        def path(key: str) -> Path:
            value = merged[key]
            if not isinstance(value, str) or not value:
                raise SettingsError(
                    f"[tool.skippy] {key} must be a non-empty path string, got {value!r}",
                    untouched="everything",
                    next_step=f"set {key} in pyproject.toml",
                )
            p = Path(value).expanduser()
            return p if p.is_absolute() else root / p

        link = merged["compat_link"]
        compat: Path | None
        if link in ("", False, None):
            compat = None
        elif isinstance(link, str):
            compat = Path(link) if Path(link).is_absolute() else root / link
        else:
            raise SettingsError(
                f"[tool.skippy] compat_link must be a path or false, got {link!r}",
                untouched="everything",
                next_step='set compat_link = "llama.cpp" or compat_link = false',
            )
        try:
            attempts = int(merged["network_attempts"])
            backoff = float(merged["network_backoff"])
            lock_timeout = float(merged["lock_timeout"])
        except (TypeError, ValueError) as exc:
            raise SettingsError(
                f"[tool.skippy] numeric setting is not a number ({exc})",
                untouched="everything",
                next_step="fix network_attempts / network_backoff / lock_timeout",
            ) from exc
        if attempts < 1:
            raise SettingsError(
                "[tool.skippy] network_attempts must be at least 1",
                untouched="everything",
                next_step="set network_attempts = 3",
            )
        return cls(
            root=root,
            upstream_url=str(merged["upstream_url"]),
            pin_file=path("pin_file"),
            patch_dir=path("patch_dir"),
            workdir=path("workdir"),
            compat_link=compat,
            build_root=path("build_root"),
            cache_dir=path("cache_dir"),
            upstream_branch=str(merged["upstream_branch"]),
            network_attempts=attempts,
            network_backoff=backoff,
            lock_timeout=lock_timeout,
            tolerated_untracked=tuple(str(p) for p in merged["tolerated_untracked"]),
            pin_mirror=path("pin_mirror") if merged["pin_mirror"] else None,
            env=dict(env),
            raw=dict(table),
        )

    @property
    def on_ci(self) -> bool:
        return self.env.get("CI", "").lower() in ("1", "true", "yes")

    @property
    def on_github(self) -> bool:
        return self.env.get("GITHUB_ACTIONS", "") == "true"

    def subtable(self, name: str, known: Iterable[str], *, example: str) -> Mapping[str, Any]:
        """``[tool.skippy.<name>]`` (empty when absent), refusing a non-table and unknown keys.

        ``example`` is a line of valid TOML for the table, shown in the error's next step.
        """
        table = self.raw.get(name, {})
        where = f"pyproject.toml [tool.skippy.{name}]"
        if not isinstance(table, Mapping):
            raise SettingsError(
                f"{where} must be a table, got {type(table).__name__}",
                untouched="everything",
                next_step=f"write it as [tool.skippy.{name}] with key = value lines, e.g. {example}",
            )
        known_keys = frozenset(known)
        unknown = sorted(set(table) - known_keys)
        if unknown:
            raise SettingsError(
                f"{where}: unknown key(s) {', '.join(unknown)}",
                untouched="everything",
                next_step="remove or rename them; known keys: " + ", ".join(sorted(known_keys)),
            )
        return table

    def relative(self, path: Path) -> str:
        """``path`` relative to the project root when inside it (for messages)."""
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


#: sub-tables owned by other modules (archives, builds, spot checks ...)
_SUBTABLES = frozenset({"archives", "build", "spot_check", "parity", "generated", "testbed"})
