"""The one ``pip download`` command line the product runs (source archives, toolkit wheels),
and pip's output turned into progress (:class:`PipOutput`)."""

from __future__ import annotations

import contextlib
import posixpath
import re
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

from skippy.core.ui import Console, Progress


def pip_download_argv(
    python: str, into: Path, *, attempts: int, options: Sequence[str] = (), what: Sequence[str]
) -> list[str]:
    """``python -m pip download --no-deps <options> ... -d <into> <what>`` (pure).

    Never asks (``--no-input``), never nags about pip's own version, and retries
    ``attempts - 1`` times on a network failure; ``what`` is a requirement or ``-r FILE``.
    """
    return [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        *options,
        "--disable-pip-version-check",
        "--no-input",
        "--retries",
        str(max(attempts - 1, 0)),
        "-d",
        str(into),
        *what,
    ]


# --- pip's output as progress -------------------------------------------------------------------

#: ``Downloading <file or url> (74.9 MB)``: pip announces each download it makes (not one it
#: takes from its cache: ``Using cached ...``)
_DOWNLOADING: Final = re.compile(
    r"^\s*Downloading (?P<what>\S+)(?: \((?P<size>[\d.]+) (?P<unit>bytes|kB|MB|GB)\))?\s*$"
)
#: pip's units are powers of 1000 (``pip._internal.utils.misc.format_size``)
_UNITS: Final[Mapping[str, int]] = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
#: the closing line of pip's own progress bar, when its output is not a terminal
_BAR: Final = re.compile(r"^\s*[\u2500-\u257f]+\s")
#: where pip writes a file while downloading it: ``$TMPDIR/pip-unpack-<random>/<file>``
UNPACK_GLOB: Final = "pip-unpack-*"


def parse_download(line: str) -> tuple[str, int | None] | None:
    """``(file name, size in bytes or None)`` of a pip ``Downloading`` line, else None (pure)."""
    found = _DOWNLOADING.match(line)
    if found is None:
        return None
    name = posixpath.basename(urllib.parse.unquote(urllib.parse.urlsplit(found["what"]).path)) or found["what"]
    size = round(float(found["size"]) * _UNITS[found["unit"]]) if found["size"] else None
    return name, size


def downloaded_bytes(tmpdir: Path, name: str) -> int:
    """How much of ``name`` a pip run whose TMPDIR is ``tmpdir`` has downloaded so far."""
    total = 0
    for path in tmpdir.glob(f"{UNPACK_GLOB}/{name}"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


class PipOutput:
    """pip's output lines, as :meth:`proc.run`'s ``on_line``, turned into progress.

    Each file pip downloads gets a :class:`~skippy.core.ui.Progress` (its size from pip's
    ``Downloading`` line, the bytes so far from the file growing under the ``TMPDIR``
    given to pip, see :func:`pip_env`); pip's other lines are details (``--verbose``),
    its own progress bar is dropped.  :meth:`end` closes the last download.
    """

    def __init__(self, console: Console, tmpdir: Path) -> None:
        self.console = console
        self.tmpdir = tmpdir
        self.downloads: list[tuple[str, int | None]] = []
        self._current: Progress | None = None
        self._watch = contextlib.ExitStack()

    def __call__(self, line: str) -> None:
        if _BAR.match(line) or not line.strip():
            return
        found = parse_download(line)
        self.end(ok=True)
        if found is None:
            self.console.detail(line.strip())
            return
        name, size = found
        self.downloads.append(found)
        self._current = self.console.progress(name, size)
        self._watch.enter_context(self._current.watching(lambda: downloaded_bytes(self.tmpdir, name)))

    def end(self, *, ok: bool) -> None:
        """Close the download under way: its closing line when pip went on (``ok``), else nothing."""
        self._watch.close()
        current, self._current = self._current, None
        if current is None:
            return
        if ok:
            current.finish(max(current.done_bytes, current.total or 0))
        else:
            current.abandon()


@contextlib.contextmanager
def pip_output(console: Console, tmpdir: Path) -> Iterator[PipOutput]:
    """A :class:`PipOutput` for one pip run; its last download is closed when the run ends."""
    tmpdir.mkdir(parents=True, exist_ok=True)
    out = PipOutput(console, tmpdir)
    try:
        yield out
    except BaseException:
        out.end(ok=False)
        raise
    out.end(ok=True)


def pip_env(env: Mapping[str, str], tmpdir: Path) -> dict[str, str]:
    """``env`` for a pip run whose temporary files (downloads included) go to ``tmpdir``."""
    return {**env, "TMPDIR": str(tmpdir)}
