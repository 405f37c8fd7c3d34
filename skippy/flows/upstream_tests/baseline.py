"""The baseline: the failing tests run on the pin (with the queue's build-only patches where they
apply), their results kept per upstream commit under the cache dir."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from skippy.compile.builder import execute_plan
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.flows.upstream_tests import ctest
from skippy.flows.upstream_tests.aside import AsideTree, QueueCommit
from skippy.flows.upstream_tests.tree import _Tree

#: the files a build-only patch changes: how the tree is built (its compile lines), not what it computes
_BUILD_FILE: Final = re.compile(r"(?:^|/)(?:CMakeLists\.txt|[^/]+\.cmake)$")


def build_only(repo: Repo, commits: Iterable[QueueCommit]) -> tuple[QueueCommit, ...]:
    """The prepared commits that change CMake files and nothing else (CMakeLists.txt, ``*.cmake``)."""
    found: list[QueueCommit] = []
    for commit in commits:
        names = repo.out("diff-tree", "--no-commit-id", "--name-only", "-r", commit.sha).splitlines()
        if names and all(_BUILD_FILE.search(name) for name in names):
            found.append(commit)
    return tuple(found)


class _Baseline:
    """Tests on the pin, in the tree beside the workdir, kept per upstream commit.

    With the queue's build-only patches on the pin (when they apply there), the pin's objects
    are the prepared tree's: only the queue moves what a compile line carries (the build
    commit, a backend's ``GGML_USE_*``), so the compiler cache serves libllama and common
    instead of a cold build of a second variant of them.  A test that fails there is run on
    the bare pin before it is called red upstream.
    """

    def __init__(self, tree: _Tree, aside: AsideTree, base: str, own: Sequence[str]) -> None:
        self.tree, self.aside, self.base, self.own = tree, aside, base, own
        #: the build-only patches the last run applied (none when they did not apply)
        self.applied: tuple[QueueCommit, ...] = ()
        #: what each run said, for the report
        self.said: list[str] = []

    def results(self, names: Sequence[str], patches: Sequence[QueueCommit]) -> dict[str, ctest.Result]:
        tree, sha = self.tree, self.tree.upstream_sha
        source = self.aside.at(self.base)
        key = self.aside.apply([c.sha for c in patches]) if patches else None
        if patches and key is None:
            tree.console.info("the queue's build-only patches do not apply to the bare pin: its baseline is bare")
        self.applied = tuple(patches) if key else ()
        tests = tree.plan(source, self.base, None, aside=True, own_dir=True)
        plan = tests.plan
        digest = f"{plan.digest[:16]}-{key[:12]}" if key else plan.digest
        cache_file = _baseline_file(tree.settings, tree.backend, sha, digest)
        on = f"upstream {sha[:12]}" + (
            f" with the queue's build-only patches ({', '.join(c.label for c in self.applied)})" if self.applied else ""
        )
        known = _read_baseline(cache_file)
        missing = [n for n in names if n not in known]
        if not missing:
            self.said.append(f"cached ({on})")
            return {n: known[n] for n in names}
        start = time.monotonic()
        with tree.console.step(f"baseline: {len(missing)} failing tests on {on}"):
            execute_plan(plan, tree.console, build=False)
            _, run, _ = tree.build_and_run(tests, missing, self.own)
        for name in missing:
            known[name] = run.by_name().get(name) or ctest.Result(name, "not run", 0.0, "no such test upstream")
        _write_baseline(cache_file, sha, known)
        self.said.append(f"run ({len(missing)} tests on {on}, {time.monotonic() - start:.0f} s)")
        return {n: known[n] for n in names}


def _baseline_file(settings: Settings, backend: str, upstream_sha: str, digest: str) -> Path:
    return settings.cache_dir / "upstream-tests" / f"baseline-{upstream_sha[:12]}-{backend}-{digest}.json"


def _read_baseline(path: Path) -> dict[str, ctest.Result]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            name: ctest.Result(
                name=name, verdict=r["verdict"], seconds=float(r["seconds"]), output=str(r.get("output", ""))
            )
            for name, r in data["results"].items()
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_baseline(path: Path, upstream_sha: str, results: Mapping[str, ctest.Result]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    payload = {"upstream_sha": upstream_sha, "results": {n: r.as_dict() for n, r in sorted(results.items())}}
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
