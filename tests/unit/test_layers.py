"""The layers hold: each subpackage imports only from below (pyproject.toml [tool.importlinter]);
the benchmarks and the tooling sit beside the package, unshipped, and every room says what it holds."""

from __future__ import annotations

import ast
import fnmatch
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tooling.docs.rooms import NO_DOCSTRING, render_rooms

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    tool = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert tool is not None, "import-linter is a test dependency: pip install -e '.[test]'"
    result = subprocess.run([tool], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_tree_shows_the_layers() -> None:
    packages = {p.name for p in (ROOT / "skippy").iterdir() if (p / "__init__.py").is_file()}
    assert {"core", "queue", "maintain", "compile", "spot", "flows", "cli"} <= packages
    flat = sorted(p.name for p in (ROOT / "skippy").glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules outside the layers: {flat}"


def test_the_benchmarks_and_the_tooling_sit_beside_the_package_unshipped() -> None:
    """Not in the wheel (``[tool.setuptools.packages.find]``), checked by import-linter, and never
    imported by the product (a forbidden contract each); their modules need no layer of their own."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = config["tool"]["setuptools"]["packages"]["find"]["include"]
    linter = config["tool"]["importlinter"]
    never = {
        module
        for c in linter["contracts"]
        if c["type"] == "forbidden" and c["source_modules"] == ["skippy"]
        for module in c["forbidden_modules"]
    }
    for folder in ("benchmarks", "tooling"):
        assert (ROOT / folder / "__init__.py").is_file()
        assert not any(fnmatch.fnmatch(folder, pattern) for pattern in shipped), f"{folder} would ship"
        assert folder in linter["root_packages"] and folder in never
        assert folder in config["tool"]["mypy"]["files"]


def test_every_room_says_what_it_holds() -> None:
    """Each package's ``__init__.py`` docstring is its row of docs/architecture.md's rooms."""
    rooms = render_rooms(ROOT)
    assert [line.split(" | ")[0] for line in rooms.splitlines() if NO_DOCSTRING in line] == []
    assert "| `tooling` |" in rooms and "| `skippy.compile.backends` |" in rooms


def test_inside_the_build_the_backends_sit_over_the_roots() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (inner,) = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers") == ["skippy.compile"]]
    layers = [layer.strip() for layer in inner["layers"]]
    # each above the next: the plan over the backends, the backends over the fetch-once helper and the root file systems
    assert layers.index("plan") < layers.index("backends") < layers.index("fetched") < layers.index("rootfs")


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_no_build_module_re_exports_another_modules_names() -> None:
    """Every name is imported from the module that defines it: no facade (``__all__`` lists only
    the module's own names, and nothing imports a name through a module that merely imported it)."""
    modules: dict[str, set[str]] = {}
    for path in (ROOT / "skippy" / "compile").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = _defined(tree)
        modules[name] = own
        listed = [
            str(e.value)
            for node in tree.body
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            for e in getattr(node.value, "elts", [])
            if isinstance(e, ast.Constant)
        ]
        assert [n for n in listed if n not in own] == [], f"{name} re-exports"
    for path in [*ROOT.glob("skippy/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                through = [
                    a.name
                    for a in node.names
                    if a.name not in modules[node.module] and f"{node.module}.{a.name}" not in modules
                ]
                assert through == [], f"{path.relative_to(ROOT)}: {through} imported through {node.module}"
