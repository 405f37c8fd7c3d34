"""sh is used through its documented contract, and only by skippy.core.proc (issue 45 item 5)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROC = ROOT / "skippy" / "core" / "proc.py"


def _imports_sh(tree: ast.Module) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "sh" or name.startswith("sh.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_proc_imports_sh() -> None:
    """Every other module starts and stops processes through skippy.core.proc (spot/server.py
    imported sh itself to catch its exceptions)."""
    found = {
        str(path.relative_to(ROOT)): lines
        for path in [*ROOT.glob("skippy/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]
        if path != PROC and (lines := _imports_sh(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
    assert _imports_sh(ast.parse(PROC.read_text(encoding="utf-8"))), "the scan must see proc's own import"


def test_proc_uses_no_private_part_of_sh() -> None:
    """No ``RunningCommand.process`` (sh's OProc, documented as not for direct use), no private
    name of sh's, and sh's exceptions left on (no ``_ok_code`` that turns them off)."""
    tree = ast.parse(PROC.read_text(encoding="utf-8"))
    attributes = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    assert [a.lineno for a in attributes if a.attr == "process"] == []
    assert [
        a.lineno for a in attributes if isinstance(a.value, ast.Name) and a.value.id == "sh" and a.attr.startswith("_")
    ] == []
    keywords = {k.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords}
    assert "_ok_code" not in keywords
    assert {"_bg", "_new_session", "_env"} <= keywords, "the scan must see proc's calls into sh"
