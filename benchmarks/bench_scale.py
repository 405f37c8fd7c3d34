"""Bench section ``scale``: the queue commands on synthesized queues of N patches (9, 40, 130, 400).

The tree is the pin's as ``invoke prepare`` gets it here: from the source archive, its import
kept in the cache's shared store (``<cache_dir>/git/llama.cpp.git``), every skippy command run
with ``--offline`` where it takes it (this machine has no route to the upstream).  A copy of the
project (:func:`benchmarks.bench_generate.project_copy`, a cache dir of its own sharing the
project's downloads: the real queue is never written) gets, for each N, the shipped queue plus
synthesized patches in a real downstream's proportions (:func:`lane_split`: 41 core,
6 model_support and 83 generated of 130):

* core: one line at the top of a function of ``src/*.cpp`` per patch, model_support: the same in
  ``src/models/*.cpp``; each patch a commit on the ones before it, exported with the lanes'
  ``git format-patch`` options (what ``invoke regenerate`` writes);
* generated: a spec naming the shipped families, then others of the pinned tree
  (:func:`benchmarks.bench_generate.all_families`), the lane written by ``invoke generate``
  (the built-in generator makes one shard per family: past the tree's families, the rest of the
  generated share goes to model_support, :attr:`LaneSplit.moved`).

Then, per N, each command beside a raw baseline, alternating in one run (``rounds`` each; a
first untimed run of each side with a ``git`` on PATH that counts its invocations):

* cold ``invoke prepare --pinned``: ``git clone`` of the store (a local clone, hard links, as
  skippy's), ``git checkout`` of the import + ``git am --3way`` of the same files;
* re-prepare after one patch changed: ``git reset --hard`` to the commit before it + ``git am``
  of it and the patches after it;
* no-op ``invoke prepare --pinned``: ``invoke --version``;
* ``invoke status``: ``git status``;
* ``invoke parity``, ``invoke generate --check``, ``invoke check``, and ``invoke regenerate``
  after a ``--fixup`` commit + autosquash in the workdir: one raw apply (``git reset --hard`` to
  the pin + ``git am --3way`` of the whole queue).

The changed patch is the middle one of the hand-written lanes (core + model_support; generated
shards are never edited by hand): one more line after its first added block.  The figures go to
the bench JSON under ``scale`` (:func:`verdicts` says which targets are met) and a plot of
seconds against N per command beside it (``scale.png``, :func:`plot`).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from benchmarks.common import Timing
from skippy.core import proc
from skippy.core.git import Repo, hermetic_env
from skippy.core.settings import Settings
from skippy.core.ui import Console

#: the queue sizes measured by default
DEFAULT_SIZES: Final = (9, 40, 130, 400)
#: a real downstream's lanes: 41 core and 6 model_support patches of 130 (the rest generated)
CORE_SHARE: Final = (41, 130)
MODEL_SUPPORT_SHARE: Final = (6, 130)
#: two functions a lane edits in one file are at least this many lines apart (no shared context)
MIN_GAP: Final = 12
#: (key in the JSON, what it runs, the raw baseline beside it), in the order measured
COMMANDS: Final = (
    ("cold_prepare", "cold `invoke prepare --pinned`", "`git clone` + `checkout` + `git am --3way`"),
    ("reprepare", "re-prepare, one patch changed", "`git reset --hard` + `git am` from it"),
    ("noop_prepare", "no-op `invoke prepare --pinned`", "`invoke --version`"),
    ("status", "`invoke status`", "`git status`"),
    ("parity", "`invoke parity`", "one raw apply"),
    ("generate_check", "`invoke generate --check`", "one raw apply"),
    ("check", "`invoke check`", "one raw apply"),
    ("regenerate", "`invoke regenerate` after a fixup", "one raw apply"),
)
COMMAND_KEYS: Final = tuple(key for key, _label, _raw in COMMANDS)
#: the targets (issue 42): ratios to the raw baseline, spreads across N
COLD_TARGET: Final = 1.2
REPREPARE_TARGET: Final = 1.5
CHECK_TARGET: Final = 3.0
CHECK_SIZES: Final = (130, 400)
REGENERATE_TARGET: Final = 2.0
PARITY_SPREAD_TARGET: Final = 1.5
PARITY_FROM: Final = 40
NOOP_SPREAD_TARGET: Final = 1.5
NOOP_RATIO_TARGET: Final = 2.0
NOOP_GIT_TARGET: Final = 1
_DATES: Final = {"GIT_AUTHOR_DATE": "2024-06-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-06-01T00:00:00+0000"}
#: the lines of a function definition's head that the synthesized patches edit (at column 0, the
#: body's brace at the end: the line after it is inside the body)
_HEADER: Final = re.compile(
    r"^(?!(?:struct|class|namespace|enum|union|typedef|extern|static_assert|template|return)\b)"
    r"[A-Za-z_~][^;]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?\{\s*$"
)
#: the comment start of a file a changed patch may edit, by suffix (else by name)
_COMMENT: Final = {".c": "//", ".cc": "//", ".cpp": "//", ".h": "//", ".hpp": "//", ".cu": "//", ".in": "//"}
_HUNK: Final = re.compile(r"^@@ -\d+(?:,\d+)? \+(?P<start>\d+)(?:,(?P<count>\d+))? @@", re.MULTILINE)


# --------------------------------------------------------------------------- pure pieces


@dataclass(frozen=True)
class LaneSplit:
    core: int
    model_support: int
    generated: int
    #: generated patches past the generator's families, put in model_support (counted there)
    moved: int = 0

    @property
    def total(self) -> int:
        return self.core + self.model_support + self.generated

    @property
    def handwritten(self) -> int:
        return self.core + self.model_support

    def as_dict(self) -> dict[str, int]:
        return {
            "core": self.core,
            "model_support": self.model_support,
            "generated": self.generated,
            "generated_moved_to_model_support": self.moved,
        }


def _share(n: int, share: tuple[int, int]) -> int:
    return (2 * n * share[0] + share[1]) // (2 * share[1])  # n * a / b rounded half up


def lane_split(n: int, *, shipped: LaneSplit, families: int) -> LaneSplit:
    """``n`` patches in a real downstream's lanes (CORE_SHARE, MODEL_SUPPORT_SHARE, the rest
    generated), never fewer in a lane than the shipped queue has; at most ``families`` generated
    (the built-in generator makes one shard per family), the rest of that share in model_support."""
    if n < shipped.total:
        raise ValueError(f"a queue of {n} patches cannot hold the shipped {shipped.total}")
    if families < shipped.generated:
        raise ValueError(f"{families} families cannot hold the shipped {shipped.generated} shards")
    core = max(shipped.core, _share(n, CORE_SHARE))
    support = max(shipped.model_support, _share(n, MODEL_SUPPORT_SHARE))
    generated = max(shipped.generated, n - core - support)
    excess = core + support + generated - n
    cut = min(excess, core - shipped.core)
    core, excess = core - cut, excess - cut
    support -= excess  # the shipped lanes fit in n: what is left comes off the model_support share
    moved = max(0, generated - families)
    return LaneSplit(core, support + moved, generated - moved, moved)


def ratio(ours: float, raw: float) -> float | None:
    """``ours / raw`` (3 decimals), None without a raw figure."""
    return round(ours / raw, 3) if raw > 0 else None


def growth(by_size: Mapping[int, float]) -> float | None:
    """How much larger than at the smallest size a figure gets at any larger one (1.0: never
    larger), None for fewer than two sizes or a zero at the smallest."""
    if len(by_size) < 2:
        return None
    first = by_size[min(by_size)]
    return None if first <= 0 else round(max(v / first for v in by_size.values()), 3)


def spread(values: Iterable[float]) -> float | None:
    """The largest of ``values`` over the smallest (1.0: flat), None for none or a zero."""
    seen = list(values)
    if not seen or min(seen) <= 0:
        return None
    return round(max(seen) / min(seen), 3)


@dataclass(frozen=True)
class Site:
    """One line put at the top of one function's body."""

    path: str
    #: the 0-based line of the function's head (in the file as the lane found it)
    line: int
    function: str


def function_name(head: str) -> str:
    """The name of a function head (``void llama_vocab::impl::load(...) {`` -> ``llama_vocab::impl::load``)."""
    before = head.split("(", 1)[0].split()
    return before[-1].lstrip("*&") if before else "?"


def function_heads(text: str, *, gap: int = MIN_GAP) -> list[tuple[int, str]]:
    """The function definitions of a C++ file whose head is one line at column 0 ending with the
    body's brace, each at least ``gap`` lines after the one kept before: (line, name)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines()):
        if _HEADER.match(line) and (not found or number - found[-1][0] >= gap):
            found.append((number, function_name(line)))
    return found


def pick_sites(files: Sequence[tuple[str, str]], count: int, *, gap: int = MIN_GAP) -> list[Site]:
    """``count`` functions to edit in ``files`` (path, text), spread over the files: the first
    function of each file, then the second of each, and so on (in path order)."""
    heads = [(path, function_heads(text, gap=gap)) for path, text in sorted(files)]
    sites: list[Site] = []
    depth = 0
    while len(sites) < count:
        row = [Site(path, *found[depth]) for path, found in heads if depth < len(found)]
        if not row:
            raise ValueError(f"only {len(sites)} functions to edit in {len(files)} files, {count} wanted")
        sites += row[: count - len(sites)]
        depth += 1
    return sites


def insert_after(text: str, line: int, added: str) -> str:
    """``text`` with the line ``added`` after its 0-based ``line``."""
    lines = text.splitlines(keepends=True)
    if not 0 <= line < len(lines):
        raise ValueError(f"no line {line + 1} in a {len(lines)}-line file")
    lines.insert(line + 1, added.rstrip("\n") + "\n")
    return "".join(lines)


def shifted(site: Site, done: Sequence[Site]) -> int:
    """The line of ``site``'s head once the sites in ``done`` (each one line added below its own
    head) were applied to the same file."""
    return site.line + sum(1 for d in done if d.path == site.path and d.line < site.line)


def first_added_block_end(diff: str) -> int | None:
    """The 1-based line (new side) where the first hunk of a ``git diff -U0`` ends, None without
    an added line."""
    for match in _HUNK.finditer(diff):
        count = int(match["count"]) if match["count"] is not None else 1
        if count:
            return int(match["start"]) + count - 1
    return None


def comment_start(path: str) -> str | None:
    """How a line comment starts in ``path``, None for a file the changed patch leaves alone."""
    name = path.rsplit("/", 1)[-1]
    if name == "CMakeLists.txt" or name.endswith(".cmake"):
        return "#"
    return _COMMENT.get("." + name.rsplit(".", 1)[-1]) if "." in name else None


def verdicts(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The targets, from the figures of each N (``rows``: ``n`` and ``commands``)."""

    def medians(name: str, side: str) -> dict[int, float]:
        return {r["n"]: r["commands"][name][side]["median_s"] for r in rows if name in r["commands"]}

    def ratios(name: str) -> dict[int, float | None]:
        return {r["n"]: r["commands"][name]["ratio"] for r in rows if name in r["commands"]}

    def under(found: Mapping[int, float | None], limit: float) -> bool:
        return bool(found) and all(v is not None and v <= limit for v in found.values())

    out: dict[str, dict[str, Any]] = {}
    cold, again = ratios("cold_prepare"), ratios("reprepare")
    out["cold_prepare"] = {"target": f"at most {COLD_TARGET}x raw", "ratios": cold, "met": under(cold, COLD_TARGET)}
    out["reprepare"] = {
        "target": f"at most {REPREPARE_TARGET}x raw",
        "ratios": again,
        "met": under(again, REPREPARE_TARGET),
    }
    check = {n: v for n, v in ratios("check").items() if n in CHECK_SIZES}
    out["check"] = {
        "target": f"at most {CHECK_TARGET:g} raw applies at N = {', '.join(map(str, CHECK_SIZES))}",
        "ratios": check,
        "met": under(check, CHECK_TARGET) if check else None,
    }
    regen = ratios("regenerate")
    out["regenerate"] = {
        "target": f"at most {REGENERATE_TARGET:g} raw applies",
        "ratios": regen,
        "met": under(regen, REGENERATE_TARGET),
    }
    per_patch = {n: round(s / n, 5) for n, s in medians("parity", "skippy").items() if n >= PARITY_FROM}
    parity_growth = growth(per_patch)
    out["parity"] = {
        "target": f"seconds per patch grow at most {PARITY_SPREAD_TARGET}x from N = {PARITY_FROM} up",
        "per_patch_s": per_patch,
        "growth": parity_growth,
        # largest over smallest: above the target when the cost per patch falls (fixed costs spread out)
        "spread": spread(per_patch.values()) if len(per_patch) > 1 else None,
        "met": None if parity_growth is None else parity_growth <= PARITY_SPREAD_TARGET,
    }
    noop = medians("noop_prepare", "skippy")
    noop_spread = spread(noop.values())
    gits = {r["n"]: r["commands"]["noop_prepare"]["git"]["skippy"] for r in rows if "noop_prepare" in r["commands"]}
    noop_ratio = ratios("noop_prepare")
    out["noop_prepare"] = {
        "target": (
            f"flat in N (within {NOOP_SPREAD_TARGET}x), {NOOP_GIT_TARGET} git process, "
            f"at most {NOOP_RATIO_TARGET:g}x `invoke --version`"
        ),
        "spread": noop_spread,
        "git": gits,
        "ratios": noop_ratio,
        "met": (
            noop_spread is not None
            and noop_spread <= NOOP_SPREAD_TARGET
            and all(g == NOOP_GIT_TARGET for g in gits.values())
            and under(noop_ratio, NOOP_RATIO_TARGET)
        ),
    }
    return out


# --------------------------------------------------------------------------- counting git


@dataclass(frozen=True)
class GitShim:
    """A ``git`` put first on PATH that writes one line per invocation, then runs the real git
    (git's own children come from its exec path, not PATH: the count is of the processes the
    command under test started)."""

    folder: Path
    log: Path

    @classmethod
    def make(cls, folder: Path, real_git: str) -> GitShim:
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "calls"
        script = folder / "git"
        script.write_text(
            f'#!/bin/sh\necho >> {shlex.quote(str(log))}\nexec {shlex.quote(real_git)} "$@"\n', encoding="utf-8"
        )
        script.chmod(0o755)
        return cls(folder, log)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, "PATH": f"{self.folder}{os.pathsep}{env.get('PATH', os.defpath)}"}

    def count(self, action: Callable[[Mapping[str, str]], object], env: Mapping[str, str]) -> int:
        self.log.write_text("", encoding="utf-8")
        action(self.env(env))
        return len(self.log.read_text(encoding="utf-8").splitlines())


Action = Callable[[Mapping[str, str]], object]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Pair:
    """One command and its raw baseline; ``before_*`` puts the state back (untimed)."""

    name: str
    ours: Action
    raw: Action
    before_ours: Callable[[], object] = _nothing
    before_raw: Callable[[], object] = _nothing
    rounds: int | None = None


def measure(
    pair: Pair, *, rounds: int, env: Mapping[str, str], shim: GitShim, clock: Callable[[], float] = time.perf_counter
) -> dict[str, Any]:
    """A counted, untimed run of each side (it also warms the caches), then ``rounds`` timed runs
    of each, the order swapped every round."""
    pair.before_ours()
    git_ours = shim.count(pair.ours, env)
    pair.before_raw()
    git_raw = shim.count(pair.raw, env)
    samples: tuple[list[float], list[float]] = ([], [])
    sides = ((pair.before_ours, pair.ours), (pair.before_raw, pair.raw))
    for i in range(pair.rounds or rounds):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            before, action = sides[which]
            before()
            started = clock()
            action(env)
            samples[which].append(clock() - started)
    ours, raw = Timing(tuple(samples[0])), Timing(tuple(samples[1]))
    return {
        "skippy": ours.as_dict(),
        "raw": raw.as_dict(),
        "ratio": ratio(ours.median, raw.median),
        "git": {"skippy": git_ours, "raw": git_raw},
    }


# --------------------------------------------------------------------------- the pinned import


def pinned_import(copy: ScaleCopy) -> tuple[Path, str]:
    """The copy prepared once with the shipped queue (``--offline``: from the source archive; the
    first run imports it into the cache's shared store); (the store, the import commit)."""
    from skippy.queue import archives
    from skippy.queue import workdir as wd

    copy.run("prepare", "--pinned", "--offline")
    stamp = wd.read_stamp(copy.workdir / ".git")
    assert stamp is not None, "prepare leaves a stamp"
    store = archives.shared_store(Settings.load(copy.root, copy.env))
    if not store.is_dir():
        raise AssertionError(f"no shared store at {store} after an offline prepare")
    return store, stamp.base_commit


# --------------------------------------------------------------------------- the project copy


@dataclass(frozen=True)
class ScaleCopy:
    """The bench's project copy and how commands run in it."""

    root: Path
    env: Mapping[str, str]
    invoke: str

    @property
    def workdir(self) -> Path:
        return self.root / "work" / "llama.cpp"

    @property
    def patch_dir(self) -> Path:
        return self.root / "queue" / "patches"

    def run(self, *args: str, env: Mapping[str, str] | None = None) -> proc.Result:
        # no timeout: the process gate's timed wait polls every 0.1 s, which the figures would carry
        return proc.run([self.invoke, *args], env=env or self.env, cwd=self.root)

    def action(self, *args: str) -> Action:
        def run(env: Mapping[str, str]) -> None:
            self.run(*args, env=env)

        return run

    def git(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        genv = hermetic_env(env or self.env, self.workdir.parent)
        return proc.run(["git", "-C", str(self.workdir), *args], env=genv).stdout.strip()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def restore(folder: Path, saved: Mapping[str, bytes]) -> bool:
    """Put ``folder`` back as ``saved`` holds it; whether anything differed."""
    if snapshot(folder) == saved:
        return False
    shutil.rmtree(folder)
    for rel, data in saved.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return True


# --------------------------------------------------------------------------- the synthesized queue


@dataclass(frozen=True)
class Changed:
    """The patch changed for re-prepare and amended by the fixup before regenerate."""

    #: ``<lane>/<file>``
    label: str
    #: its index in apply order
    index: int
    original: bytes
    #: the same commit with one more line, exported like the lanes
    variant: bytes
    #: the file the extra line and the fixup go to, and the line they go after (in that patch's tree)
    file: str
    after_text: str
    comment: str


@dataclass(frozen=True)
class SynthQueue:
    split: LaneSplit
    #: every patch file in apply order
    patches: tuple[Path, ...]
    changed: Changed
    families: tuple[str, ...]
    generate_s: float


@dataclass
class Scratch:
    """A clone of the import where the hand-written lanes are made as commits, in apply order."""

    repo: Repo
    labels: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.repo.path

    def head(self) -> str:
        return self.repo.out("rev-parse", "HEAD")

    def am(self, patches: Sequence[Path], lane: str) -> None:
        for patch in patches:
            self.repo.git("am", "--3way", "--quiet", "--committer-date-is-author-date", str(patch))
            self.labels.append(f"{lane}/{patch.name}")
            self.commits.append(self.head())

    def edit(self, sites: Sequence[Site], lane: str, first: int) -> list[str]:
        """One commit per site (a comment line at the top of the function); their shas."""
        done: list[Site] = []
        made: list[str] = []
        for offset, site in enumerate(sites):
            number = first + offset
            target = self.path / site.path
            line = f"    // downstream {lane.replace('_', ' ')} {number:04d}: {site.function}"
            text = insert_after(target.read_text(encoding="utf-8"), shifted(site, done), line)
            target.write_text(text, encoding="utf-8")
            done.append(site)
            self.repo.git("add", "--", site.path)
            subject = f"scale: {lane.replace('_', ' ')} {number:04d} in {site.path.rsplit('/', 1)[-1]}"
            self.repo.git(
                "commit", "--quiet", "-m", subject, "-m", f"A line at the top of {site.function}.", env=_DATES
            )
            made.append(self.head())
        return made

    def lane(self, sites: Sequence[Site], lane: str, first: int, into: Path) -> None:
        """The sites as commits, exported into ``into`` numbered from ``first`` (what regenerate writes)."""
        from skippy.maintain.replay import export_range

        if not sites:
            return
        top = self.head()
        commits = self.edit(sites, lane, first)
        aside = into.parent / f".export-{into.name}"
        shutil.rmtree(aside, ignore_errors=True)
        files = export_range(self.repo, f"{top}..{self.head()}", aside)
        assert len(files) == len(commits)
        for number, (path, commit) in enumerate(zip(files, commits, strict=True), start=first):
            target = into / f"{number:04d}-{path.name.split('-', 1)[1]}"
            path.rename(target)
            self.labels.append(f"{lane}/{target.name}")
            self.commits.append(commit)
        shutil.rmtree(aside)

    def changed(self, index: int, patch_dir: Path) -> Changed:
        """The patch at ``index`` with one more line after its first added block (in the first of its
        files with line comments), as its commit amended and exported."""
        from skippy.maintain.replay import export_commit

        commit, label = self.commits[index], self.labels[index]
        names = self.repo.out("diff", "--name-only", "--no-renames", f"{commit}^", commit).splitlines()
        for name in names:
            comment = comment_start(name)
            end = first_added_block_end(self.repo.out("diff", "-U0", "--no-renames", f"{commit}^", commit, "--", name))
            if comment is None or end is None:
                continue
            self.repo.git("checkout", "--quiet", "--detach", commit)
            target = self.path / name
            lines = target.read_text(encoding="utf-8").splitlines()
            after = lines[end - 1]
            indent = after[: len(after) - len(after.lstrip())]
            target.write_text(
                insert_after(
                    target.read_text(encoding="utf-8"), end - 1, f"{indent}{comment} downstream: one more line"
                ),
                encoding="utf-8",
            )
            self.repo.git(
                "commit",
                "--quiet",
                "--amend",
                "--no-edit",
                "-a",
                env={"GIT_COMMITTER_DATE": _DATES["GIT_COMMITTER_DATE"]},
            )
            variant = export_commit(self.repo, "HEAD")
            original = (patch_dir / label.removeprefix("core/")).read_bytes()
            return Changed(label, index, original, variant, name, after, comment)
        raise ValueError(f"{label} changes no file with line comments")


def _texts(root: Path, pattern: str, *, skip: str | None = None) -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(root)), p.read_text(encoding="utf-8", errors="replace"))
        for p in sorted(root.glob(pattern))
        if skip is None or not p.name.startswith(skip)
    ]


def shipped_split(patch_dir: Path) -> LaneSplit:
    from skippy.queue.model import Lane, load_queue

    queue = load_queue(patch_dir)
    return LaneSplit(len(queue.lane(Lane.CORE)), len(queue.lane(Lane.MODEL_SUPPORT)), len(queue.lane(Lane.GENERATED)))


def spec_text(families: Sequence[tuple[str, str]]) -> str:
    """A generated-lane spec (``families.toml``) of ``families`` (name, arch), in that order."""
    from skippy.maintain import genspec

    lines = [
        "# the shipped families, then others of the pinned tree (benchmarks.bench_scale)",
        f"schema = {genspec.SCHEMA}",
    ]
    for name, arch in families:
        lines += ["", "[[family]]", f'name = "{name}"', f'arch = "{arch}"']
    return "\n".join(lines) + "\n"


def build_queue(
    n: int, *, settings: Settings, copy: ScaleCopy, store: Path, pin: str, scratch_dir: Path, console: Console
) -> SynthQueue:
    """The copy's queue of ``n`` patches (see the module docstring); the generated lane written by
    ``invoke generate`` in the copy."""
    import tomllib

    from benchmarks.bench_generate import EXPECTED_REFUSED, all_families
    from skippy.maintain import genspec
    from skippy.queue.model import load_queue

    patches = copy.patch_dir
    shutil.rmtree(patches, ignore_errors=True)
    shutil.copytree(settings.patch_dir, patches, symlinks=True)
    shipped = shipped_split(patches)
    support, gen = patches / "model_support", patches / "generated"
    spec = tomllib.loads((gen / genspec.SPEC_NAME).read_text(encoding="utf-8"))
    own = [(f["name"], f["arch"]) for f in spec.get("family", [])]
    shutil.rmtree(scratch_dir, ignore_errors=True)
    genv = hermetic_env(copy.env, scratch_dir.parent)
    proc.run(["git", "clone", "--quiet", "--no-checkout", str(store), str(scratch_dir)], env=genv)
    scratch = Scratch(Repo(scratch_dir, copy.env))
    scratch.repo.git("checkout", "--quiet", "--detach", pin)
    scratch.am(sorted(patches.glob("*.patch")), "core")
    taken = {name for name, _arch in own} | set(EXPECTED_REFUSED)
    others = [f for f in all_families(scratch.path).families if f.name not in taken]
    split = lane_split(n, shipped=shipped, families=len(own) + len(others))
    core_sites = pick_sites(_texts(scratch.path, "src/*.cpp", skip="skippy-"), split.core - shipped.core)
    scratch.lane(core_sites, "core", shipped.core + 1, patches)
    scratch.am([support / name for name in (support / "series").read_text(encoding="utf-8").split()], "model_support")
    support_sites = pick_sites(_texts(scratch.path, "src/models/*.cpp"), split.model_support - shipped.model_support)
    scratch.lane(support_sites, "model_support", shipped.model_support + 1, support)
    (support / "series").write_text("".join(p.name + "\n" for p in sorted(support.glob("*.patch"))), encoding="utf-8")
    families = [*own, *((f.name, f.arch) for f in others[: split.generated - len(own)])]
    (gen / genspec.SPEC_NAME).write_text(spec_text(families), encoding="utf-8")
    changed = scratch.changed(split.handwritten // 2, patches)
    shutil.rmtree(scratch_dir)
    console.info(
        f"bench: N = {n}: {split.core} core, {split.model_support} model_support, {split.generated} generated "
        f"(`invoke generate` of {len(families)} families); the changed patch: {changed.label}"
    )
    started = time.perf_counter()
    copy.run("generate", "--offline")
    generate_s = time.perf_counter() - started
    queue = load_queue(patches)
    if len(queue.patches) != n:
        raise AssertionError(f"the synthesized queue has {len(queue.patches)} patches, not {n}")
    return SynthQueue(split, tuple(p.path for p in queue.patches), changed, tuple(f[0] for f in families), generate_s)


# --------------------------------------------------------------------------- the raw side


@dataclass
class RawSide:
    """Raw git beside skippy: a clone of the import, the same patch files."""

    clone: Path
    #: the shared store skippy's cold prepare takes the pin from
    store: Path
    pin: str
    patches: tuple[Path, ...]
    #: the environment of the commands run outside the measured actions
    env: Mapping[str, str]
    #: the clone's HEAD after applying the queue, and the commit before the changed patch
    applied: str = ""
    before_changed: str = ""

    def _git(self, env: Mapping[str, str], *args: str | Path) -> str:
        genv = hermetic_env(env, self.clone.parent)
        # no timeout, as ScaleCopy.run
        return proc.run(["git", "-C", str(self.clone), *map(str, args)], env=genv).stdout.strip()

    def remove(self) -> None:
        shutil.rmtree(self.clone, ignore_errors=True)

    def cold(self, env: Mapping[str, str]) -> None:
        genv = hermetic_env(env, self.clone.parent)
        proc.run(["git", "clone", "--quiet", "--no-checkout", str(self.store), str(self.clone)], env=genv)
        self._git(env, "checkout", "--quiet", "--detach", self.pin)
        self._git(env, "am", "--3way", "--quiet", *self.patches)

    def apply(self, env: Mapping[str, str]) -> None:
        """One raw apply: back to the pin, then ``git am`` of the whole queue."""
        self._git(env, "reset", "--quiet", "--hard", self.pin)
        self._git(env, "am", "--3way", "--quiet", *self.patches)

    def remember(self, changed_index: int) -> None:
        self.applied = self._git(self.env, "rev-parse", "HEAD")
        self.before_changed = self._git(self.env, "rev-parse", f"HEAD~{len(self.patches) - changed_index}")

    def back_to_applied(self) -> None:
        self._git(self.env, "reset", "--quiet", "--hard", self.applied)

    def from_changed(self, variant: Path, index: int) -> Action:
        def run(env: Mapping[str, str]) -> None:
            self._git(env, "reset", "--quiet", "--hard", self.before_changed)
            self._git(env, "am", "--3way", "--quiet", variant, *self.patches[index + 1 :])

        return run

    def status(self, env: Mapping[str, str]) -> None:
        self._git(env, "status")

    def tree(self) -> str:
        return self._git(self.env, "rev-parse", "HEAD^{tree}")


# --------------------------------------------------------------------------- one N


@dataclass
class SizeRun:
    """The measurements of one N (the queue built, the copy prepared by the cold pair)."""

    copy: ScaleCopy
    queue: SynthQueue
    raw: RawSide
    shim: GitShim
    rounds: int
    noop_rounds: int
    console: Console
    saved: dict[str, bytes] = field(default_factory=dict)

    @property
    def changed_path(self) -> Path:
        return self.copy.patch_dir / self.queue.changed.label.removeprefix("core/")

    def prepare(self) -> None:
        self.copy.run("prepare", "--pinned", "--offline")

    def cold_workdir(self) -> None:
        shutil.rmtree(self.copy.root / "work", ignore_errors=True)

    def original(self) -> None:
        """The queue as built and the workdir prepared from it (a re-prepare when it was not)."""
        if restore(self.copy.patch_dir, self.saved) or not self.copy.workdir.is_dir():
            self.cold_workdir()
        self.prepare()

    def with_variant(self) -> None:
        self.changed_path.write_bytes(self.queue.changed.original)
        self.prepare()
        self.changed_path.write_bytes(self.queue.changed.variant)

    def fixup(self) -> None:
        """Back to the queue as built, then a fixup of the changed patch's commit in the workdir
        (one more line after the same line as the variant's), squashed with autosquash."""
        self.original()
        from skippy.queue import workdir as wd

        c = self.queue.changed
        stamp = wd.read_stamp(self.copy.workdir / ".git")
        assert stamp is not None, "the workdir is prepared"
        base = stamp.base_commit
        log = self.copy.git("log", "--format=%H %(trailers:key=Skippy-Patch,valueonly,separator=%x2c)", f"{base}..HEAD")
        target = next(line.split()[0] for line in log.splitlines() if line.endswith(" " + c.label))
        path = self.copy.workdir / c.file
        lines = path.read_text(encoding="utf-8").splitlines()
        found = [i for i, line in enumerate(lines) if line == c.after_text]
        if len(found) != 1:
            raise AssertionError(f"{c.file}: the line after which the fixup goes is there {len(found)} times")
        indent = c.after_text[: len(c.after_text) - len(c.after_text.lstrip())]
        path.write_text(
            insert_after(path.read_text(encoding="utf-8"), found[0], f"{indent}{c.comment} downstream: fixed up"),
            encoding="utf-8",
        )
        self.copy.git("commit", "--quiet", "-a", f"--fixup={target}")
        self.copy.git("rebase", "--quiet", "-i", "--autosquash", base)

    def pairs(self) -> list[Pair]:
        c, raw, copy = self.queue.changed, self.raw, self.copy
        variant = raw.clone.parent / "variant" / Path(c.label).name
        variant.parent.mkdir(parents=True, exist_ok=True)
        variant.write_bytes(c.variant)
        return [
            Pair(
                "cold_prepare", copy.action("prepare", "--pinned", "--offline"), raw.cold, self.cold_workdir, raw.remove
            ),
            Pair(
                "reprepare",
                copy.action("prepare", "--pinned", "--offline"),
                raw.from_changed(variant, c.index),
                self.with_variant,
                raw.back_to_applied,
            ),
            Pair(
                "noop_prepare",
                copy.action("prepare", "--pinned", "--offline"),
                copy.action("--version"),
                self.original,
                rounds=self.noop_rounds,
            ),
            Pair("status", copy.action("status"), raw.status),
            Pair("parity", copy.action("parity", "--offline"), raw.apply),
            Pair("generate_check", copy.action("generate", "--check", "--offline"), raw.apply),
            Pair("check", copy.action("check", "--offline"), raw.apply),
            Pair("regenerate", copy.action("regenerate", "--offline"), raw.apply, self.fixup),
        ]

    def run(self, wanted: Sequence[str]) -> dict[str, dict[str, Any]]:
        self.saved = snapshot(self.copy.patch_dir)
        out: dict[str, dict[str, Any]] = {}
        for pair in self.pairs():
            if pair.name not in wanted:
                continue
            label = {k: v for k, v, _raw in COMMANDS}[pair.name]
            with self.console.step(f"bench: N = {len(self.queue.patches)}: {label}"):
                out[pair.name] = measure(pair, rounds=self.rounds, env=self.copy.env, shim=self.shim)
            if pair.name in ("cold_prepare", "reprepare"):  # both sides end on the same queue
                out[pair.name]["same_tree_as_raw"] = self.copy.git("rev-parse", "HEAD^{tree}") == self.raw.tree()
            if pair.name == "cold_prepare":
                self.raw.remember(self.queue.changed.index)
            if pair.name == "regenerate":  # the fixup reached the queue
                out[pair.name]["queue_rewritten"] = snapshot(self.copy.patch_dir) != self.saved
        restore(self.copy.patch_dir, self.saved)
        return out


# --------------------------------------------------------------------------- the plot


def plot(section: Mapping[str, Any], path: Path) -> None:
    """Median seconds against N for each command, skippy beside its raw baseline (log scales)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # nox logs at debug level: no font search
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    rows = section["sizes"]
    shown = [c for c in COMMANDS if any(c[0] in r["commands"] for r in rows)]
    cols = 4
    fig, axes = plt.subplots(
        (len(shown) + cols - 1) // cols,
        cols,
        figsize=(4 * cols, 3.4 * ((len(shown) + cols - 1) // cols)),
        squeeze=False,
    )
    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    for ax, (key, label, raw_label) in zip(axes.flat, shown, strict=False):
        got = [r for r in rows if key in r["commands"]]
        ns = [r["n"] for r in got]
        ours = [r["commands"][key]["skippy"]["median_s"] for r in got]
        ax.plot(ns, ours, "o-", label="skippy (labels: git processes)")
        ax.plot(
            ns, [r["commands"][key]["raw"]["median_s"] for r in got], "s--", label="raw: " + raw_label.replace("`", "")
        )
        for n, seconds, row in zip(ns, ours, got, strict=True):
            ax.annotate(
                str(row["commands"][key]["git"]["skippy"]),
                (n, seconds),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(FuncFormatter(functools.partial(_minor_label, ax)))
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_title(label.replace("`", ""), fontsize=10)
        ax.set_xlabel("patches in the queue (N)", fontsize=8)
        ax.set_ylabel("median seconds", fontsize=8)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    fig.suptitle("queue commands against queue size on the pinned llama.cpp tree (`nox -s bench -- --only scale`)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _minor_label(ax: Any, value: float, _pos: int) -> str:
    """A minor tick's label on a log axis: every one on an axis spanning less than a factor 4,
    else only 2 and 5 times a power of ten (no crowding)."""
    low, high = ax.get_ylim()
    text = f"{value:g}"
    return text if high < 4 * low or text.lstrip("0.")[:1] in ("2", "5") else ""


# --------------------------------------------------------------------------- the section


def summary(section: Mapping[str, Any]) -> str:
    """One line: each target and whether it was met."""
    parts = []
    for key, v in section["targets"].items():
        met = v["met"]
        parts.append(f"{key.replace('_', ' ')} {v['target']}: {'n/a' if met is None else 'met' if met else 'MISSED'}")
    return "scale: " + "; ".join(parts)


def bench_scale(
    settings: Settings,
    console: Console,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    rounds: int = 2,
    noop_rounds: int = 7,
    commands: Sequence[str] = COMMAND_KEYS,
    plot_to: Path | None = None,
    python: str = sys.executable,
) -> dict[str, Any]:
    """The section's figures (see the module's docstring)."""
    from benchmarks.bench_generate import copy_env, project_copy
    from benchmarks.bench_proofs import share_downloads

    base = settings.cache_dir.parent / "bench" / "scale"
    base.mkdir(parents=True, exist_ok=True)
    cache = base / "cache"
    share_downloads(settings, replace(settings, cache_dir=cache))
    root = project_copy(settings, base / "project", cache_dir=cache)
    copy = ScaleCopy(root, copy_env(settings.env), str(Path(python).parent / "invoke"))
    console.info("bench: the copy prepared with the shipped queue, offline (the pin from the archive's import)")
    store, pin = pinned_import(copy)
    real_git = proc.which("git", settings.env)
    assert real_git is not None, "git is on PATH"
    shim = GitShim.make(base / "shim", real_git)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        queue = build_queue(
            n, settings=settings, copy=copy, store=store, pin=pin, scratch_dir=base / "scratch", console=console
        )
        raw = RawSide(base / "raw" / "llama.cpp", store, pin, queue.patches, copy.env)
        run = SizeRun(copy, queue, raw, shim, rounds, noop_rounds, console)
        figures = run.run(commands)
        rows.append(
            {
                "n": n,
                "lanes": queue.split.as_dict(),
                "changed_patch": queue.changed.label,
                "generate_s": round(queue.generate_s, 2),
                "commands": figures,
            }
        )
        console.info(_size_line(rows[-1]))
        raw.remove()
    section: dict[str, Any] = {
        "upstream": {"pin_import": pin, "upstream_sha": settings.pin_file.read_text(encoding="utf-8").split()[0]},
        "rounds": rounds,
        "noop_rounds": noop_rounds,
        "sizes": rows,
        "raw": {key: raw_label for key, _label, raw_label in COMMANDS},
        "targets": verdicts(rows),
    }
    if plot_to is not None:
        plot(section, plot_to)
        section["plot"] = plot_to.name
    console.info(summary(section))
    return section


def _size_line(row: Mapping[str, Any]) -> str:
    parts = [
        f"{key} {c['skippy']['median_s']:.2f} s ({c['ratio']}x raw; git {c['git']['skippy']} vs {c['git']['raw']})"
        for key, c in row["commands"].items()
    ]
    return f"scale N = {row['n']}: " + "; ".join(parts)
