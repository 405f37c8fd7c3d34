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
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core import gitbulk
from skippy.core.errors import GraphEditError, QueueError
from skippy.core.files import write_bytes_atomic
from skippy.core.git import Repo
from skippy.core.paths import NotSmallFile, enclosing_project, read_small_bytes
from skippy.core.redact import excerpt, name_excerpt, value_excerpt
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cppscan, graphcode, graphedit
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
from skippy.maintain.replay import FIXED_DATE, export_range, replay, sub_queue
from skippy.queue.model import PATCH_LIMIT, Lane, Queue, queue_digest
from skippy.queue.scratch import owned_scratch
from skippy.queue.triage import aside_worktree

GENERATOR_VERSION = "skippy-generated-v3"
SCHEMA = 2
SPEC_NAME = "families.toml"
INPUTS_NAME = "inputs.sha256"
SERIES_NAME = "series"
MODELS_DIR = "src/models"
MODELS_H = "src/models/models.h"
ARCH_CPP = "src/llama-arch.cpp"
MODEL_CPP = "src/llama-model.cpp"

#: the largest spec, inputs manifest or series of the lane read (a patch: the queue's own limit)
LANE_FILE_LIMIT = 1024 * 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_ARCH = re.compile(r"^LLM_ARCH_[A-Z0-9_]+$")
_SPEC_KEYS = frozenset({"schema", "family"})
_FAMILY_KEYS = frozenset({"name", "arch", "paths"})


@dataclass(frozen=True)
class Family:
    name: str
    arch: str
    #: globs (tree-relative, POSIX) of the family's files; empty: its graph builder's file
    paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    path: Path
    data: bytes
    families: tuple[Family, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class ArchFacts:
    arch: str
    gguf_name: str
    model_class: str | None
    #: the file holding the graph builder the class uses, and that builder's class
    builder_file: str | None = None
    builder_class: str | None = None


@dataclass(frozen=True)
class GeneratedLane:
    """The lane's files (name -> bytes) as the generator makes them, and the inputs manifest."""

    files: Mapping[str, bytes]
    manifest: str
    families: tuple[Family, ...] = ()
    #: patch file name -> family name
    owners: Mapping[str, str] = field(default_factory=dict)
    #: family name -> the tree files its patch changes
    shard_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def lane_dir(settings: Settings) -> Path:
    return settings.patch_dir / "generated"


def spec_path(settings: Settings) -> Path:
    return lane_dir(settings) / SPEC_NAME


# --------------------------------------------------------------------------- the spec


def parse_spec(path: Path, data: bytes) -> Spec:
    """Validate the spec; one QueueError listing every problem."""
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QueueError(
            f"{path}: not valid TOML ({exc})", untouched="everything", next_step=f"fix {path.name}"
        ) from exc
    problems: list[str] = []
    _spec_settings(table, problems)
    families = _spec_families(table, problems)
    if problems:
        raise QueueError(
            f"the generated-lane spec {path} is invalid",
            details="\n".join(problems),
            untouched="everything: the generated lane was not changed",
            next_step=f"fix {path.name}, then `invoke generate`",
        )
    return Spec(path, data, tuple(families))


def _spec_settings(table: Mapping[str, Any], problems: list[str]) -> None:
    """Check the spec's top-level keys and schema (problems appended)."""
    if "output_dir" in table:
        problems.append(
            "output_dir is gone: the generator edits each family's own graph code (drop the key, set schema = 2)"
        )
    unknown = sorted(set(table) - _SPEC_KEYS - {"output_dir"})
    if unknown:
        problems.append(
            f"unknown key(s) {', '.join(map(name_excerpt, unknown))} (known: {', '.join(sorted(_SPEC_KEYS))})"
        )
    schema = table.get("schema")
    if schema != SCHEMA:
        was = " (schema 1 was the registration-file generator)" if schema == 1 else ""
        problems.append(f"schema {value_excerpt(schema)} is not supported: write schema = {SCHEMA}{was}")


def _spec_families(table: Mapping[str, Any], problems: list[str]) -> list[Family]:
    """The spec's valid [[family]] entries, in order; a problem appended for each invalid one."""
    raw = table.get("family", [])
    if not isinstance(raw, list):
        problems.append("`family` must be an array of tables ([[family]])")
        raw = []
    families: list[Family] = []
    for index, item in enumerate(raw, start=1):
        family = _spec_family(index, item, families, problems)
        if family is not None:
            families.append(family)
    return families


def _spec_family(index: int, item: object, earlier: Sequence[Family], problems: list[str]) -> Family | None:
    """The spec's family ``index`` if it is valid and new (after the valid ``earlier`` ones); else None and
    its problem appended (an unknown key is a problem too, but does not make the entry unusable)."""
    if not isinstance(item, dict):
        problems.append(f"family {index}: not a table")
        return None
    extra = sorted(set(item) - _FAMILY_KEYS)
    if extra:
        problems.append(f"family {index}: unknown key(s) {', '.join(map(name_excerpt, extra))}")
    name, arch = item.get("name"), item.get("arch")
    problem = _identity_problem(index, name, arch, earlier)
    if problem is not None:
        problems.append(problem)
        return None
    assert isinstance(name, str) and isinstance(arch, str)
    paths = _spec_paths(name, item.get("paths", []), problems)
    if paths is None:
        return None
    return Family(name, arch, paths)


def _identity_problem(index: int, name: object, arch: object, earlier: Sequence[Family]) -> str | None:
    """What is wrong with a family's name and arch (None: nothing)."""
    if not isinstance(name, str) or not _NAME.match(name):
        return f"family {index}: name {value_excerpt(name)} must match [a-z0-9][a-z0-9_-]*"
    if not isinstance(arch, str) or not _ARCH.match(arch):
        return f"family {name}: arch {value_excerpt(arch)} must look like LLM_ARCH_GEMMA3"
    if arch in graphcode.NOT_MODEL_ARCHS:
        return f"family {name}: {arch} is not a model family (it has no graph builder)"
    if any(f.name == name for f in earlier):
        return f"family {name}: declared twice"
    if any(f.arch == arch for f in earlier):
        return f"family {name}: arch {arch} is already declared by another family"
    return None


def _spec_paths(name: str, raw: object, problems: list[str]) -> tuple[str, ...] | None:
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        problems.append(f"family {name}: paths must be a list of tree-relative globs, got {value_excerpt(raw)}")
        return None
    bad = [p for p in raw if p.startswith("/") or ".." in p.split("/") or "\\" in p or p.startswith(".git")]
    if bad:
        problems.append(f"family {name}: paths {', '.join(map(excerpt, bad))} must be relative paths inside the tree")
        return None
    return tuple(raw)


# --------------------------------------------------------------------------- the tree's facts


def arch_facts(
    families: Sequence[Family],
    arch_cpp: str | None,
    model_cpp: str | None,
    *,
    where: str,
    builders: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, ArchFacts]:
    """What the tree says about each family's arch; QueueError naming unknown arches.
    ``builders``: model class -> (file, builder class) (:func:`builder_files`)."""
    names = cppscan.arch_names(arch_cpp or "")
    classes = graphcode.arch_classes((model_cpp or "").encode())
    facts: dict[str, ArchFacts] = {}
    unknown: list[str] = []
    for family in families:
        if family.arch not in names:
            close = difflib.get_close_matches(family.arch, list(names), n=3, cutoff=0.6)
            hint = f" (closest: {', '.join(close)})" if close else ""
            unknown.append(f"family {family.name}: {family.arch} is not in LLM_ARCH_NAMES of {ARCH_CPP}{hint}")
            continue
        model = classes.get(family.arch)
        file, builder = (builders or {}).get(model or "", (None, None))
        facts[family.name] = ArchFacts(family.arch, names[family.arch], model, file, builder)
    if unknown:
        raise QueueError(
            f"{len(unknown)} family arch(es) are unknown to the tree the generated lane applies to ({where})",
            details="\n".join(unknown),
            untouched="everything: the generated lane was not changed",
            next_step="fix the arch names in generated/families.toml (or add the arch in the model_support lane)",
        )
    return facts


def builder_files(tree: Path) -> dict[str, tuple[str, str]]:
    """model class -> (the file of the graph builder it uses, that builder's class), read from the
    tree's ``src/models/*.cpp`` and ``models.h`` with the C++ parser."""
    folder = tree / MODELS_DIR
    own: dict[str, str] = {}
    if folder.is_dir():
        for path in sorted(folder.glob("*.cpp")):
            rel = f"{MODELS_DIR}/{path.name}"
            for family_class, _name, _line in graphcode.find_builders(path.read_bytes()):
                own.setdefault(family_class, rel)
    out = {cls: (rel, cls) for cls, rel in own.items()}
    header = tree / MODELS_H
    if header.is_file():
        for cls, shared in graphcode.shared_graphs(header.read_bytes()).items():
            if cls not in out and shared in own:
                out[cls] = (own[shared], shared)
    return out


# --------------------------------------------------------------------------- the manifest


def identity(generator: Generator, root: Path) -> str:
    return f"builtin {GENERATOR_VERSION}" if generator.builtin else f"command sha256:{generator.digest(root)}"


def input_lines(generator_id: str, spec_sha256: str, upstream_sha: str, lanes: str) -> list[str]:
    return [
        f"generator {generator_id}",
        f"pin {upstream_sha}",
        f"spec {SPEC_NAME} {spec_sha256}",
        f"lanes core+model_support {lanes}",
    ]


def manifest(inputs: Sequence[str], shards: Mapping[str, bytes], *, command: Sequence[str] = ()) -> str:
    """The manifest (``inputs.sha256``): the inputs, their digest, each shard's sha256, the digest of all."""
    inputs_digest = hashlib.sha256("\n".join(inputs).encode() + b"\n").hexdigest()
    lines = [*inputs, f"inputs {inputs_digest}"]
    lines += [f"shard {name} {hashlib.sha256(data).hexdigest()}" for name, data in shards.items()]
    digest = hashlib.sha256("\n".join(lines).encode() + b"\n").hexdigest()
    head = "# the generated lane's inputs and shards; `invoke generate` rewrites this file\n"
    if command:
        head += f"# command: {json.dumps(list(command))}\n"
    return head + "".join(line + "\n" for line in lines) + f"sha256 {digest}\n"


def manifest_lines(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = value
    return out


def inputs_of(manifest_text: str) -> dict[str, str]:
    """The input lines of a manifest (neither the shards nor the digests)."""
    return {k: v for k, v in manifest_lines(manifest_text).items() if not k.startswith("shard ") and k != "sha256"}


def lanes_digest(queue: Queue) -> str:
    return queue_digest(tuple(p for p in queue.patches if p.lane in (Lane.CORE, Lane.MODEL_SUPPORT)))


def expected_inputs(settings: Settings, spec: Spec, upstream_sha: str, queue: Queue) -> dict[str, str]:
    generator = generator_from_settings(settings)
    lines = input_lines(identity(generator, settings.root), spec.sha256, upstream_sha, lanes_digest(queue))
    return inputs_of(manifest(lines, {}))


def patch_name(index: int, family: Family) -> str:
    return f"{index:04d}-family-{family.name}.patch"


# --------------------------------------------------------------------------- the built-in generator


def builtin_edit(tree: Path, families: Sequence[Family], facts: Mapping[str, ArchFacts]) -> dict[str, str]:
    """Put the layer hook in each family's graph builder in ``tree`` (files rewritten in place);
    family -> what was placed.  One QueueError naming every family that cannot be placed."""
    problems: list[str] = []
    done: dict[str, str] = {}
    claimed: dict[str, str] = {}
    for family in families:
        fact = facts[family.name]
        if fact.builder_file is None or fact.builder_class is None:
            why = (
                f"llama_model_mapping in {MODEL_CPP} creates no class for {family.arch}"
                if fact.model_class is None
                else f"no graph builder {fact.model_class}::graph::graph in {MODELS_DIR}/ (nor one it shares)"
            )
            problems.append(f"family {family.name}: {why}")
            continue
        if fact.builder_file in claimed:
            problems.append(
                f"family {family.name}: it uses the graph builder in {fact.builder_file}, which family "
                f"{claimed[fact.builder_file]}'s patch edits already (declare one of them)"
            )
            continue
        claimed[fact.builder_file] = family.name
        path = tree / fact.builder_file
        try:
            edit = graphedit.place_layer_hooks(
                path.read_bytes(), path=fact.builder_file, family_class=fact.builder_class
            )
        except GraphEditError as exc:
            problems.append(f"family {family.name}: {exc.what}")
            continue
        if edit.changed:
            path.write_bytes(edit.source)
        placed = [p for p in edit.placements if not p.done]
        done[family.name] = (
            f"{len(placed)} layer hook(s) in {fact.builder_file} ("
            + ", ".join(f"line {p.line}, {p.how}" for p in placed)
            + ")"
        )
    if problems:
        raise QueueError(
            f"the built-in generator cannot place the layer hook for {len(problems)} family(ies)",
            details="\n".join(problems),
            untouched="everything: the generated lane was not changed",
            next_step="leave those families out of generated/families.toml, or give their layer loop a "
            'cb(cur, "l_out", il) anchor in a model_support patch; then `invoke generate`',
        )
    return done


def family_paths(family: Family, fact: ArchFacts) -> tuple[str, ...]:
    """The globs of the family's files: the spec's, else its graph builder's file."""
    if family.paths:
        return family.paths
    return (fact.builder_file,) if fact.builder_file else ()


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


#: what the built-in generator reads and edits: the sandbox writes only this folder of the tree
#: (its 213 files, 3.5 MB, of the pinned tree's 3,429 files and 169 MB); a command of the user's
#: gets the whole tree, since it may read anything (or configure the build)
BUILTIN_READS = ("src",)


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
        tree = box.tree.path
        facts = arch_facts(
            spec.families,
            _read(tree / ARCH_CPP),
            _read(tree / MODEL_CPP),
            where=f"pin {upstream_sha[:12]} + {len(lower.patches)} lane patch(es)",
            builders=builder_files(tree),
        )
        write_families(box, _families_json(spec.families, facts))
        compile_commands = configure(box, settings, console) if generator.compile_commands else None
        what = _run(
            generator,
            box,
            settings=settings,
            console=console,
            families=spec.families,
            facts=facts,
            compile_commands=compile_commands,
            attempt="first pass",
        )
        changed = changed_files(box.tree)
        owners = split_by_family(changed, spec.families, facts)
        result = _commit_all(box.tree, "generated: all families (first pass)")
        second = Sandbox(box.root, box.tree, result)
        _run(
            generator,
            second,
            settings=settings,
            console=console,
            families=spec.families,
            facts=facts,
            compile_commands=compile_commands,
            attempt="second pass",
        )
        again = changed_files(second.tree)
        if again:
            raise QueueError(
                f"the generator is not idempotent: a second pass over its own result changed {len(again)} file(s)",
                details="\n".join(f"{status} {path}" for path, status in sorted(again.items())),
                untouched=UNTOUCHED,
                next_step="make the generator recognise its own edits (a second run must change nothing), "
                "then `invoke generate`",
            )
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


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _run(
    generator: Generator,
    box: Sandbox,
    *,
    settings: Settings,
    console: Console,
    families: Sequence[Family],
    facts: Mapping[str, ArchFacts],
    compile_commands: Path | None,
    attempt: str,
) -> dict[str, str]:
    """One pass of the generator over the sandbox's tree; family -> what it did (for the commit)."""
    if generator.builtin:
        return builtin_edit(box.tree.path, families, facts)
    run_generator(generator, box, settings, console, compile_commands=compile_commands, attempt=attempt)
    return {}


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


def _read_lane_file(path: Path, inside: Path | None) -> bytes | None:
    """The bytes of one file of the generated lane, or None when it is not a regular file
    inside the project (never read: a link out of the project counts as a file that differs)."""
    container = inside or enclosing_project(path.parent) or path.parent.resolve()
    limit = LANE_FILE_LIMIT if not path.name.endswith(".patch") else PATCH_LIMIT
    try:
        return read_small_bytes(path, limit, inside=container)
    except (NotSmallFile, FileNotFoundError):
        return None


def recorded_inputs(settings: Settings) -> dict[str, str] | None:
    """The input lines of the lane's manifest on disk (None: no readable manifest)."""
    path = lane_dir(settings) / INPUTS_NAME
    data = _read_lane_file(path, settings.root) if os.path.lexists(path) else None
    return None if data is None else inputs_of(data.decode("utf-8", errors="replace"))


def lane_files_on_disk(folder: Path, *, inside: Path | None = None) -> dict[str, bytes | None]:
    """The lane's patches and series on disk: name -> bytes (None for one that is not a regular
    file inside the project ``inside``: it is never read, and differs from anything)."""
    if not folder.is_dir():
        return {}
    return {
        p.name: _read_lane_file(p, inside)
        for p in sorted(folder.iterdir())
        if p.is_file() and (p.name.endswith(".patch") or p.name == SERIES_NAME)
    }


def write_lane(folder: Path, lane: GeneratedLane) -> list[str]:
    """Replace the lane's patches, series and inputs manifest (the spec stays); the names of the
    files that were symlinks (each replaced by a regular file, never written through: its target,
    wherever it is, is left as it was)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {*lane.files, INPUTS_NAME}
    links = sorted(name for name in written if (folder / name).is_symlink())
    # stale patches go, and the links among the names (a dangling one is not is_file(): the write
    # would create its target)
    dangling = {p.name for p in folder.iterdir() if p.is_symlink() and _lane_file(p.name)}
    for name in {*lane_files_on_disk(folder), *dangling, *links}:
        (folder / name).unlink()
    for name, data in lane.files.items():
        write_bytes_atomic(folder / name, data)
    write_bytes_atomic(folder / INPUTS_NAME, lane.manifest.encode("utf-8"))
    return links


def _lane_file(name: str) -> bool:
    return name.endswith(".patch") or name == SERIES_NAME


@dataclass(frozen=True)
class Drift:
    drifted: tuple[str, ...]  # family names whose patch differs or is missing
    extra: tuple[str, ...]  # checked-in patch files no family makes
    series: bool
    inputs: tuple[str, ...]  # manifest inputs that changed (or "missing")
    #: family name -> the tree files its patch changes (as the generator makes it now)
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.drifted or self.extra or self.series or self.inputs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "drifted_families": list(self.drifted),
            "drifted_files": {name: list(self.files.get(name, ())) for name in self.drifted},
            "extra_patches": list(self.extra),
            "series_differs": self.series,
            "changed_inputs": list(self.inputs),
        }

    def render(self) -> str:
        if self.ok:
            return "generated lane: up to date"
        lines = ["generated lane: DRIFTED"]
        if self.drifted:
            lines.append(f"  families whose patch differs: {', '.join(self.drifted)}")
        if self.extra:
            lines.append(f"  patches no family makes: {', '.join(self.extra)}")
        if self.series:
            lines.append("  series differs")
        if self.inputs:
            lines.append(f"  inputs changed since the last `invoke generate`: {', '.join(self.inputs)}")
        return "\n".join(lines)


def compare_lane(folder: Path, lane: GeneratedLane, *, inside: Path | None = None) -> Drift:
    """What differs between the lane on disk (files inside the project ``inside`` only) and ``lane``."""
    on_disk = lane_files_on_disk(folder, inside=inside)
    drifted = [lane.owners[n] for n in lane.owners if on_disk.get(n) != lane.files[n]]
    extra = sorted(n for n in on_disk if n.endswith(".patch") and n not in lane.files)
    series = on_disk.get(SERIES_NAME, b"") != lane.files.get(SERIES_NAME, b"")
    recorded_path = folder / INPUTS_NAME
    data = _read_lane_file(recorded_path, inside) if os.path.lexists(recorded_path) else None
    recorded = manifest_lines(data.decode("utf-8", errors="replace")) if data is not None else None
    if recorded is None:
        missing = not os.path.lexists(recorded_path)
        inputs = [f"{INPUTS_NAME} {'missing' if missing else 'not a regular file of the project (not read)'}"]
    else:
        wanted = manifest_lines(lane.manifest)
        inputs = [k for k in wanted if k != "sha256" and not k.startswith("shard ") and recorded.get(k) != wanted[k]]
        inputs += [f"{k} (no longer read)" for k in recorded if k not in wanted and not k.startswith("shard ")]
        # a shard whose recorded digest is not the checked-in patch's: the patch was edited by hand
        for name, family in lane.owners.items():
            got = on_disk.get(name)
            key = f"shard {name}"
            edited = got is not None and key in recorded and recorded[key] != hashlib.sha256(got).hexdigest()
            if edited and family not in drifted:
                drifted.append(family)
    return Drift(tuple(drifted), tuple(extra), series, tuple(inputs), dict(lane.shard_files))


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
