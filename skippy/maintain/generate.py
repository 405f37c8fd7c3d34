"""The generated lane: one patch per model family, derived from declared inputs.

Inputs:

* the spec ``<patch_dir>/generated/families.toml``::

      schema = 1
      output_dir = "src/skippy-families"   # optional, inside the llama.cpp tree

      [[family]]
      name = "gemma3"                      # [a-z0-9_-], unique
      arch = "LLM_ARCH_GEMMA3"             # must be named in src/llama-arch.cpp

* the tree the lane applies to (the pin with the core and model_support lanes),
  from which the generator reads ``src/llama-arch.cpp`` (the arch's GGUF name,
  from ``LLM_ARCH_NAMES``; an unknown arch fails, naming the closest ones) and
  ``src/llama-model.cpp`` (the model class ``llama_model_mapping`` creates for
  it, when the tree has that mapping).

Output, in ``<patch_dir>/generated/``: ``NNNN-family-<name>.patch`` (in spec
order) and ``series``.  Family patch N adds ``<output_dir>/<name>.cpp`` (the
family's registration record) and appends the family to
``<output_dir>/families.def`` (the registry, created by the first family).
Each patch is a commit made in a temporary worktree on top of
pin+core+model_support with a fixed identity and date, exported with the
lanes' fixed ``git format-patch`` options: the same inputs give the same bytes.

``inputs.sha256`` records the digest of every input (generator version, pin,
spec bytes, the core+model_support lanes' digest, and the blob ids of the
upstream files read), so ``invoke regenerate`` knows when the lane is stale
and ``invoke generate --check`` can say why it drifted.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.core.errors import QueueError
from skippy.core.files import write_bytes_atomic
from skippy.core.git import Repo
from skippy.core.paths import NotSmallFile, enclosing_project, read_small_bytes
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain import cscan
from skippy.queue.model import PATCH_LIMIT, Lane, Queue, queue_digest
from skippy.queue.replay import FIXED_DATE, blob_id, export_commit, read_text, replay, sub_queue
from skippy.queue.triage import aside_worktree

GENERATOR_VERSION = "skippy-generated-v2"
SPEC_NAME = "families.toml"
INPUTS_NAME = "inputs.sha256"
SERIES_NAME = "series"
DEFAULT_OUTPUT_DIR = "src/skippy-families"
REGISTRY_NAME = "families.def"
#: upstream files the generator reads (their blob ids are inputs)
READS: tuple[str, ...] = ("src/llama-arch.cpp", "src/llama-model.cpp")

#: the largest spec, inputs manifest or series of the lane read (a patch: the queue's own limit)
LANE_FILE_LIMIT = 1024 * 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_ARCH = re.compile(r"^LLM_ARCH_[A-Z0-9_]+$")
_SPEC_KEYS = frozenset({"schema", "output_dir", "family"})
_FAMILY_KEYS = frozenset({"name", "arch"})


@dataclass(frozen=True)
class Family:
    name: str
    arch: str

    @property
    def ident(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class Spec:
    path: Path
    data: bytes
    output_dir: str
    families: tuple[Family, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class ArchFacts:
    arch: str
    gguf_name: str
    model_class: str | None


@dataclass(frozen=True)
class GeneratedLane:
    """The lane's files (name -> bytes) as the generator makes them, and the inputs manifest."""

    files: Mapping[str, bytes]
    manifest: str
    families: tuple[Family, ...] = ()
    #: patch file name -> family name
    owners: Mapping[str, str] = field(default_factory=dict)


def lane_dir(settings: Settings) -> Path:
    return settings.patch_dir / "generated"


def spec_path(settings: Settings) -> Path:
    return lane_dir(settings) / SPEC_NAME


# --------------------------------------------------------------------------- pure parts


def parse_spec(path: Path, data: bytes) -> Spec:
    """Validate the spec; one QueueError listing every problem."""
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QueueError(
            f"{path}: not valid TOML ({exc})", untouched="everything", next_step=f"fix {path.name}"
        ) from exc
    problems: list[str] = []
    output_dir = _spec_settings(table, problems)
    families = _spec_families(table, problems)
    if problems:
        raise QueueError(
            f"the generated-lane spec {path} is invalid",
            details="\n".join(problems),
            untouched="everything: the generated lane was not changed",
            next_step=f"fix {path.name}, then `invoke generate`",
        )
    return Spec(path, data, output_dir, tuple(families))


def _spec_settings(table: Mapping[str, Any], problems: list[str]) -> str:
    """Check the spec's top-level keys, schema and output_dir (problems appended); the output_dir to use."""
    unknown = sorted(set(table) - _SPEC_KEYS)
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_SPEC_KEYS))})")
    if table.get("schema", 1) != 1:
        problems.append(f"schema {table.get('schema')!r} is not supported (this generator reads schema 1)")
    output_dir = table.get("output_dir", DEFAULT_OUTPUT_DIR)
    if (
        not isinstance(output_dir, str)
        or not output_dir
        or output_dir.startswith("/")
        or ".." in output_dir.split("/")
        or "\\" in output_dir
    ):
        problems.append(f"output_dir {output_dir!r} must be a relative path inside the tree")
        return DEFAULT_OUTPUT_DIR
    return output_dir


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
        problems.append(f"family {index}: unknown key(s) {', '.join(extra)}")
    name, arch = item.get("name"), item.get("arch")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"family {index}: name {name!r} must match [a-z0-9][a-z0-9_-]*")
        return None
    if not isinstance(arch, str) or not _ARCH.match(arch):
        problems.append(f"family {name}: arch {arch!r} must look like LLM_ARCH_GEMMA3")
        return None
    if any(f.name == name for f in earlier):
        problems.append(f"family {name}: declared twice")
        return None
    if any(f.arch == arch for f in earlier):
        problems.append(f"family {name}: arch {arch} is already declared by another family")
        return None
    return Family(name, arch)


def arch_facts(
    families: Sequence[Family], arch_cpp: str | None, model_cpp: str | None, *, where: str
) -> dict[str, ArchFacts]:
    """What the tree says about each family's arch; QueueError naming unknown arches."""
    names = cscan.arch_names(arch_cpp or "")
    classes = dict(re.findall(r"case\s+(LLM_ARCH_\w+)\s*:\s*return\s+new\s+(\w+)\s*\(", model_cpp or ""))
    facts: dict[str, ArchFacts] = {}
    unknown: list[str] = []
    for family in families:
        if family.arch not in names:
            close = difflib.get_close_matches(family.arch, list(names), n=3, cutoff=0.6)
            hint = f" (closest: {', '.join(close)})" if close else ""
            unknown.append(f"family {family.name}: {family.arch} is not in LLM_ARCH_NAMES of src/llama-arch.cpp{hint}")
            continue
        facts[family.name] = ArchFacts(family.arch, names[family.arch], classes.get(family.arch))
    if unknown:
        raise QueueError(
            f"{len(unknown)} family arch(es) are unknown to the tree the generated lane applies to ({where})",
            details="\n".join(unknown),
            untouched="everything: the generated lane was not changed",
            next_step="fix the arch names in generated/families.toml (or add the arch in the model_support lane)",
        )
    return facts


def render_family(spec: Spec, family: Family, facts: ArchFacts) -> str:
    model = facts.model_class or ""
    return (
        f"// Generated by skippy ({GENERATOR_VERSION}) from the queue's generated/{SPEC_NAME}: do not edit,\n"
        "// run `invoke generate`.\n"
        f'// Family {family.name}: arch {facts.arch}, GGUF name "{facts.gguf_name}"'
        + (f", model class {model}" if model else "")
        + ".\n"
        # family_info comes from the core lane's header: a struct defined in every family file
        # breaks a unity build of src/ (upstream builds llama that way), where they meet in one unit
        '#include "../skippy-hooks.h"\n'
        "\n"
        "namespace skippy_families {\n"
        "\n"
        f"extern const family_info {family.ident};\n"
        f'const family_info {family.ident} = {{ {facts.arch}, "{facts.gguf_name}", "{model}" }};\n'
        "\n"
        "}  // namespace skippy_families\n"
    )


def registry_header() -> str:
    return (
        f"// Generated by skippy ({GENERATOR_VERSION}): one SKIPPY_FAMILY(ident, arch, gguf name) per family.\n"
        "// Include it with SKIPPY_FAMILY defined; do not edit, run `invoke generate`.\n"
    )


def registry_line(family: Family, facts: ArchFacts) -> str:
    return f'SKIPPY_FAMILY({family.ident}, {facts.arch}, "{facts.gguf_name}")\n'


def commit_message(family: Family, facts: ArchFacts) -> str:
    return (
        f"generated: family {family.name}\n\n"
        f'Arch {facts.arch} (GGUF name "{facts.gguf_name}")'
        + (f", model class {facts.model_class}" if facts.model_class else "")
        + f".\nGenerated by skippy ({GENERATOR_VERSION}) from generated/{SPEC_NAME}.\n"
    )


def patch_name(index: int, family: Family) -> str:
    return f"{index:04d}-family-{family.name}.patch"


def manifest(spec_sha256: str, upstream_sha: str, lanes_digest: str, blobs: Mapping[str, str | None]) -> str:
    """The inputs manifest (``inputs.sha256``): one line per input, then their digest."""
    lines = [
        f"generator {GENERATOR_VERSION}",
        f"pin {upstream_sha}",
        f"spec {SPEC_NAME} {spec_sha256}",
        f"lanes core+model_support {lanes_digest}",
        *(f"upstream {path} {blobs.get(path) or 'missing'}" for path in sorted(blobs)),
    ]
    digest = hashlib.sha256("\n".join(lines).encode() + b"\n").hexdigest()
    return (
        "# inputs of the generated lane; `invoke generate` rewrites this file\n"
        + "".join(line + "\n" for line in lines)
        + f"sha256 {digest}\n"
    )


def manifest_lines(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = value
    return out


def lanes_digest(queue: Queue) -> str:
    return queue_digest(tuple(p for p in queue.patches if p.lane in (Lane.CORE, Lane.MODEL_SUPPORT)))


# --------------------------------------------------------------------------- execution


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


def expected_manifest(spec: Spec, repo: Repo, base: str, upstream_sha: str, queue: Queue) -> str:
    blobs = {path: blob_id(repo, base, path) for path in READS}
    return manifest(spec.sha256, upstream_sha, lanes_digest(queue), blobs)


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
    text = expected_manifest(spec, repo, base, upstream_sha, queue)
    if not spec.families:
        return GeneratedLane({}, text)
    lower = sub_queue(queue, (Lane.CORE, Lane.MODEL_SUPPORT))
    tip = replay(settings, repo, base, lower, console=console).patched
    facts = arch_facts(
        spec.families,
        read_text(repo, tip, READS[0]),
        read_text(repo, tip, READS[1]),
        where=f"pin {upstream_sha[:12]} + {len(lower.patches)} lane patch(es)",
    )
    files: dict[str, bytes] = {}
    owners: dict[str, str] = {}
    git_dir = Path(repo.out("rev-parse", "--absolute-git-dir"))
    env = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}
    with aside_worktree(repo, git_dir, tip) as aside:
        out = aside.path / spec.output_dir
        registry = out / REGISTRY_NAME
        for index, family in enumerate(spec.families, start=1):
            out.mkdir(parents=True, exist_ok=True)
            source = out / f"{family.name}.cpp"
            source.write_text(render_family(spec, family, facts[family.name]), encoding="utf-8")
            current = registry.read_text(encoding="utf-8") if registry.exists() else registry_header()
            registry.write_text(current + registry_line(family, facts[family.name]), encoding="utf-8")
            rel = [str(p.relative_to(aside.path)) for p in (source, registry)]
            aside.git("add", "--", *rel)
            aside.git("commit", "--quiet", "--no-verify", "-m", commit_message(family, facts[family.name]), env=env)
            head = aside.head()
            assert head is not None
            name = patch_name(index, family)
            files[name] = export_commit(aside, head)
            owners[name] = family.name
    files[SERIES_NAME] = "".join(n + "\n" for n in owners).encode()
    return GeneratedLane(files, text, spec.families, owners)


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

    @property
    def ok(self) -> bool:
        return not (self.drifted or self.extra or self.series or self.inputs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "drifted_families": list(self.drifted),
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
    series = on_disk.get(SERIES_NAME) != lane.files.get(SERIES_NAME)
    recorded_path = folder / INPUTS_NAME
    data = _read_lane_file(recorded_path, inside) if os.path.lexists(recorded_path) else None
    recorded = manifest_lines(data.decode("utf-8", errors="replace")) if data is not None else None
    if recorded is None:
        missing = not os.path.lexists(recorded_path)
        inputs = [f"{INPUTS_NAME} {'missing' if missing else 'not a regular file of the project (not read)'}"]
    else:
        wanted = manifest_lines(lane.manifest)
        inputs = [k for k in wanted if k != "sha256" and recorded.get(k) != wanted[k]]
        inputs += [f"{k} (no longer read)" for k in recorded if k not in wanted]
    return Drift(tuple(drifted), tuple(extra), series, tuple(inputs))


def run_generate(
    settings: Settings, *, console: Console, check: bool = False, checkout: Path | None = None, offline: bool = False
) -> tuple[GeneratedLane, Drift]:
    """``invoke generate`` (rewrite the lane) or ``invoke generate --check`` (QueueError on drift)."""
    from skippy.queue.model import load_queue
    from skippy.queue.replay import pinned_store

    spec = load_spec(settings)
    if spec is None:
        raise QueueError(
            f"there is no generated-lane spec at {settings.relative(spec_path(settings))}",
            untouched="everything",
            next_step=f"write {settings.relative(spec_path(settings))} (schema = 1, [[family]] name/arch entries)",
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
