"""Every kind of generated block by name, and the generator's run: make every block of README.md
and docs/ again, or (``--check``) name the stale ones, or (``--record-build``) record the build's
endings first."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from skippy.cli.exitcodes import render_exit_codes
from skippy.compile.backends import registry
from tooling.docs.bench import BENCH_JSON, bench_from_file
from tooling.docs.blocks import COMMAND, DocsError, Renderer, cell, changed_blocks, doc_files, rewrite
from tooling.docs.ending import BUILD_JSON, SessionRun, build_cpu_runner, record, recording, render_build_ending
from tooling.docs.reference import render_backends, render_options, render_settings
from tooling.docs.rooms import render_modules, render_rooms


def render_blocks(_root: Path) -> str:
    """The kinds of generated block themselves."""
    lines = ["| name | made from |", "| --- | --- |"]
    lines += [f"| `{r.name}` | {cell(r.source)} |" for r in RENDERERS.values()]
    return "\n".join(lines)


#: every kind of generated block, by the name its markers carry
RENDERERS: Final[Mapping[str, Renderer]] = {
    r.name: r
    for r in (
        Renderer("options", "skippy/cli/commands.py", render_options),
        Renderer("settings", "skippy/core/specs.py", render_settings),
        Renderer("exit-codes", "skippy/core/errors.py", render_exit_codes),
        Renderer("backends", "skippy.compile.backends.registry()", lambda _root: render_backends(registry())),
        Renderer("bench", BENCH_JSON, bench_from_file),
        Renderer("build-ending", BUILD_JSON, lambda root: render_build_ending(recording(root), "fresh")),
        Renderer("build-ending-kept", BUILD_JSON, lambda root: render_build_ending(recording(root), "kept")),
        Renderer("rooms", "the packages' docstrings and pyproject.toml's layers", render_rooms),
        Renderer("modules", "the docstrings of skippy/*/, benchmarks/ and tooling/", render_modules),
        Renderer("blocks", "tooling/docs/generate.py", render_blocks),
    )
}


def stale(root: Path) -> list[str]:
    """``file: block`` for every generated block that differs from what its renderer makes now."""
    out = []
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        fresh = rewrite(text, root, where=str(path.relative_to(root)), renderers=RENDERERS)
        out += [f"{path.relative_to(root)}: {name}" for name in changed_blocks(text, fresh)]
    return out


def write_all(root: Path) -> list[str]:
    """Rewrite every file's blocks (none when one cannot be made); the files changed."""
    made = {}
    for path in doc_files(root):  # every block made before any file is written
        text = path.read_text(encoding="utf-8")
        fresh = rewrite(text, root, where=str(path.relative_to(root)), renderers=RENDERERS)
        if fresh != text:
            made[path] = fresh
    for path, fresh in made.items():
        path.write_text(fresh, encoding="utf-8")
    return [str(path.relative_to(root)) for path in made]


def _check(root: Path) -> int:
    found = stale(root)
    for line in found:
        print(f"stale: {line}", file=sys.stderr)
    if found:
        print(f"run `{COMMAND}` to make them again", file=sys.stderr)
    return 1 if found else 0


def main(argv: Sequence[str], root: Path, *, run: SessionRun | None = None) -> int:
    """``--check``, ``--record-build`` (``run`` replaces the real session in tests), or every block made again."""
    try:
        if "--record-build" in argv:
            env = dict(os.environ)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record(root, run or build_cpu_runner(root, env), now=now, home=env.get("HOME"))
        if "--check" in argv:
            return _check(root)
        for name in write_all(root):
            print(f"rewrote {name}", file=sys.stderr)
    except DocsError as exc:
        print(f"error: {exc}; no file was written", file=sys.stderr)
        return 2
    return 0
