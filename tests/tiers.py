"""How ``nox -s tests`` runs pytest: the fast tiers (unit and integration) in one process per
core, the e2e tier in one process (its builds take every core), whatever pytest arguments are
given after ``--``.

The arguments go to both runs; a ``-m`` of the user's is combined with each tier's (``(EXPR)
and not e2e``, ``(EXPR) and e2e``).  A run that can select nothing is left out: the e2e run when
the marker expression is false for every e2e test (``-m 'not e2e'``) or every path given lies
outside ``tests/e2e``, the fast run likewise.  Where both runs are made from arguments, each may
find no test (a ``-k`` that matches one tier only): pytest's "no tests collected" (exit code 5)
then passes.  The user who asks for another layout gets exactly their arguments, in one run:
``-n``/``--numprocesses`` (``-n 0``: serial) or ``-p no:xdist``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: the marker every test under tests/e2e carries (tests/e2e/conftest.py)
E2E: Final = "e2e"
#: pytest's exit code when it selected no test
NO_TESTS: Final = 5
#: pytest-xdist: one worker per core
PARALLEL: Final = ("--numprocesses", "auto")
#: options after which the next argument is their value, never a path to collect
_WITH_VALUE: Final = frozenset(
    {
        *("-k", "-m", "-p", "-c", "-o", "-W", "-r", "--rootdir", "--basetemp", "--junitxml", "--junit-xml"),
        *("--confcutdir", "--deselect", "--ignore", "--ignore-glob", "--timeout", "--durations", "--maxfail"),
        *("--override-ini", "--tb", "--log-level", "--log-file", "--log-cli-level", "--color", "--capture"),
        *("--import-mode", "--pythonwarnings", "--config-file", "--durations-min", "--timeout-method"),
        *("--dist", "--max-worker-restart", "--tx", "--rsyncdir", "--maxprocesses"),
    }
)
_TOKEN: Final = re.compile(r"\(|\)|[^\s()]+")
#: a marker expression, compiled: the names' truth -> the expression's
_Node = Callable[[Callable[[str], bool]], bool]


@dataclass(frozen=True)
class PytestRun:
    """One pytest process: its arguments, and the exit codes that count as passed."""

    args: tuple[str, ...]
    ok_codes: tuple[int, ...] = (0,)


def asks_for_own_layout(args: Sequence[str]) -> bool:
    """The user chose the processes themselves: ``-n N``, ``--numprocesses N`` or ``-p no:xdist``."""
    for i, arg in enumerate(args):
        if arg.startswith(("-n", "--numprocesses")):
            return True
        if arg == "-p" and i + 1 < len(args):
            plugin = args[i + 1]
        elif arg.startswith("-p"):
            plugin = arg[2:]
        else:
            continue
        if plugin.strip() == "no:xdist":
            return True
    return False


def _split_marks(args: Sequence[str]) -> tuple[list[str], str | None]:
    """The arguments without their ``-m``, and the last marker expression given (pytest takes the last)."""
    rest: list[str] = []
    mark: str | None = None
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "-m" and i + 1 < len(args):
            mark, skip = args[i + 1], True
        elif arg.startswith("-m") and not arg.startswith("--"):
            mark = arg[2:].removeprefix("=")
        else:
            rest.append(arg)
    return rest, mark


def _paths(args: Sequence[str], root: Path) -> list[Path]:
    """The paths (files, folders, node ids) given to collect, made absolute."""
    found: list[Path] = []
    value = False
    for arg in args:
        if value:
            value = False
            continue
        if arg.startswith("-"):
            value = arg in _WITH_VALUE
            continue
        candidate = Path(arg.split("::", 1)[0])
        candidate = candidate if candidate.is_absolute() else root / candidate
        if candidate.exists():
            found.append(candidate.resolve())
    return found


class _Parser:
    """A marker expression (``not``, ``and``, ``or``, parentheses, names), read by recursive descent."""

    def __init__(self, expression: str) -> None:
        self.words: list[str] = _TOKEN.findall(expression)
        self.pos = 0

    def peek(self) -> str | None:
        return self.words[self.pos] if self.pos < len(self.words) else None

    def take(self) -> str:
        if self.pos >= len(self.words):
            raise ValueError("unexpected end")
        self.pos += 1
        return self.words[self.pos - 1]

    def either(self) -> _Node:
        parts = [self.both()]
        while self.peek() == "or":
            self.take()
            parts.append(self.both())
        return lambda truth: any(p(truth) for p in parts)

    def both(self) -> _Node:
        parts = [self.single()]
        while self.peek() == "and":
            self.take()
            parts.append(self.single())
        return lambda truth: all(p(truth) for p in parts)

    def single(self) -> _Node:
        word = self.take()
        if word == "not":
            inner = self.single()
            return lambda truth: not inner(truth)
        if word == "(":
            inner = self.either()
            if self.take() != ")":
                raise ValueError("unbalanced parentheses")
            return inner
        if word in ("and", "or", ")") or "=" in word:
            raise ValueError(f"unexpected {word!r}")
        return lambda truth: truth(word)


def _evaluator(expression: str) -> _Node | None:
    """``expression`` as a function of the names' truth; None for anything else (keyword
    arguments: the caller then prunes nothing)."""
    parser = _Parser(expression)
    try:
        tree = parser.either()
    except ValueError:
        return None
    return tree if parser.pos == len(parser.words) else None


def _may_select(expression: str | None, e2e: bool) -> bool:
    """Whether ``expression`` can hold for a test that is (``e2e``) or is not an e2e test."""
    if expression is None:
        return True
    tree = _evaluator(expression)
    names = sorted({t for t in _TOKEN.findall(expression) if t not in ("(", ")", "and", "or", "not", E2E)})
    if tree is None or len(names) > 12:
        return True
    for values in itertools.product((False, True), repeat=len(names)):
        truth = dict(zip(names, values, strict=True)) | {E2E: e2e}
        if tree(truth.__getitem__):
            return True
    return False


def pytest_runs(args: Sequence[str], root: Path) -> list[PytestRun]:
    """The pytest processes ``nox -s tests -- ARGS`` runs, in order (see the module's docstring)."""
    if asks_for_own_layout(args):
        return [PytestRun(tuple(args))]
    rest, mark = _split_marks(args)
    e2e_dir = (root / "tests" / E2E).resolve()
    paths = _paths(rest, root)
    fast = _may_select(mark, e2e=False) and (not paths or any(not p.is_relative_to(e2e_dir) for p in paths))
    slow = _may_select(mark, e2e=True) and (
        not paths or any(p.is_relative_to(e2e_dir) or e2e_dir.is_relative_to(p) for p in paths)
    )
    if fast and not slow:
        return [PytestRun((*rest, "-m", mark or f"not {E2E}", *PARALLEL))]
    if slow and not fast:
        return [PytestRun((*rest, "-m", mark or E2E))]
    if not fast and not slow:
        return [PytestRun(tuple(args))]  # pytest itself says that nothing matches
    ok = (0,) if not args else (0, NO_TESTS)
    return [
        PytestRun((*rest, "-m", f"({mark}) and not {E2E}" if mark else f"not {E2E}", *PARALLEL), ok),
        PytestRun((*rest, "-m", f"({mark}) and {E2E}" if mark else E2E), ok),
    ]
