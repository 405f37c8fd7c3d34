"""Bench section ``shared-objects``: what the CPU and the Vulkan build of one tree share.

A compiler cache serves an object to a second build dir when the compile line (its
arguments, the build dir's path aside) and the preprocessed source are the same.  This
section configures a CPU and a Vulkan build dir of the prepared tree (the queue's patch
0005 on) and, as the raw yardstick in the same run, of the unpatched upstream pin (plain
``git archive`` of the workdir's base commit), and compares the compile lines of
``compile_commands.json``:

* ``shared``: the same line in both dirs (one compile serves both);
* ``only_backend_use``: lines that differ only in ``-DGGML_USE_<backend>`` (upstream makes
  it a public definition of ggml, so llama, common and the tools carry it though they never
  read it: compiled once per backend);
* ``other``: lines that differ in something else;
* ``backend_own``: lines the Vulkan dir has and the CPU dir does not (its backend).

Configure only (seconds): what the lines say, not a build.  The live figure (the misses of a
Vulkan build after a CPU build of the same tree) is in docs/building.md.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from benchmarks.bench_builds import build_backend
from benchmarks.bench_proofs import _quiet, machine_settings, share_downloads
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.queue.prepare import Target, prepare

_BACKEND_USE: Final = re.compile(r"\s-DGGML_USE_[A-Z0-9_]+(?=\s)")
#: the backend compared with the CPU build
OTHER_BACKEND: Final = "vulkan"


def compile_lines(build_dir: Path, source_dir: Path) -> dict[str, str]:
    """{source relative to the tree: its compile line, the build dir's path written ``<build>``}."""
    out: dict[str, str] = {}
    for entry in json.loads((build_dir / "compile_commands.json").read_text(encoding="utf-8")):
        command = entry.get("command") or " ".join(entry.get("arguments", ()))
        file = Path(entry["file"])
        key = file.relative_to(source_dir).as_posix() if file.is_relative_to(source_dir) else str(file)
        out[key.replace(str(build_dir), "<build>")] = f" {command} ".replace(str(build_dir), "<build>")
    return out


def compare_lines(cpu: Mapping[str, str], other: Mapping[str, str]) -> dict[str, Any]:
    """How the compile lines of two build dirs of one tree relate (see the module's docstring)."""
    both = set(cpu) & set(other)
    shared = sum(1 for f in both if cpu[f] == other[f])
    only_use = sorted(
        f for f in both if cpu[f] != other[f] and _BACKEND_USE.sub("", cpu[f]) == _BACKEND_USE.sub("", other[f])
    )
    return {
        "shared": shared,
        "only_backend_use": len(only_use),
        "other": len(both) - shared - len(only_use),
        "backend_own": len(set(other) - set(cpu)),
        "cpu_lines": len(cpu),
        # the names, when they are few (with the queue: ggml's own and the sources that read them)
        **({"only_backend_use_files": only_use} if len(only_use) <= 20 else {}),
    }


def reads_backend_use(source_dir: Path, rel: str) -> bool:
    """Whether a source needs its backends' definitions: ggml's own, or one that tests one."""
    text = (source_dir / rel).read_text(encoding="utf-8", errors="replace")
    return rel.startswith("ggml/") or re.search(r"\bGGML_USE_[A-Z0-9_]+\b", text) is not None


def _unpatched(workdir: Path, base_commit: str, into: Path) -> None:
    """The upstream pin as it is (the workdir's base commit), written out with git archive."""
    data = subprocess.run(["git", "-C", str(workdir), "archive", base_commit], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")


def bench_shared_objects(settings: Settings, console: Console) -> dict[str, Any]:
    prepare(settings, Target.pinned(), console=_quiet())
    stamp = wd.read_stamp(settings.workdir / ".git")
    assert stamp is not None, "prepare leaves a stamp"
    root = settings.cache_dir.parent / "bench" / "shared-objects"
    shutil.rmtree(root, ignore_errors=True)
    machine = machine_settings(settings, root, "a")
    share_downloads(settings, machine)
    upstream = root / "upstream" / "llama.cpp"
    _unpatched(settings.workdir, stamp.base_commit, upstream)
    figures: dict[str, Any] = {}
    for label, source, sha in (
        ("patched", settings.workdir, stamp.patched_sha),
        ("unpatched", upstream, stamp.upstream_sha),
    ):
        dirs = {
            backend: build_backend(
                backend, machine, _quiet(), source_dir=source, patched_sha=sha, build=False, stop=True
            ).build_dir
            for backend in ("cpu", OTHER_BACKEND)
        }
        figures[label] = compare_lines(compile_lines(dirs["cpu"], source), compile_lines(dirs[OTHER_BACKEND], source))
    patched, unpatched = figures["patched"], figures["unpatched"]
    # met: with the queue, the lines that still differ are those of sources that read a backend
    readers = [rel for rel in patched.get("only_backend_use_files", ["?"]) if reads_backend_use(settings.workdir, rel)]
    figures["met"] = patched["other"] == 0 and len(readers) == patched["only_backend_use"]
    console.info(
        f"CPU and {OTHER_BACKEND} build dirs of one tree: {patched['shared']} of {patched['cpu_lines']} compile lines "
        f"shared with the queue ({patched['only_backend_use']} differ only in GGML_USE_*), "
        f"{unpatched['shared']} of {unpatched['cpu_lines']} on the unpatched pin "
        f"({unpatched['only_backend_use']} differ only in GGML_USE_*)"
    )
    shutil.rmtree(root, ignore_errors=True)
    return figures
