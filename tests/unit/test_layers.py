"""The layers hold: each subpackage imports only from below (pyproject.toml [tool.importlinter])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    tool = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert tool is not None, "import-linter is a test dependency: pip install -e '.[test]'"
    result = subprocess.run([tool], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_tree_shows_the_layers() -> None:
    packages = {p.name for p in (ROOT / "skippy").iterdir() if (p / "__init__.py").is_file()}
    assert {"core", "queue", "maintain", "build", "check", "flows", "cli"} <= packages
    flat = sorted(p.name for p in (ROOT / "skippy").glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules outside the layers: {flat}"
