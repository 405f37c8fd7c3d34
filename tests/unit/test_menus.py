"""What `nox -l` shows: the noxfile's docstring (addressed to its users) and the first line of
each session's docstring (nox cuts the rest: that line must be whole)."""

from __future__ import annotations

import ast
from pathlib import Path

NOXFILE = Path(__file__).resolve().parents[2] / "noxfile.py"


def test_the_noxfile_docstring_tells_users_where_to_go() -> None:
    doc = ast.get_docstring(ast.parse(NOXFILE.read_text(encoding="utf-8"))) or ""
    assert "nox -s build-<backend>" in doc
    assert "nox -s build-cpu -- --help" in doc
    assert "invoke --list" in doc
    assert "library" not in doc  # how the noxfile is written is a comment, not the menu's heading


def test_each_session_heading_is_a_whole_sentence() -> None:
    tree = ast.parse(NOXFILE.read_text(encoding="utf-8"))
    sessions = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any("session" in ast.unparse(d) for d in node.decorator_list)
    ]
    assert {s.name for s in sessions} >= {"lint", "tests", "spot_check", "bench"}
    for session in sessions:
        first = (ast.get_docstring(session) or "").splitlines()[0]
        assert first.endswith("."), f"{session.name}: nox -l shows only {first!r}"
