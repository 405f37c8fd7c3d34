"""Every failure has a class of its own in skippy.core.errors, a code of its own, a row in the
documented table, and its words given where it is raised (never edited afterwards)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import skippy
from skippy.cli import exitcodes
from skippy.cli.exitcodes import error_classes, render_exit_codes
from skippy.core import errors
from skippy.core.errors import CommandError, ConflictError, QueueError, SkippyError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "skippy"
#: the page that explains the errors and shows the table
ERRORS_PAGE = ROOT / "docs" / "housekeeping.md"
#: what an error says and carries, and its exit code, which only its raise site may set
WORDS = frozenset(
    {"what", "next_step", "untouched", "details", "annotations", "exit_code", "triage", "report", "ending", "carried"}
)


def all_subclasses(cls: type[SkippyError]) -> Iterator[type[SkippyError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from all_subclasses(sub)


@pytest.fixture(scope="module")
def every_class() -> list[type[SkippyError]]:
    """Every SkippyError subclass any module of the package defines (each module imported)."""
    for module in pkgutil.walk_packages(skippy.__path__, "skippy."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    return sorted(set(all_subclasses(SkippyError)), key=lambda cls: cls.__qualname__)


def test_every_error_class_lives_in_errors_py_and_says_what_it_is(every_class: list[type[SkippyError]]) -> None:
    outside = [f"{cls.__module__}.{cls.__qualname__}" for cls in every_class if cls.__module__ != errors.__name__]
    assert outside == [], "define the error class in skippy/core/errors.py"
    assert every_class == sorted(error_classes(), key=lambda cls: cls.__qualname__)
    assert [cls.__name__ for cls in every_class if not exitcodes.meaning(cls)] == []


def test_each_class_has_an_exit_code_of_its_own(every_class: list[type[SkippyError]]) -> None:
    codes: dict[int, list[str]] = {}
    base: list[type[SkippyError]] = [SkippyError]
    for cls in [*base, *every_class]:
        codes.setdefault(cls.exit_code, []).append(cls.__name__)
    assert {code: names for code, names in codes.items() if len(names) > 1} == {}
    # a shell's own codes are not taken: 0 is success, 126 and 127 a command that cannot run
    assert not {0, 126, 127} & set(codes)
    assert all(0 < code < 256 for code in codes)


def test_the_codes_scripts_rely_on_stay() -> None:
    stable = {
        "SettingsError": 2,
        "QueueError": 3,
        "CommandError": 4,
        "NetworkError": 5,
        "DirtyWorkdirError": 6,
        "ConflictError": 7,
        "LockBusyError": 8,
        "WorkdirError": 9,
        "ArchiveError": 10,
        "ToolchainMissing": 11,
        "BuildError": 12,
        "SpotCheckFailed": 13,
        "CIError": 14,
        "UpstreamTestsFailed": 15,
        "CarriedUpstream": 16,
        "InternalError": 70,
        "Interrupted": 130,
    }
    assert {name: getattr(errors, name).exit_code for name in stable} == stable


def test_every_code_is_in_the_documented_table(every_class: list[type[SkippyError]]) -> None:
    table = render_exit_codes(ROOT)
    for cls in every_class:
        assert f"| {cls.exit_code} | `{cls.__name__}`" in table, cls
    page = ERRORS_PAGE.read_text(encoding="utf-8")
    assert table in page, "run `python -m tooling.docs`"


def test_the_table_reads_each_class_once_in_code_order() -> None:
    table = render_exit_codes(ROOT, [QueueError, ConflictError])
    assert table.splitlines()[2:] == [
        f"| 0 | - | {exitcodes.SUCCESS} |",
        "| 3 | `QueueError` | The patch queue is invalid or cannot be read or written (its files, lanes, regenerate, "
        "generate). |",
        "| 7 | `ConflictError` | The queue does not apply: a patch conflicts (triaged when the triage ran). |",
    ]


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_base_class_cannot_be_made() -> None:
    with pytest.raises(TypeError, match="raise the class of that failure"):
        SkippyError("what happened")
    assert QueueError("what happened").exit_code == 3


def test_no_module_raises_the_base_class_itself() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name == "SkippyError":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "raise the error class of that failure (skippy/core/errors.py), not SkippyError"


def _error_names(tree: ast.AST, classes: frozenset[str]) -> Iterator[tuple[ast.AST, set[str]]]:
    """Each function (and the module) with the names in it bound to an error: an ``except ... as``
    name, a name assigned an error class's call, or a parameter annotated with an error class."""
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        names: set[str] = set()
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]
            names |= {a.arg for a in params if a.annotation is not None and ast.unparse(a.annotation) in classes}
        for node in ast.walk(scope):
            if isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if called in classes:
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        yield scope, names


def _edits(source: str, classes: frozenset[str]) -> list[str]:
    """``name.what = ...`` (or another of :data:`WORDS`) on a name bound to an error."""
    tree = ast.parse(source)
    found = []
    for scope, names in _error_names(tree, classes):
        for node in ast.walk(scope):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for attr in ast.walk(target):
                    if (
                        isinstance(attr, ast.Attribute)
                        and attr.attr in WORDS
                        and isinstance(attr.value, ast.Name)
                        and attr.value.id in names
                    ):
                        found.append(f"{attr.lineno}: {ast.unparse(attr)}")
    return sorted(set(found))


def test_the_scan_finds_an_edit_of_a_caught_or_built_error() -> None:
    source = """
def caught():
    try:
        pass
    except QueueError as exc:
        exc.next_step = exc.next_step.replace("a", "b")
        raise

def built():
    error = QueueError("x")
    error.what, error.untouched = "y", "z"
    error.exit_code = 143
    return error

def not_an_error(result):
    result.next_step = "fine: a report's field"

def given(exc: QueueError) -> None:
    exc.details = "more"
"""
    assert _edits(source, frozenset({"QueueError"})) == [
        "11: error.untouched",
        "11: error.what",
        "12: error.exit_code",
        "19: exc.details",
        "6: exc.next_step",
    ]


def test_no_error_is_edited_after_it_was_made(every_class: list[type[SkippyError]]) -> None:
    classes = frozenset(cls.__name__ for cls in every_class) | {"SkippyError"}
    found = []
    for path in _sources():
        found += [f"{path.relative_to(ROOT)}:{edit}" for edit in _edits(path.read_text(encoding="utf-8"), classes)]
    assert found == [], "give the words where the error is raised, or raise a new one from it (restated)"


def test_restated_is_a_new_error_of_the_same_class_and_payload() -> None:
    first = CommandError("git am failed", argv=("git", "am"), returncode=1, output_tail="fatal: x", next_step="a")
    again = first.restated(untouched="the queue, restored")
    assert type(again) is CommandError and again is not first
    assert (again.what, again.untouched, again.next_step, again.argv) == (
        "git am failed",
        "the queue, restored",
        "a",
        first.argv,
    )
    assert first.untouched is None and again.details == first.details
