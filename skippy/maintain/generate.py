"""The generated lane: graph-code edits in each model family's own source, one patch per family.

Inputs:

* the spec ``<patch_dir>/generated/families.toml``::

      schema = 2

      [[family]]
      name = "qwen2"                       # [a-z0-9_-], unique
      arch = "LLM_ARCH_QWEN2"              # named in src/llama-arch.cpp; not UNKNOWN or CLIP
      paths = ["src/models/qwen2.cpp"]     # optional globs: the files of this family's patch
                                           # (default: the file of the family's graph builder)

* the generator: the built-in one, or the command ``[tool.skippy.generated]``
  names in pyproject.toml (:mod:`skippy.maintain.genrun`);
* the tree the lane applies to: the pin with the core and model_support lanes.

How the lane is made (``invoke generate``):

1. The pin + core + model_support are replayed; a worktree of the result is
   checked out in a sandbox.  Each family's arch is looked up in the tree
   (``LLM_ARCH_NAMES``; the class ``llama_model_mapping`` creates; the file that
   holds that class's graph builder, or the builder it shares in ``models.h``).
2. The generator runs once over the tree.  The built-in one puts the core
   lane's layer hook in each family's graph builder with a C++ parser
   (:mod:`skippy.maintain.graphedit`): ``llama_skippy_layer_hook(this, cur, il);``
   after the layer loop's ``cb(cur, "l_out", il);``.  A user's command runs with
   ``SKIPPY_FAMILIES`` naming a JSON file of the families (name, arch, GGUF
   name, model class, builder file, paths) and may edit any file of the tree.
3. What changed is split by family: every changed file must match the paths of
   exactly one family, and every family must have changed something.
4. The generator runs a second time on its own result: any change fails,
   naming the files (a generator must be idempotent).
5. One commit per family in spec order, with a fixed identity and date,
   exported with the lanes' fixed ``git format-patch`` options: the same
   inputs give the same bytes.  ``series`` lists them; ``inputs.sha256``
   records the inputs (generator identity, pin, spec, the lanes below) and
   each shard's sha256.

``invoke generate --check`` makes the lane aside the same way and names the
families whose patch drifted; ``invoke regenerate`` remakes the lane only when
its recorded inputs changed.

The steps' own modules: the spec (:mod:`skippy.maintain.genspec`), the tree's facts
(:mod:`skippy.maintain.genfacts`), the built-in generator (:mod:`skippy.maintain.genbuiltin`),
a command's run (:mod:`skippy.maintain.genrun`), the inputs manifest
(:mod:`skippy.maintain.genmanifest`), the lane's files and their drift
(:mod:`skippy.maintain.genfiles`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.core import gitbulk
from skippy.core.errors import QueueError
from skippy.core.git import Repo
from skippy.core.paths import NotSmallFile, read_small_bytes
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain.genbuiltin import BUILTIN_READS, builtin_edit
from skippy.maintain.genfacts import ARCH_CPP, MODEL_CPP, ArchFacts, arch_facts, builder_files, family_paths
from skippy.maintain.genfiles import (
    INPUTS_NAME,
    LANE_FILE_LIMIT,
    SERIES_NAME,
    Drift,
    GeneratedLane,
    compare_lane,
    read_lane_file,
    write_lane,
)
from skippy.maintain.genmanifest import GENERATOR_VERSION, identity, input_lines, inputs_of, lanes_digest, manifest
from skippy.maintain.genrun import (
    UNTOUCHED,
    Generator,
    Sandbox,
    changed_files,
    configure,
    generator_from_settings,
    run_generator,
    write_families,
)
from skippy.maintain.genspec import SCHEMA, SPEC_NAME, Family, Spec, parse_spec
from skippy.maintain.replay import FIXED_DATE, export_range, replay, sub_queue
from skippy.queue.model import Lane, Queue
from skippy.queue.scratch import owned_scratch
from skippy.queue.triage import aside_worktree


def lane_dir(settings: Settings) -> Path:
    return settings.patch_dir / "generated"


def spec_path(settings: Settings) -> Path:
    return lane_dir(settings) / SPEC_NAME


def load_spec(settings: Settings) -> Spec | None:
    path = spec_path(settings)
    if not os.path.lexists(path):
        return None
    try:
        data = read_small_bytes(path, LANE_FILE_LIMIT, inside=settings.root)
    except NotSmallFile as exc:
        raise QueueError(
            f"the generated-lane spec {settings.relative(path)} is refused, not read: it is {exc.why}",
            untouched="everything: the generated lane was not changed",
            next_step=f"make {settings.relative(path)} a regular file of the project (the queue reads no file "
            "from outside it), then `invoke generate`",
        ) from None
    return parse_spec(path, data)


def recorded_inputs(settings: Settings) -> dict[str, str] | None:
    """The input lines of the lane's manifest on disk (None: no readable manifest)."""
    path = lane_dir(settings) / INPUTS_NAME
    data = read_lane_file(path, settings.root) if os.path.lexists(path) else None
    return None if data is None else inputs_of(data.decode("utf-8", errors="replace"))


def patch_name(index: int, family: Family) -> str:
    return f"{index:04d}-family-{family.name}.patch"


def split_by_family(
    changed: Mapping[str, str], families: Sequence[Family], facts: Mapping[str, ArchFacts]
) -> dict[str, list[str]]:
    """family -> the changed files its paths match; QueueError for a file no family or several
    families claim, and for a family that changed nothing."""
    owners: dict[str, list[str]] = {f.name: [] for f in families}
    problems: list[str] = []
    for path in sorted(changed):
        matching = [
            f.name for f in families if any(fnmatch.fnmatchcase(path, g) for g in family_paths(f, facts[f.name]))
        ]
        if not matching:
            problems.append(f"{path}: changed, but in no family's paths")
        elif len(matching) > 1:
            problems.append(f"{path}: in the paths of several families ({', '.join(matching)})")
        else:
            owners[matching[0]].append(path)
    for family in families:
        if not owners[family.name]:
            globs = ", ".join(family_paths(family, facts[family.name])) or "none"
            problems.append(f"family {family.name}: the generator changed none of its paths ({globs})")
    if problems:
        raise QueueError(
            "the generator's changes do not split into one patch per family",
            details="\n".join(problems),
            untouched=UNTOUCHED,
            next_step="give each family its files with `paths = [...]` in generated/families.toml "
            "(or make the generator edit only declared families), then `invoke generate`",
        )
    return owners


# --------------------------------------------------------------------------- execution


@contextlib.contextmanager
def sandbox(settings: Settings, repo: Repo, commit: str, *, only: Sequence[str] | None = None) -> Iterator[Sandbox]:
    """A sandbox of this run with a detached worktree of ``commit`` in ``tree/`` (with ``only``,
    just those folders written: the rest stays in the index, so commits there hold it)."""
    with (
        owned_scratch(settings.cache_dir / "tmp", "generate-") as root,
        aside_worktree(repo, None, commit, path=root / "tree", only=only) as tree,
    ):
        yield Sandbox(root, tree, commit)


def _families_json(families: Sequence[Family], facts: Mapping[str, ArchFacts]) -> list[dict[str, object]]:
    return [
        {
            "name": f.name,
            "arch": f.arch,
            "gguf_name": facts[f.name].gguf_name,
            "model_class": facts[f.name].model_class,
            "builder_file": facts[f.name].builder_file,
            "builder_class": facts[f.name].builder_class,
            "paths": list(family_paths(f, facts[f.name])),
        }
        for f in families
    ]


def _commit_all(tree: Repo, message: str, *, stage: bool = True) -> str:
    """Commit the tree (everything, or with ``stage=False`` what is staged already)."""
    env = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}
    if stage:
        tree.git("add", "-A")
    tree.git("commit", "--quiet", "--no-verify", "--allow-empty", "-m", message, env=env)
    head = tree.head()
    assert head is not None
    return head


def commit_message(family: Family, fact: ArchFacts, what: str, generator: Generator) -> str:
    by = (
        f"skippy's built-in generator ({GENERATOR_VERSION})"
        if generator.builtin
        else f"the command in [tool.skippy.generated] (`{' '.join(generator.argv)}`)"
    )
    return (
        f"generated: family {family.name}\n\n"
        f'Arch {fact.arch} (GGUF name "{fact.gguf_name}")'
        + (f", model class {fact.model_class}" if fact.model_class else "")
        + f": {what}.\nGenerated by {by} from generated/{SPEC_NAME}: do not edit, run `invoke generate`.\n"
    )


def generate_lane(
    settings: Settings,
    repo: Repo,
    base: str,
    *,
    upstream_sha: str,
    queue: Queue,
    spec: Spec,
    console: Console,
) -> GeneratedLane:
    """Make the generated lane's files for ``spec`` on top of ``base`` + the core and model_support lanes."""
    generator = generator_from_settings(settings)
    inputs = input_lines(identity(generator, settings.root), spec.sha256, upstream_sha, lanes_digest(queue))
    command = generator.argv
    if not spec.families:
        return GeneratedLane({SERIES_NAME: b""}, manifest(inputs, {}, command=command))
    lower = sub_queue(queue, (Lane.CORE, Lane.MODEL_SUPPORT))
    tip = replay(settings, repo, base, lower, console=console).patched
    with sandbox(settings, repo, tip, only=BUILTIN_READS if generator.builtin else None) as box:
        where = f"pin {upstream_sha[:12]} + {len(lower.patches)} lane patch(es)"
        facts = _tree_facts(box.tree.path, spec.families, where=where)
        write_families(box, _families_json(spec.families, facts))
        compile_commands = configure(box, settings, console) if generator.compile_commands else None
        run = _Run(generator, settings, console, spec.families, facts, compile_commands)
        what = run.over(box, "first pass")
        changed = changed_files(box.tree)
        owners = split_by_family(changed, spec.families, facts)
        result = _commit_all(box.tree, "generated: all families (first pass)")
        _second_pass(run, Sandbox(box.root, box.tree, result))
        files, names, shard_files = _shards(
            box.tree,
            tip,
            result,
            spec=spec,
            facts=facts,
            owners=owners,
            what=what,
            generator=generator,
            scratch=box.root,
        )
    shards = {n: files[n] for n in names}
    files[SERIES_NAME] = "".join(n + "\n" for n in names).encode()
    text = manifest(inputs, shards, command=command)
    return GeneratedLane(files, text, spec.families, names, shard_files)


def _tree_facts(tree: Path, families: Sequence[Family], *, where: str) -> dict[str, ArchFacts]:
    """What the sandbox's tree says about each family (:func:`arch_facts`, its builders read)."""
    return arch_facts(
        families,
        _read(tree / ARCH_CPP),
        _read(tree / MODEL_CPP),
        where=where,
        builders=builder_files(tree),
    )


def _second_pass(run: _Run, second: Sandbox) -> None:
    """The generator run again on its own result: any change is a QueueError naming the files."""
    run.over(second, "second pass")
    again = changed_files(second.tree)
    if again:
        raise QueueError(
            f"the generator is not idempotent: a second pass over its own result changed {len(again)} file(s)",
            details="\n".join(f"{status} {path}" for path, status in sorted(again.items())),
            untouched=UNTOUCHED,
            next_step="make the generator recognise its own edits (a second run must change nothing), "
            "then `invoke generate`",
        )


@dataclass(frozen=True)
class _Run:
    """The generator as each of its passes over a sandbox runs it, with what it is given."""

    generator: Generator
    settings: Settings
    console: Console
    families: Sequence[Family]
    facts: Mapping[str, ArchFacts]
    compile_commands: Path | None

    def over(self, box: Sandbox, attempt: str) -> dict[str, str]:
        """One pass of the generator over the sandbox's tree; family -> what it did (for the commit)."""
        if self.generator.builtin:
            return builtin_edit(box.tree.path, self.families, self.facts)
        run_generator(
            self.generator, box, self.settings, self.console, compile_commands=self.compile_commands, attempt=attempt
        )
        return {}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _shards(
    tree: Repo,
    tip: str,
    result: str,
    *,
    spec: Spec,
    facts: Mapping[str, ArchFacts],
    owners: Mapping[str, Sequence[str]],
    what: Mapping[str, str],
    generator: Generator,
    scratch: Path,
) -> tuple[dict[str, bytes], dict[str, str], dict[str, tuple[str, ...]]]:
    """One commit per family on ``tip`` taking its files from ``result``; the exported patches.

    The commits are made without touching the work tree (one ``fast-import``) and exported with
    one ``format-patch``: a handful of git processes whatever the number of families."""
    everything = sorted({p for family in spec.families for p in owners[family.name]})
    present = gitbulk.tree_entries(tree, result, everything)
    changes = []
    for family in spec.families:
        paths = owners[family.name]
        did = what.get(family.name) or "edits " + ", ".join(paths)
        message = commit_message(family, facts[family.name], did, generator)
        changes.append(gitbulk.Change(message, {p: present.get(p) for p in paths}))
    commits = gitbulk.commit_chain(tree, tip, changes, date=FIXED_DATE, scratch=scratch)
    head = commits[-1] if commits else tip
    trees = tree.out("rev-parse", f"{head}^{{tree}}", f"{result}^{{tree}}").split()
    if trees[0] != trees[1]:
        raise QueueError(
            "the family patches do not add up to the generator's result (a bug in the split)",
            untouched=UNTOUCHED,
            next_step="report it with the output of `invoke generate --check --json`",
        )
    exported = export_range(tree, f"{tip}..{head}", scratch / "shards") if commits else []
    files: dict[str, bytes] = {}
    names: dict[str, str] = {}
    shard_files: dict[str, tuple[str, ...]] = {}
    for index, (family, path) in enumerate(zip(spec.families, exported, strict=True), start=1):
        name = patch_name(index, family)
        files[name] = path.read_bytes()
        names[name] = family.name
        shard_files[family.name] = tuple(owners[family.name])
    return files, names, shard_files


def run_generate(
    settings: Settings, *, console: Console, check: bool = False, checkout: Path | None = None, offline: bool = False
) -> tuple[GeneratedLane, Drift]:
    """``invoke generate`` (rewrite the lane) or ``invoke generate --check`` (QueueError on drift)."""
    from skippy.maintain.replay import pinned_store
    from skippy.queue.model import load_queue

    spec = load_spec(settings)
    if spec is None:
        raise QueueError(
            f"there is no generated-lane spec at {settings.relative(spec_path(settings))}",
            untouched="everything",
            next_step=f"write {settings.relative(spec_path(settings))} (schema = {SCHEMA}, [[family]] name/arch "
            "entries), then `invoke generate`",
        )
    queue = load_queue(settings.patch_dir)
    folder = lane_dir(settings)
    with pinned_store(settings, console=console, checkout=checkout, offline=offline) as store:
        lane = generate_lane(
            settings, store.repo, store.base, upstream_sha=store.upstream_sha, queue=queue, spec=spec, console=console
        )
    drift = compare_lane(folder, lane, inside=settings.root)
    if check:
        if not drift.ok:
            raise drift_error(settings, drift)
        return lane, drift
    for name in write_lane(folder, lane):
        console.warn(
            f"{settings.relative(folder / name)} was a symlink: replaced by a regular file "
            "(what it pointed to is left as it was)"
        )
    return lane, drift


def drift_error(settings: Settings, drift: Drift) -> QueueError:
    names = ", ".join(drift.drifted) or "none"
    return QueueError(
        f"the checked-in generated lane differs from what the generator makes (families: {names})",
        details=drift.render(),
        untouched="everything: the check generated into a temporary worktree only",
        next_step="run `invoke generate` and commit the result",
    )
