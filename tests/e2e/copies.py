"""A copy of this project for an e2e test: its pyproject, tasks, noxfile and queue in a folder of
``.deps/e2e/`` (kept between runs for its workdir and build dirs; the rest replaced each run).

The copy keeps its queue in ``queue/`` rather than ``skippy/llama_cpp`` (a folder named ``skippy``
beside its noxfile would shadow the installed package) and shares the project's cache dir: the
pinned archive, the default model and the compiler cache.  (No tests here.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_project(dest: Path, *, pyproject_tail: str = "", replace: tuple[str, ...] = ()) -> Path:
    """The copy at ``dest``: ``pyproject_tail`` appended to its pyproject.toml; the folders or files
    named in ``replace`` removed too (a previous run's extras).  Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("queue", "pyproject.toml", "tasks.py", "noxfile.py", *replace):
        path = dest / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for name in ("tasks.py", "noxfile.py"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "skippy" / "llama_cpp", dest / "queue")
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    cache = ROOT / ".deps" / "cache"
    for old, new in {
        'pin_file = "skippy/llama_cpp/upstream.txt"': 'pin_file = "queue/upstream.txt"',
        'patch_dir = "skippy/llama_cpp/patches"': f'patch_dir = "queue/patches"\ncache_dir = "{cache}"',
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    (dest / "pyproject.toml").write_text(text + pyproject_tail, encoding="utf-8")
    return dest
