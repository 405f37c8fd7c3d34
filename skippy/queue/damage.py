"""A workdir whose git dir cannot be read as a repository (emptied, half-copied): named as such,
with what was left and the way out, before any git command fails on it with a bare exit code."""

from __future__ import annotations

import shlex
from pathlib import Path

from skippy.core.errors import WorkdirError
from skippy.core.settings import Settings

#: what git itself needs to take a folder for a git dir (setup.c: is_git_directory)
NEEDED: tuple[tuple[str, bool], ...] = (("HEAD", False), ("objects", True), ("refs", True))


def missing_parts(git_dir: Path) -> list[str]:
    """The parts git needs that ``git_dir`` lacks (``objects/`` and ``refs/`` as folders)."""
    return [
        name + ("/" if folder else "")
        for name, folder in NEEDED
        if not ((git_dir / name).is_dir() if folder else (git_dir / name).is_file())
    ]


def aside_name(workdir: Path) -> Path:
    """A free name beside ``workdir`` to move it to: ``<name>.damaged`` (then ``-2``, ``-3``...)."""
    candidate = workdir.with_name(workdir.name + ".damaged")
    n = 2
    while candidate.exists() or candidate.is_symlink():
        candidate = workdir.with_name(f"{workdir.name}.damaged-{n}")
        n += 1
    return candidate


def refuse_damaged_git_dir(settings: Settings, git_dir: Path) -> None:
    """WorkdirError when ``git_dir`` (the workdir's ``.git`` folder) is not a git repository."""
    missing = missing_parts(git_dir)
    if not missing:
        return
    rel = settings.relative(settings.workdir)
    try:
        empty = not any(git_dir.iterdir())
    except OSError:
        empty = False
    state = "is empty" if empty else f"lacks {', '.join(missing)}"
    aside = settings.relative(aside_name(settings.workdir))
    raise WorkdirError(
        f"the workdir's git dir {settings.relative(git_dir)} {state}: it is damaged (not a git repository), "
        "so the workdir's checkout and local work cannot be read",
        untouched=f"{rel} and everything in it: nothing was changed",
        next_step=f"move it aside and prepare a fresh one: mv {shlex.quote(rel)} {shlex.quote(aside)} && "
        f"invoke prepare (then copy back what you need from {aside})",
    )
