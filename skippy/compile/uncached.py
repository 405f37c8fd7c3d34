"""Compiles a compiler cache must not serve: sources that pull in files it cannot see.

sccache and ccache key an object by the compiler, its flags and the source with its headers
(or the preprocessed text). A file the assembler pulls in (``.incbin``, in an assembler source
or in inline ``asm``) or C23/C++26 ``#embed`` is in none of those: change that file, and a cache
shared with another build dir or machine serves the object made from the old one. skippy keeps
such compiles out of the cache:

* assembler sources never go through the cache (:data:`UNCACHED_LANGUAGES`:
  the Metal backend embeds its shader library with a generated ``.incbin`` source);
* a C-family source that contains ``.incbin`` or ``#embed``, or includes a header that does
  (directly or through other headers, matched by file name), is found in the tree when the build
  is planned (:func:`find_uncached_sources`). The compiler launcher is then a short script
  (:func:`uncached_launcher`): it runs the compiler itself for those sources and the cache for
  every other compile. A tree without such sources keeps the cache as its launcher.

The scan is conservative: a comment naming ``#embed`` counts. Sources generated into the build
dir are not scanned (the generated Metal source is assembler, kept out by its language).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from skippy.core.files import write_text_atomic

#: languages whose compiles never go through the compiler cache: an assembler source may
#: ``.incbin`` a file (the embedded Metal library does) that no cache sees among its inputs
UNCACHED_LANGUAGES: Final = frozenset({"ASM", "ASM-ATT", "ASM_NASM", "ASM_MASM"})
#: the C-family sources a launcher is asked to compile
SOURCE_SUFFIXES: Final = frozenset({".c", ".cc", ".cpp", ".cxx", ".cu", ".m", ".mm"})
#: the files those include
HEADER_SUFFIXES: Final = frozenset({".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl"})
#: what pulls in a file no compiler cache sees
_OPAQUE: Final = re.compile(rb"\.incbin\b|#[ \t]*embed\b")
_INCLUDE: Final = re.compile(rb"#[ \t]*include[ \t]*[<\"]([^>\"\n]+)[>\"]")
#: where the launcher scripts live, under the folder of build dirs (bound into a build root)
LAUNCHER_FOLDER: Final = ".launchers"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""  # a dangling link or an unreadable file: the compiler will say so


def _included_names(data: bytes) -> set[str]:
    return {PurePosixPath(m.decode("utf-8", "replace")).name for m in _INCLUDE.findall(data)}


def find_uncached_sources(tree_files: Iterable[Path]) -> tuple[Path, ...]:
    """The sources among ``tree_files`` (a tree's files: :func:`skippy.compile.toolchain.tree_files`)
    whose objects depend on a file no compiler cache sees: those containing ``.incbin``/``#embed``,
    and those including (by file name, through any number of headers) a header that does.
    Sorted; empty for the llama.cpp trees seen so far."""
    suffixes = SOURCE_SUFFIXES | HEADER_SUFFIXES
    files = [p for p in tree_files if p.suffix in suffixes]
    marked = {p for p in files if _opaque(_read(p))}
    names = {p.name for p in marked if p.suffix in HEADER_SUFFIXES}
    if names:
        includes = {p: _included_names(_read(p)) for p in files if p not in marked}
        while names:
            found = {p for p, inc in includes.items() if inc & names}
            for p in found:
                del includes[p]
            marked |= found
            names = {p.name for p in found if p.suffix in HEADER_SUFFIXES}
    return tuple(sorted(p for p in marked if p.suffix in SOURCE_SUFFIXES))


def _opaque(data: bytes) -> bool:
    return (b"incbin" in data or b"embed" in data) and _OPAQUE.search(data) is not None


@dataclass(frozen=True)
class LauncherScript:
    """A compiler launcher that keeps some sources out of the cache: its path and text."""

    path: Path
    text: str
    sources: tuple[Path, ...]

    def write(self) -> None:
        """Write it (executable) unless it is there with this text; its name is its content's hash."""
        try:
            if self.path.read_text("utf-8") == self.text and os.access(self.path, os.X_OK):
                return
        except OSError:
            pass
        write_text_atomic(self.path, self.text)
        self.path.chmod(0o755)


def launcher_text(cache: str, sources: Sequence[Path]) -> str:
    """A ``sh`` script run as ``script compiler args...``: the compiler alone when an argument is
    one of ``sources`` (CMake's Ninja rules pass them by absolute path), else ``cache``."""
    paths = dict.fromkeys(str(q) for p in sources for q in (p, p.resolve()))  # CMake may see either
    cases = "|".join(shlex.quote(p) for p in paths)
    return (
        "#!/bin/sh\n"
        "# Written by skippy: the compiles of these sources skip the compiler cache, which cannot\n"
        "# see the files they embed (.incbin, #embed); every other compile goes through the cache.\n"
        "for arg do\n"
        "    case $arg in\n"
        f'        {cases}) exec "$@" ;;\n'
        "    esac\n"
        "done\n"
        f'exec {shlex.quote(cache)} "$@"\n'
    )


def uncached_launcher(build_root: Path, cache: str, sources: Iterable[Path]) -> LauncherScript | None:
    """The launcher for a tree with ``sources`` to keep out of ``cache`` (None without any)."""
    chosen = tuple(sources)
    if not chosen:
        return None
    text = launcher_text(cache, chosen)
    name = "uncached-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return LauncherScript(path=build_root / LAUNCHER_FOLDER / name, text=text, sources=chosen)


__all__ = [
    "HEADER_SUFFIXES",
    "LAUNCHER_FOLDER",
    "SOURCE_SUFFIXES",
    "LauncherScript",
    "find_uncached_sources",
    "launcher_text",
    "uncached_launcher",
]
