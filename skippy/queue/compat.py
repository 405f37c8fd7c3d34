"""The ``llama.cpp -> .deps/llama.cpp`` compatibility link, kept by every prepare."""

from __future__ import annotations

import contextlib
import os.path
from pathlib import Path

from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.disk import oserror_problem

#: the workdir when neither [tool.skippy] workdir nor LLAMA_WORKDIR says otherwise
DEFAULT_WORKDIR = ".deps/llama.cpp"


def ensure_compat_link(settings: Settings, console: Console) -> tuple[str, ...]:
    """Keep ``llama.cpp -> .deps/llama.cpp``; never replace a real file or directory."""
    link = settings.compat_link
    if link is None or not settings.workdir.exists():
        return ()
    configured = settings.root / str(settings.raw.get("workdir") or DEFAULT_WORKDIR)
    if settings.workdir.resolve() != configured.resolve():
        # LLAMA_WORKDIR points elsewhere (a scratch or second checkout): the project's link keeps
        # naming the configured workdir, so it never dangles when that other directory goes away
        return (
            f"compat link {settings.relative(link)} left as it is: it follows only the configured workdir "
            f"{settings.relative(configured)}, not LLAMA_WORKDIR={settings.workdir}",
        )
    try:
        return _update_compat_link(settings, link, console)
    except OSError as exc:
        problem = oserror_problem(exc)
        note = f"compat link {settings.relative(link)} not updated: {problem.cause} ({problem.path or link})"
        console.warn(note)
        return (note,)


def _update_compat_link(settings: Settings, link: Path, console: Console) -> tuple[str, ...]:
    target = Path(os.path.relpath(settings.workdir, link.parent))
    if link.is_symlink():
        if Path(link.readlink()) == target:
            return ()
        tmp = link.with_name(link.name + ".skippy-tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target, target_is_directory=True)
        tmp.replace(link)
        return (f"compat link {settings.relative(link)} now points to {target}",)
    if link.exists():
        console.warn(
            f"{settings.relative(link)} is a real file or directory, not the compatibility link; left as it is "
            "(set [tool.skippy] compat_link = false to silence this)"
        )
        return (f"{settings.relative(link)} is not a link: left untouched",)
    link.symlink_to(target, target_is_directory=True)
    return (f"compat link {settings.relative(link)} -> {target}",)
