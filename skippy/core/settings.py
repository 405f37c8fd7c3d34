"""Frozen settings: ``[tool.skippy]`` in pyproject.toml, overridden by the
environment variables maintainers already use.

Nothing below this module reads ``os.environ``: callers pass ``env`` in (the
entry points pass ``os.environ``; tests pass a dict).
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core import specs
from skippy.core.errors import SettingsError
from skippy.core.paths import NotSmallFile, is_link_loop, outside_why, path_kind, read_small_text

DEFAULT_UPSTREAM = "https://github.com/ggml-org/llama.cpp.git"

#: environment variable -> settings key it overrides
ENV_OVERRIDES: Mapping[str, str] = {spec.env: spec.key for spec in specs.TOP if spec.env}

_DEFAULTS: Mapping[str, Any] = {spec.key: spec.default for spec in specs.TOP}


def find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` whose pyproject.toml has [tool.skippy]."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        pyproject = candidate / "pyproject.toml"
        if os.path.lexists(pyproject) and "[tool.skippy" in read_settings_file(pyproject, candidate):
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
        if os.path.lexists(pyproject):
            try:
                data = tomllib.loads(read_settings_file(pyproject, root))
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
        unknown = sorted(set(table) - set(_DEFAULTS) - _SUBTABLES)
        if unknown:
            raise SettingsError(
                f"pyproject.toml [tool.skippy]: unknown key(s) {', '.join(unknown)}",
                untouched="everything",
                next_step="remove or rename them; known keys: " + ", ".join(sorted(_DEFAULTS)),
            )
        merged = specs.check_table(specs.TOP, table, env, where="[tool.skippy]")
        for name, sub in specs.SUBTABLES.items():
            value = table.get(name, {})
            if isinstance(value, Mapping):  # a non-table is refused by Settings.subtable, with its example
                specs.check_table(sub, value, env, where=f"[tool.skippy.{name}]")

        def path(key: str) -> Path:
            p = Path(merged[key]).expanduser()
            return p if p.is_absolute() else root / p

        link = merged["compat_link"]
        compat = (Path(link) if Path(link).is_absolute() else root / link) if link else None
        settings = cls(
            root=root,
            upstream_url=str(merged["upstream_url"]),
            pin_file=path("pin_file"),
            patch_dir=path("patch_dir"),
            workdir=path("workdir"),
            compat_link=compat,
            build_root=path("build_root"),
            cache_dir=path("cache_dir"),
            upstream_branch=str(merged["upstream_branch"]),
            network_attempts=merged["network_attempts"],
            network_backoff=merged["network_backoff"],
            lock_timeout=merged["lock_timeout"],
            tolerated_untracked=merged["tolerated_untracked"],
            pin_mirror=path("pin_mirror") if merged["pin_mirror"] else None,
            env=dict(env),
            raw=dict(table),
        )
        check_path_settings(settings)
        check_workdir(settings, from_env=bool(env.get("LLAMA_WORKDIR")))
        for key in ("pin_file", "pin_mirror"):
            pin: Path | None = getattr(settings, key)
            why = pin_file_problem(pin, root) if pin is not None else None
            if why is not None:
                raise refuse_pin_file(settings, key, why)
        return settings

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


#: the largest pin file (or pin mirror) read: a pin is one line
PIN_FILE_LIMIT = 64 * 1024
#: the largest pyproject.toml read for the settings
SETTINGS_FILE_LIMIT = 1024 * 1024


def read_settings_file(pyproject: Path, root: Path) -> str:
    """The text of ``pyproject``: a regular file inside ``root`` (no link out of it), read with a bound."""
    try:
        return read_small_text(pyproject, SETTINGS_FILE_LIMIT, inside=root)
    except NotSmallFile as exc:
        why = exc.why
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    raise SettingsError(
        f"{pyproject}: refused as the settings file: it is {why}",
        untouched="everything: nothing was read or written",
        next_step=f"make {pyproject} a regular file of the project (a copy, not a link out of it), "
        "then re-run `invoke status`",
    )


def source(settings: Settings, key: str) -> str:
    """Where a path setting came from, for messages: ``LLAMA_PIN_FILE=...`` or ``[tool.skippy] pin_file = ...``."""
    var = next((v for v, k in ENV_OVERRIDES.items() if k == key), None)
    if var and settings.env.get(var):
        return f"{var}={settings.env[var]}"
    return f"[tool.skippy] {key} = {getattr(settings, key)}"


def pin_file_problem(path: Path, root: Path) -> str | None:
    """Why ``path`` cannot be a pin file (``stat`` only, nothing opened), or None when it can
    (a missing one can: ``prepare --latest`` needs none).  It must be a small regular file
    inside the project ``root`` once its links are followed: ``/proc/self/environ`` reports
    size 0, and a link to it (or to ``/etc/shadow``) must never be read."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        info = path.stat()
    except OSError:
        return path_kind(path)
    if not stat.S_ISREG(info.st_mode):
        return f"{path_kind(path)}, not a regular file"
    if info.st_size > PIN_FILE_LIMIT:
        return f"{info.st_size} bytes, over the {PIN_FILE_LIMIT}-byte limit of a pin file"
    return outside_why(path, root)


def refuse_pin_file(settings: Settings, key: str, why: str) -> SettingsError:
    var = next(v for v, k in ENV_OVERRIDES.items() if k == key) if key == "pin_file" else None
    unset = f"unset {var}, or " if var and settings.env.get(var) else ""
    return SettingsError(
        f"{source(settings, key)}: refused as the {key.replace('_', ' ')}: it is {why}",
        untouched="everything: nothing was read or written",
        next_step=f"{unset}set {key} under [tool.skippy] in {settings.root / 'pyproject.toml'} to a small regular "
        "file holding one 40-hex upstream commit, then re-run `invoke status`",
    )


#: path settings -> how messages name them (a link loop in any is refused when the settings are made)
_PATH_LABELS: Mapping[str, str] = {
    "workdir": "the workdir",
    "patch_dir": "the patch dir",
    "pin_file": "the pin file",
    "pin_mirror": "the pin mirror",
    "build_root": "the build root",
    "cache_dir": "the cache dir",
}


def check_path_settings(settings: Settings) -> None:
    """Refuse a path setting whose links loop (nothing can be resolved, read or written under
    it) and a patch dir outside the project (the queue is read only from inside it)."""
    for key in _PATH_LABELS:
        path: Path | None = getattr(settings, key)
        if path is not None and is_link_loop(path):
            why = f"a symbolic link loop ({path} never resolves: its links lead back to themselves)"
            raise refuse_path(settings, key, why, wanted="a path whose links resolve")
    outside = outside_why(settings.patch_dir, settings.root)
    if outside is not None:
        why = f"{outside}: skippy reads the queue only from inside the project"
        raise refuse_path(settings, "patch_dir", why, wanted="the queue's folder inside the project")


def refuse_path(settings: Settings, key: str, why: str, *, wanted: str) -> SettingsError:
    """The error for a path setting refused for ``why`` (it names where the value came from and,
    as the next step, where to point it: ``wanted``)."""
    var = next((v for v, k in ENV_OVERRIDES.items() if k == key), None)
    where = (
        f"unset {var}, or point it at {wanted}"
        if var and settings.env.get(var)
        else f"set {key} under [tool.skippy] in {settings.root / 'pyproject.toml'} to {wanted}"
    )
    return SettingsError(
        f"{source(settings, key)}: refused as {_PATH_LABELS[key]}: it is {why}",
        untouched="everything: nothing was locked, read or written",
        next_step=f"{where}, then re-run `invoke status`",
    )


def check_workdir(settings: Settings, *, from_env: bool) -> None:
    """Refuse a workdir skippy must never replace with llama.cpp: one that is (or holds) the
    project root, the patch dir, the pin file, ``$HOME`` or ``/``, one inside the patch dir or
    the project's ``.git``, or one that exists and is not a directory.  Called when the
    settings are made, before any lock or work."""
    workdir = settings.workdir
    resolved = Path(os.path.realpath(workdir))
    guarded: list[tuple[str, Path]] = [
        ("the file system root", Path("/")),
        ("the project root", settings.root),
        ("the patch dir", settings.patch_dir),
        ("the pin file", settings.pin_file),
    ]
    home = settings.env.get("HOME")
    if home:
        guarded.append(("your home directory ($HOME)", Path(home)))
    why = None
    for label, path in guarded:
        target = Path(os.path.realpath(path))
        if target == resolved:
            why = f"it is {label} ({target})"
        elif resolved in target.parents:
            why = f"it contains {label} ({target})"
        else:
            continue
        why += ", and skippy replaces the workdir's whole tree with llama.cpp"
        break
    inside = (
        ("the patch dir", settings.patch_dir, "a clone there would put all of llama.cpp into the queue"),
        ("the project's .git", settings.root / ".git", "a clone there would write into the project's own git data"),
    )
    for label, path, harm in inside if why is None else ():
        target = Path(os.path.realpath(path))
        if target in resolved.parents:
            why = f"it is inside {label} ({target}), and {harm}"
            break
    if why is None and (workdir.exists() or workdir.is_symlink()) and not workdir.is_dir():
        why = f"it is {path_kind(workdir)}, not a directory"
    if why is None:
        return
    default = settings.root / ".deps" / "llama.cpp"
    raise SettingsError(
        f"{source(settings, 'workdir')}: refused as the workdir: {why}",
        untouched="everything: nothing was locked, read or written",
        next_step=(
            f"unset LLAMA_WORKDIR, or give it a directory of its own: LLAMA_WORKDIR={default} invoke status"
            if from_env
            else f'set workdir = ".deps/llama.cpp" (a directory of its own) under [tool.skippy] in '
            f"{settings.root / 'pyproject.toml'}"
        ),
    )


#: sub-tables owned by other modules (archives, builds, spot checks ...)
_SUBTABLES = frozenset({"archives", "build", "spot_check", "parity", "generated", "testbed", "upstream_tests"})
