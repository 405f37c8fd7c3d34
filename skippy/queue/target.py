"""What a prepare aims at: the pin, upstream master or a given commit, and the pin file.

Pure reading and checking; nothing here touches the workdir or the network.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Literal

from skippy.core.errors import SettingsError, SkippyError
from skippy.core.paths import NotSmallFile, read_small_text
from skippy.core.redact import excerpt
from skippy.core.settings import PIN_FILE_LIMIT, Settings, refuse_pin_file

SHA40 = re.compile(r"^[0-9a-f]{40}$")
_SHA_PREFIX = re.compile(r"^[0-9a-fA-F]{7,40}$")

Mode = Literal["pinned", "latest", "sha"]


@dataclass(frozen=True)
class Target:
    mode: Mode
    sha: str | None = None

    @classmethod
    def pinned(cls) -> Target:
        return cls("pinned")

    @classmethod
    def latest(cls) -> Target:
        return cls("latest")

    @classmethod
    def at(cls, sha: str) -> Target:
        return cls("sha", sha)

    def describe(self) -> str:
        return {"pinned": "the pinned commit", "latest": "upstream master"}.get(self.mode, f"commit {self.sha}")


def read_pin(settings: Settings) -> str:
    path = settings.pin_file
    try:
        text = read_small_text(path, PIN_FILE_LIMIT, inside=settings.root)
    except NotSmallFile as exc:
        raise refuse_pin_file(settings, "pin_file", exc.why) from None
    except UnicodeDecodeError:
        raise refuse_pin_file(settings, "pin_file", "not UTF-8 text") from None
    except FileNotFoundError:
        raise SettingsError(
            f"pin file {settings.relative(path)} does not exist",
            untouched="everything",
            next_step=f"write the upstream commit (40 hex) to {settings.relative(path)}, "
            "or run `invoke prepare --latest`",
        ) from None
    lines = [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.startswith("#")
    ]
    rel = settings.relative(path)
    fix = f"put the full upstream SHA in {rel} (`git rev-parse <ref>` prints it)"
    if not lines or not SHA40.match(lines[0][1].lower()):
        shown = excerpt(lines[0][1]) if lines else "(empty)"
        where = f" on line {lines[0][0]}" if lines else ""
        raise SettingsError(
            f"pin file {rel} must hold one full 40-hex commit SHA, found {shown}{where}",
            untouched="everything",
            next_step=fix,
        )
    if len(lines) > 1:
        first, (second, extra) = lines[0][0], lines[1]
        raise SettingsError(
            f"pin file {rel} must hold one line, but it has more: line {first} holds the SHA and line {second} "
            f"holds {excerpt(extra)} as well",
            untouched="everything",
            next_step=f"keep the one upstream SHA in {rel} and remove line {second} (or make it a # comment)",
        )
    return lines[0][1].lower()


def validate(settings: Settings, target: Target) -> str | None:
    """Check ``target`` before anything is touched; the pin when it is the pinned commit."""
    if target.mode == "sha":
        check_sha_arg(target.sha)
    return read_pin(settings) if target.mode == "pinned" else None


def check_sha_arg(sha: str | None) -> None:
    if not sha or not _SHA_PREFIX.match(sha):
        raise SettingsError(
            f"--sha {sha!r} is not a commit SHA (7 to 40 hex digits)",
            untouched="everything",
            next_step="pass a commit SHA, e.g. `invoke prepare --sha 4df29be4f4c3`",
        )


def expand_known_sha(settings: Settings, sha: str) -> str:
    """An abbreviated ``--sha`` that starts exactly one configured archive's commit or the pin, in full.

    Offline there is no upstream to ask git about an abbreviation, but the project names full
    SHAs itself (``[tool.skippy.archives]`` and the pin file): ``4df29be4f4c3`` is the pin.
    An abbreviation matching several is refused, naming them; one matching none is left as given.
    """
    if len(sha) >= 40:
        return sha
    known = {str(k).lower() for k in (settings.raw.get("archives") or {})}
    with contextlib.suppress(SkippyError, OSError):
        known.add(read_pin(settings))
    matches = sorted(k for k in known if len(k) == 40 and k.startswith(sha))
    if len(matches) > 1:
        raise SettingsError(
            f"--sha {sha} is ambiguous: it starts {', '.join(matches)}",
            untouched="everything: nothing was fetched or changed",
            next_step=f"invoke prepare --sha {matches[0]} (give more digits)",
        )
    return matches[0] if matches else sha


def rerun_command(target: Target, *, force: bool = False, offline: bool = False, triage: bool = False) -> str:
    """The command line that runs ``target`` again (for error messages)."""
    words = ["invoke", "triage" if triage else "prepare"]
    if target.mode == "latest":
        words.append("--latest")
    elif target.mode == "sha":
        words += ["--sha", target.sha or ""]
    if offline:
        words.append("--offline")
    if force:
        words.append("--force")
    return " ".join(words)
