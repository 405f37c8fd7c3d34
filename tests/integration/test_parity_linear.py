"""The parity audit walks the queue once (issue 42): a map of who added each line, carried from patch
to patch, instead of a ``git blame`` of the whole queue so far for every patch.

On real git: the audit of a fixture queue runs the same git commands for every patch whatever the
queue's length (no blame, no command that walks history), and the map says what ``git blame
<pin>..<patch>`` says at every step of a queue that edits, rewrites, renames, deletes and re-adds.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from skippy.core import proc
from skippy.core.git import Repo
from skippy.maintain import linemap, parity, parity_report
from skippy.maintain.replay import Replay
from skippy.queue.model import Lane, Patch
from tests.gitfixtures import Upstream, git
from tests.integration.test_parity_fixtures import ARCH_SRC, MODEL_SRC, MODELS

pytestmark = pytest.mark.integration

CONFIG = parity.ParityConfig(parity.DEFAULT_FILES, Path("parity-allowlist.toml"))
HOOKS_AT = "    return res;\n"


@dataclass(frozen=True)
class Recording(Repo):
    """A repository that records the arguments of every git command run in it."""

    calls: list[tuple[str, ...]] = field(default_factory=list, compare=False, repr=False)

    def git(self, *args: str | Path, **kwargs: Any) -> proc.Result:
        self.calls.append(tuple(str(a) for a in args))
        return super().git(*args, **kwargs)


def label(index: int, slug: str) -> str:
    return f"core/{index:04d}-{slug}.patch"


def chain(upstream: Upstream, steps: list[tuple[str, dict[str, str | None]]]) -> tuple[str, list[tuple[Patch, str]]]:
    """The pin (MODEL_SRC and friends) and one commit per step on top of it, as a replay makes them."""
    base = upstream.commit(
        "model: arch dispatch",
        {"src/llama-model.cpp": MODEL_SRC, "src/llama-arch.cpp": ARCH_SRC, "docs/notes.md": "# notes\n", **MODELS},
    )
    out: list[tuple[Patch, str]] = []
    for index, (slug, files) in enumerate(steps, start=1):
        sha = upstream.commit(slug, files)
        out.append((Patch(Lane.CORE, Path(f"{index:04d}-{slug}.patch"), index, b""), sha))
    return base, out


def replayed(base: str, steps: list[tuple[Patch, str]]) -> Replay:
    return Replay(base, steps[-1][1] if steps else base, tuple(steps))


def uniform_steps(upstream: Upstream, count: int) -> list[tuple[str, dict[str, str | None]]]:
    """Patches that each touch the model file and the notes: a hook added before ``return res;``;
    every fifth rewrites the hook of the patch before it (a clean-up), the 7th and the 14th also
    delete an upstream comment."""
    model, notes = MODEL_SRC, "# notes\n"
    steps: list[tuple[str, dict[str, str | None]]] = []
    for i in range(1, count + 1):
        if i % 5 == 0:
            model = model.replace(f"    hook_{i - 1}(res);\n", f"    hook_{i - 1}(res, {i});\n")
        else:
            model = model.replace(HOOKS_AT, f"    hook_{i}(res);\n{HOOKS_AT}")
        if i == 7:
            model = model.replace("// the mapping: one model class per arch\n", "")
        if i == 14:
            model = model.replace("        // use what we call a normal RoPE\n", "")
        notes += f"patch {i}\n"
        steps.append((f"hook-{i}", {"src/llama-model.cpp": model, "docs/notes.md": notes}))
    return steps


def test_the_audit_runs_no_blame_and_no_git_command_per_patch(upstream: Upstream, git_env: dict[str, str]) -> None:
    base, steps = chain(upstream, uniform_steps(upstream, 40))
    calls: dict[int, Counter[str]] = {}
    reports: dict[int, parity_report.ParityReport] = {}
    for count in (5, 10, 20, 40):
        repo = Recording(upstream.path, git_env)
        reports[count] = parity.audit(repo, replayed(base, steps[:count]), CONFIG, (), upstream_sha=base)
        assert not any(c[0] in ("blame", "log", "rev-list", "annotate") for c in repo.calls), repo.calls
        assert not any(".." in arg for c in repo.calls for arg in c), repo.calls  # no command walks a range
        calls[count] = Counter(c[0] for c in repo.calls)
    # the base's files (ls-tree, cat-file), every step's diff (one diff-tree) and the files the
    # steps change (one cat-file per run of patches read ahead): no question per patch
    assert calls[5] == Counter({"ls-tree": 1, "cat-file": 2, "diff-tree": 1})
    assert calls[10] == calls[20] == calls[5]
    assert parity._READ_AHEAD < 40 and calls[40] - calls[20] == Counter({"cat-file": 40 // parity._READ_AHEAD})

    report = reports[20]
    assert [(d.patch, d.file, d.old_count, d.upstream_lines) for d in report.deletions] == [
        (label(7, "hook-7"), "src/llama-model.cpp", 1, 1),
        (label(14, "hook-14"), "src/llama-model.cpp", 1, 1),
    ]
    assert [(w.patch, w.introduced_by, w.files) for w in report.boundary] == [
        (label(i, f"hook-{i}"), (label(i - 1, f"hook-{i - 1}"),), ("docs/notes.md", "src/llama-model.cpp"))
        for i in (5, 10, 15, 20)
    ]
    assert report.ok and report.patches == 20


def blame(repo: Path, env: dict[str, str], base: str, commit: str, path: str) -> list[str | None]:
    """``git blame <base>..<commit> -- path``: the commit of each line, None for a line of ``base``."""
    out = git(repo, "blame", "--porcelain", f"{base}..{commit}", "--", path, env=env)
    owners: dict[int, str] = {}
    boundary: set[str] = set()
    last = ""
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]{40}) \d+ (\d+)(?: \d+)?$", line)
        if m:
            last = m.group(1)
            owners[int(m.group(2))] = last
        elif line == "boundary":
            boundary.add(last)
    return [None if owners[n] in boundary else owners[n] for n in sorted(owners)]


def varied_steps() -> list[tuple[str, dict[str, str | None]]]:
    model = MODEL_SRC
    gpt2 = MODELS["src/models/gpt2.cpp"]
    add = "        cur = ggml_add(ctx0, inpL, inpL);\n"
    scale = "        cur = ggml_scale(ctx0, cur, 0.5f);\n"
    steps: list[tuple[str, dict[str, str | None]]] = []
    model = model.replace(HOOKS_AT, "    res = hook(res);\n    trace(res);\n" + HOOKS_AT)
    steps.append(("hook", {"src/llama-model.cpp": model, "src/llama-extra.cpp": "int a;\nint b;\nint c;\n"}))
    model = model.replace(
        "        case LLM_ARCH_GEMMA3:\n            return LLAMA",
        "        case LLM_ARCH_GEMMA3: // rope\n            return LLAMA",
    )
    steps.append(("gemma-rope", {"src/llama-model.cpp": model}))
    model = model.replace("    trace(res);\n", "    trace(res, 1);\n")
    steps.append(("fix-hook", {"src/llama-model.cpp": model}))
    # git blame follows the renamed file to the upstream one: its lines stay upstream's
    steps.append(("rename-gpt2", {"src/models/gpt2.cpp": None, "src/models/gpt-2.cpp": gpt2.replace(add, add + scale)}))
    steps.append(
        (
            "fold-scale",
            {"src/models/gpt-2.cpp": gpt2.replace(add, "        cur = ggml_add(ctx0, inpL, inpL) * 0.5f;\n")},
        )
    )
    steps.append(("no-extra", {"src/llama-extra.cpp": None}))
    model = model.rstrip("\n") + " // end\nint tail();"  # the last line loses its newline
    steps.append(("tail", {"src/llama-model.cpp": model}))
    steps.append(("extra-again", {"src/llama-extra.cpp": "int b;\nint d;\n"}))
    return steps


def test_the_line_map_says_what_git_blame_says_at_every_patch(upstream: Upstream, git_env: dict[str, str]) -> None:
    base, steps = chain(upstream, varied_steps())
    repo = Repo(upstream.path, git_env)
    labels = {commit: patch.label for patch, commit in steps}
    order = [patch.label for patch, _commit in steps]
    lines = linemap.LineMap(repo)
    prev = base
    compared: set[str] = set()
    for patch, commit in steps:
        parity.analyse_step(repo, prev, commit, label=patch.label, order=order, lines=lines)
        tracked = git(upstream.path, "ls-tree", "-r", "--name-only", commit, env=git_env).split()
        for path in tracked:
            want = [labels[c] if c else None for c in blame(upstream.path, git_env, base, commit, path)]
            assert lines.owners(commit, path) == want, (patch.label, path)
            if any(want):
                compared.add(path)
        prev = commit
    assert compared == {"src/llama-model.cpp", "src/llama-extra.cpp", "src/models/gpt-2.cpp"}

    report = parity.audit(repo, replayed(base, steps), CONFIG, (), upstream_sha=base)
    gpt2_lines = MODELS["src/models/gpt2.cpp"].count("\n")
    assert [(d.patch, d.file, d.old_count, d.upstream_lines) for d in report.deletions] == [
        (label(2, "gemma-rope"), "src/llama-model.cpp", 1, 1),
        (label(4, "rename-gpt2"), "src/models/gpt2.cpp", gpt2_lines, gpt2_lines),
        # the renamed file's line is upstream's, the line beside it the rename's
        (label(5, "fold-scale"), "src/models/gpt-2.cpp", 2, 1),
        (label(7, "tail"), "src/llama-model.cpp", 1, 1),
    ]
    assert [(w.patch, w.introduced_by) for w in report.boundary] == [
        (label(3, "fix-hook"), (label(1, "hook"),)),
        (label(6, "no-extra"), (label(1, "hook"),)),
    ]
