"""The pin file written: only its SHA line replaced, atomically (comments, blank lines, line
endings and the file's mode stay; written through a link), and its mirror when one is configured.
"""

from __future__ import annotations

from pathlib import Path

from skippy.core.errors import SettingsError
from skippy.core.files import write_text_atomic
from skippy.core.paths import NotSmallFile, read_small_text
from skippy.core.settings import PIN_FILE_LIMIT, Settings


def pin_text(old: str, sha: str) -> str:
    """The pin file ``old`` with its SHA line replaced by ``sha``: comment lines (``#``, as
    :func:`skippy.queue.target.read_pin` reads them), blank lines, indentation and line endings stay."""
    lines = old.splitlines(keepends=True)
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        if line.startswith("#") or not body.strip():
            continue
        indent = body[: len(body) - len(body.lstrip())]
        lines[i] = indent + sha + line[len(body) :]
        return "".join(lines)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join(lines) + sha + "\n"


def write_pin_atomic(path: Path, sha: str) -> None:
    """Write ``sha`` into the pin file atomically, keeping its comments and mode (through a link)."""
    target = path.resolve() if path.is_symlink() else path
    try:
        old = read_small_text(target, PIN_FILE_LIMIT)
    except FileNotFoundError:
        old = ""
    except NotSmallFile as exc:
        raise SettingsError(
            f"{path}: refused as a pin file: it is {exc.why}",
            untouched=f"{path}: the pin was not written",
            next_step=f"make {path} a small regular file holding one upstream commit, then re-run `invoke pin-bump`",
        ) from None
    write_text_atomic(target, pin_text(old, sha))


def write_pins(settings: Settings, new_pin: str) -> list[str]:
    """Write the pin (and its mirror, when configured); the notes to report."""
    write_pin_atomic(settings.pin_file, new_pin)
    if settings.pin_mirror is None:
        return []
    write_pin_atomic(settings.pin_mirror, new_pin)
    return [f"mirrored the pin to {settings.relative(settings.pin_mirror)}"]
