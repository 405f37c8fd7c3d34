"""Bench section ``parse``: the parity audit's C++ reading, tree-sitter against the text scanner it replaced.

The parity audit reads llama.cpp's arch switches and tables with :mod:`skippy.maintain.cppscan`
(tree-sitter-cpp).  Before it, a hand-written text scanner did (``skippy/maintain/cscan.py``),
deleted since: this section loads it from the project's git history (the file as of the last
commit that had it) and runs both over every C and C++ source and header (``.c``, ``.cpp``,
``.h``, ``.hpp``, ``.cu``, ``.cuh`` ...) under ``src/`` and ``ggml/src/`` of the pinned commit,
read from the prepared workdir:

* ``files``, ``bytes``: what was scanned;
* each side's ``scan_s``: the median of a few rounds of scanning every file (the two sides
  alternate which runs first); cppscan parses only the files that name an ``LLM_ARCH_*``
  (``files_parsed``), so ``parse_s`` is tree-sitter's time for parsing all of them, and
  ``files_with_errors`` the files where it left ERROR or MISSING nodes (``arch_files_with_errors``:
  those of the files naming an arch, as the scan parses them, conditional groups settled);
* ``agreement``: per file of the audit's default files (``src/*.cpp``, ``src/models/*.cpp``),
  whether both sides give the same parity counts (each switch's function and each table with
  how often each arch appears), each side's totals, and every file where they differ with both
  counts.

Without the project's git history (an installed copy) or that file in it, the old side is
``skipped`` with the reason and the tree-sitter figures are still measured.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from types import ModuleType
from typing import Any, Protocol

from benchmarks.common import Timing
from skippy.core.errors import SkippyError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppparse, cppscan
from skippy.maintain.parity_config import DEFAULT_FILES, glob_match
from skippy.maintain.replay import read_text, tracked_files
from skippy.queue.archives import archive_commit
from skippy.queue.target import read_pin

#: the scanner the parity audit used before cppscan, in the project's history
OLD_SCANNER = "skippy/maintain/cscan.py"
#: the folders of the tree read, and the C/C++/CUDA sources and headers in them
FOLDERS = ("src/", "ggml/src/")
SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh"})
ROUNDS = 3


class Scan(Protocol):
    """What both scanners give for a file (``FileScan``)."""

    @property
    def switches(self) -> tuple[object, ...]: ...
    @property
    def tables(self) -> tuple[object, ...]: ...
    @property
    def case_count(self) -> int: ...
    @property
    def entry_count(self) -> int: ...
    def counts(self) -> Mapping[tuple[str, str, str], Mapping[str, int]]: ...


Scanner = Callable[[str, str], Scan]


def cxx_files(repo: Repo, commit: str) -> dict[str, str]:
    """The C/C++ sources and headers of ``FOLDERS`` at ``commit``: path -> text."""
    paths = [p for p in tracked_files(repo, commit) if p.startswith(FOLDERS) and PurePosixPath(p).suffix in SUFFIXES]
    files: dict[str, str] = {}
    for path in paths:
        text = read_text(repo, commit, path)
        if text is not None:
            files[path] = text
    return files


class _TextLoader(importlib.abc.SourceLoader):
    """A module's source from a string (a file of another commit), compiled by importlib."""

    def __init__(self, text: str, origin: str) -> None:
        self.text = text
        self.origin = origin

    def get_filename(self, fullname: str) -> str:
        return self.origin

    def get_data(self, path: str) -> bytes:
        return self.text.encode("utf-8")


def old_source(repo: Repo, path: str = OLD_SCANNER) -> tuple[str | None, str]:
    """``path``'s text as of the last commit of ``repo`` that has it (the parent of the one that
    deleted it) and that commit; or None and why not."""
    try:
        last = repo.out("log", "-1", "--format=%H", "--", path)
    except SkippyError as exc:
        return None, f"no git history to read {path} from ({exc.what})"
    if not last:
        return None, f"{path} is in no commit of the project's history"
    commit = last if repo.git("cat-file", "-e", f"{last}:{path}", check=False).ok else f"{last}^"
    sha = repo.rev_parse(commit)
    text = None if sha is None else read_text(repo, sha, path)
    return (None, f"{path} is not in {commit}") if text is None or sha is None else (text, sha)


def load_old_scanner(repo: Repo, path: str = OLD_SCANNER) -> tuple[ModuleType | None, str]:
    """The old scanner as a module (:func:`old_source`), with where it came from; or None and why not."""
    text, sha = old_source(repo, path)
    if text is None:
        return None, sha
    name = "benchmarks._old_" + PurePosixPath(path).stem
    loader = _TextLoader(text, f"{path}@{sha[:12]}")
    spec = importlib.util.spec_from_loader(name, loader)
    if spec is None:
        return None, f"{path} at {sha[:12]}: importlib made no module spec"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        loader.exec_module(module)
    except Exception as exc:  # the project's own code, but of another time
        return None, f"{path} at {sha[:12]} does not load: {type(exc).__name__}: {exc}"
    finally:
        sys.modules.pop(name, None)
    if not callable(getattr(module, "scan", None)):
        return None, f"{path} at {sha[:12]} has no scan()"
    return module, f"{path} at {sha}"


def _scan_all(scanner: Scanner, files: Mapping[str, str]) -> dict[str, Scan]:
    return {path: scanner(path, text) for path, text in files.items()}


def timings(files: Mapping[str, str], scanners: Mapping[str, Scanner], *, rounds: int = ROUNDS) -> dict[str, Timing]:
    """Seconds of scanning every file with each scanner, ``rounds`` times; the order rotates each
    round (no side always runs on the caches another warmed)."""
    samples: dict[str, list[float]] = {name: [] for name in scanners}
    names = list(scanners)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            _scan_all(scanners[name], files)
            samples[name].append(time.perf_counter() - started)
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def parse_figures(files: Mapping[str, str], *, rounds: int = ROUNDS) -> dict[str, Any]:
    """tree-sitter's parse of every file: the median seconds and the files it left errors in."""
    sources = {path: text.encode("utf-8", "replace") for path, text in files.items()}
    samples = []
    trees: dict[str, Any] = {}
    for _ in range(rounds):
        started = time.perf_counter()
        trees = {path: cppparse.parse(source) for path, source in sources.items()}
        samples.append(time.perf_counter() - started)
    errors = sorted(path for path, tree in trees.items() if cppparse.error_nodes(tree.root_node))
    return {
        "parse_s": round(Timing(tuple(samples)).median, 4),
        "files_with_errors": len(errors),
        "files_with_errors_by_folder": {folder: sum(p.startswith(folder) for p in errors) for folder in FOLDERS},
        "default_files_with_errors": [p for p in errors if _default(p)],
        # what the scan reads: the files naming an arch, their conditional groups settled
        "arch_files_with_errors": sorted(
            path
            for path, source in sources.items()
            if cppscan.ARCH_PREFIX.encode() in source
            and cppparse.error_nodes(cppscan.parse_one_branch(source).root_node)
        ),
    }


def _default(path: str) -> bool:
    return any(glob_match(path, pattern) for pattern in DEFAULT_FILES)


def _plain(counts: Mapping[tuple[str, str, str], Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``{("switch", file, "f"): {...}}`` -> ``{"switch f": {...}}`` (JSON)."""
    return {f"{kind} {scope}": dict(sorted(c.items())) for (kind, _file, scope), c in sorted(counts.items())}


def _totals(scans: Mapping[str, Scan]) -> dict[str, int]:
    return {
        "switches": sum(len(s.switches) for s in scans.values()),
        "cases": sum(s.case_count for s in scans.values()),
        "tables": sum(len(s.tables) for s in scans.values()),
        "entries": sum(s.entry_count for s in scans.values()),
    }


def agreement(new: Mapping[str, Scan], old: Mapping[str, Scan]) -> dict[str, Any]:
    """Per default file: the same parity counts on both sides?  Every file where not, with both."""
    paths = sorted(p for p in new if _default(p))
    differ = [
        {"file": p, "cppscan": _plain(new[p].counts()), "old": _plain(old[p].counts())}
        for p in paths
        if _plain(new[p].counts()) != _plain(old[p].counts())
    ]
    return {
        "default_files": len(paths),
        "agree": not differ,
        "disagreeing": differ,
        "cppscan": _totals({p: new[p] for p in paths}),
        "old": _totals({p: old[p] for p in paths}),
    }


def bench_parse(settings: Settings, console: Console, *, rounds: int = ROUNDS) -> dict[str, Any]:
    if not (settings.workdir / ".git").exists():
        return {"skipped": f"no workdir at {settings.relative(settings.workdir)}: run `invoke prepare --pinned` first"}
    workdir = Repo(settings.workdir, settings.env)
    pin = read_pin(settings)
    commit = pin if workdir.has_commit(pin) else archive_commit(workdir, pin)
    if commit is None:
        return {"skipped": f"the workdir has no commit for the pin {pin[:12]}: run `invoke prepare --pinned` first"}
    files = cxx_files(workdir, commit)
    size = sum(len(text.encode("utf-8", "replace")) for text in files.values())
    old, source = load_old_scanner(Repo(settings.root, settings.env))
    scanners: dict[str, Scanner] = {"cppscan": cppscan.scan}
    if old is not None:
        scanners["old"] = old.scan
    console.info(f"bench: {len(files)} C/C++ files of {' and '.join(FOLDERS)} at the pin, {rounds} rounds")
    times = timings(files, scanners, rounds=rounds)
    new_scans = _scan_all(cppscan.scan, files)
    section: dict[str, Any] = {
        "pin": pin,
        "files": len(files),
        "bytes": size,
        "rounds": rounds,
        "tree_sitter": {
            "version": _version("tree-sitter") + " + tree-sitter-cpp " + _version("tree-sitter-cpp"),
            "scan_s": round(times["cppscan"].median, 4),
            "files_parsed": sum(cppscan.ARCH_PREFIX in text for text in files.values()),
            **parse_figures(files, rounds=rounds),
        },
    }
    if old is None:
        section["old"] = {"skipped": source}
        section["agreement"] = {"skipped": source}
    else:
        section["old"] = {"source": source, "scan_s": round(times["old"].median, 4)}
        section["agreement"] = agreement(new_scans, _scan_all(old.scan, files))
    console.info(summary(section))
    return section


def summary(section: Mapping[str, Any]) -> str:
    ts, old, agree = section["tree_sitter"], section["old"], section["agreement"]
    head = (
        f"parse of {section['files']} C/C++ files ({section['bytes'] / 1e6:.1f} MB): cppscan {ts['scan_s']:.3f} s "
        f"({ts['files_parsed']} files naming an arch parsed; tree-sitter parses all in {ts['parse_s']:.3f} s, "
        f"{ts['files_with_errors']} file(s) with errors)"
    )
    if "skipped" in old:
        return f"{head}; old scanner: {old['skipped']}"
    told = (
        "the same counts"
        if agree["agree"]
        else f"DIFFERENT counts in {', '.join(d['file'] for d in agree['disagreeing'])}"
    )
    return f"{head}; old text scanner {old['scan_s']:.3f} s; on the {agree['default_files']} default files {told}"


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"
