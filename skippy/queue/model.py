"""The patch queue: three lanes, validated before anything is touched.

Lanes, in application order:

* ``core``: ``<patch_dir>/NNNN-*.patch``, sorted, numbered 0001.. contiguously;
* ``model_support``: ``<patch_dir>/model_support/series``;
* ``generated``: ``<patch_dir>/generated/series``.

Nothing else may sit in the patch dir: an entry the queue does not know (a
lane folder spelled ``model-support``, a ``.diff`` beside the core patches) is
a violation that names it, so no patch is ever skipped in silence.  Known
besides the patches: the lane folders and their ``series``, the generated
lane's spec and inputs manifest, TOML files at the top (the parity allowlist,
whatever its configured name), a README and VCS/OS housekeeping files.  A patch that is a
symlink must resolve inside its own lane folder.

Every file of the queue is read through :func:`skippy.core.paths.read_small_bytes`: a regular
file inside the project (no link out of it: a ``series`` linked to ``/etc/shadow`` or
``/proc/self/environ`` is refused, never read), read with a bound.  A message quotes a line
of a series only as a short, redacted excerpt.

The queue digest (sha256 over lane, file name and bytes, in application order)
identifies the queue in stamps, build provenance and reports.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from skippy.core.errors import QueueError
from skippy.core.paths import NotSmallFile, enclosing_project, read_small_bytes
from skippy.core.redact import excerpt, name_excerpt
from skippy.queue.patchpaths import paths_outside_the_tree

DIGEST_SCHEMA = b"skippy-queue-v1\n"
NUMBERED = re.compile(r"^(?P<num>\d{4})-(?P<slug>[^/\\]+)\.patch$")
_HEADER_LIMIT = 64 * 1024
#: the largest series file read (a line per patch)
SERIES_LIMIT = 1024 * 1024
#: the largest patch file read
PATCH_LIMIT = 64 * 1024 * 1024
#: a series entry shown as it is (longer or odder ones are quoted as a short excerpt)
#: housekeeping files tolerated anywhere in the patch dir (and README, README.md ...)
HOUSEKEEPING: frozenset[str] = frozenset({".gitkeep", ".gitignore", ".gitattributes", ".DS_Store"})
#: files the project itself keeps in a lane folder besides the patches and ``series``
#: (generated: the spec and the inputs manifest of :mod:`skippy.maintain.generate`)
LANE_FILES: dict[str, frozenset[str]] = {
    "model_support": frozenset(),
    "generated": frozenset({"families.toml", "inputs.sha256"}),
}


class Lane(enum.Enum):
    CORE = "core"
    MODEL_SUPPORT = "model_support"
    GENERATED = "generated"

    @property
    def folder(self) -> str | None:
        """Sub-folder of the patch dir, or None for the top level."""
        return None if self is Lane.CORE else self.value


LANES: tuple[Lane, ...] = (Lane.CORE, Lane.MODEL_SUPPORT, Lane.GENERATED)


@dataclass(frozen=True)
class Patch:
    lane: Lane
    path: Path
    number: int
    data: bytes

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        return f"{self.lane.value}/{self.name}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def subject(self) -> str:
        return mail_subject(self.data)


@dataclass(frozen=True)
class Violation:
    lane: Lane
    file: Path
    line: int | None
    problem: str
    fix: str

    def render(self, root: Path) -> str:
        try:
            shown = self.file.relative_to(root)
        except ValueError:
            shown = self.file
        where = f"{shown}:{self.line}" if self.line else str(shown)
        return f"[{self.lane.value}] {where}: {self.problem}\n    fix: {self.fix}"


@dataclass(frozen=True)
class Queue:
    root: Path
    patches: tuple[Patch, ...]
    digest: str

    def lane(self, lane: Lane) -> tuple[Patch, ...]:
        return tuple(p for p in self.patches if p.lane is lane)

    def describe(self) -> dict[str, object]:
        return {
            "digest": self.digest,
            "patches": {lane.value: [p.name for p in self.lane(lane)] for lane in LANES},
        }


def queue_digest(patches: tuple[Patch, ...]) -> str:
    h = hashlib.sha256(DIGEST_SCHEMA)
    for patch in patches:
        name = patch.name.encode("utf-8")
        h.update(patch.lane.value.encode() + b"\0" + name + b"\0")
        h.update(str(len(patch.data)).encode() + b"\0")
        h.update(patch.data)
    return h.hexdigest()


def load_queue(patch_dir: Path, *, inside: Path | None = None) -> Queue:
    """Read and validate the whole queue; raise one QueueError listing every violation.

    Every file read must lie inside ``inside`` once its links are followed: by default the
    project holding the patch dir (the nearest folder above it, as written, with a
    ``pyproject.toml``), else the patch dir itself.
    """
    if not patch_dir.is_dir():
        raise QueueError(
            f"patch dir {patch_dir} does not exist or is not a directory",
            untouched="everything: no checkout was read or written",
            next_step="create it (an empty queue is fine) or point LLAMA_PATCH_DIR / "
            "[tool.skippy] patch_dir at the queue",
        )
    container = inside or enclosing_project(patch_dir) or patch_dir.resolve()
    violations: list[Violation] = []
    patches: list[Patch] = []
    violations += unknown_entries(patch_dir)
    patches += _load_core(patch_dir, violations, container)
    for lane in (Lane.MODEL_SUPPORT, Lane.GENERATED):
        patches += _load_series_lane(patch_dir, lane, violations, container)
    if violations:
        body = "\n".join(v.render(patch_dir) for v in violations)
        raise QueueError(
            f"the patch queue in {patch_dir} is invalid ({len(violations)} problem"
            f"{'s' if len(violations) != 1 else ''})",
            details=body,
            untouched="the llama.cpp workdir and the queue: nothing was applied",
            next_step="fix the files named above, then re-run `invoke prepare`",
        )
    ordered = tuple(patches)
    return Queue(root=patch_dir, patches=ordered, digest=queue_digest(ordered))


def _read_queue_file(lane: Lane, path: Path, limit: int, container: Path, violations: list[Violation]) -> bytes | None:
    """The bytes of one file of the queue, or None with a violation naming what it is instead
    (not a regular file, a link out of the project, too big): never a word of its content."""
    try:
        return read_small_bytes(path, limit, inside=container)
    except (NotSmallFile, FileNotFoundError) as exc:
        why = exc.why if isinstance(exc, NotSmallFile) else "missing"
    where = path.parent.name + "/" if lane.folder is not None else "the patch dir"
    violations.append(
        Violation(
            lane,
            path,
            None,
            f"refused, not read: it is {why}",
            f"make it a regular file in {where} (the queue reads no file from outside the project)",
        )
    )
    return None


def queue_file_bytes(path: Path, limit: int = PATCH_LIMIT, *, inside: Path | None = None) -> bytes | None:
    """The bytes of one file of the queue read outside :func:`load_queue` (the old side of a
    range-diff, a comparison), or None when it is missing or not a regular file inside the
    project ``inside`` (by default the one holding it): such a file is never read."""
    container = inside or enclosing_project(path.parent) or path.parent.resolve()
    try:
        return read_small_bytes(path, limit, inside=container)
    except (NotSmallFile, FileNotFoundError):
        return None


def _load_core(patch_dir: Path, violations: list[Violation], container: Path) -> list[Patch]:
    files = sorted(p for p in patch_dir.iterdir() if p.name.endswith(".patch"))
    patches: list[Patch] = []
    seen: dict[int, Path] = {}
    for path in files:
        match = NUMBERED.match(path.name)
        if not path.is_file():
            violations.append(Violation(Lane.CORE, path, None, "is not a regular file", "replace it with a patch file"))
            continue
        if match is None:
            violations.append(
                Violation(
                    Lane.CORE,
                    path,
                    None,
                    "core patch names must look like NNNN-subject.patch",
                    f"rename it, e.g. {len(files):04d}-{_slug(path.stem)}.patch",
                )
            )
            continue
        number = int(match["num"])
        if number in seen:
            violations.append(
                Violation(
                    Lane.CORE,
                    path,
                    None,
                    f"number {number:04d} is also used by {seen[number].name}",
                    "renumber the core patches so each number is used once",
                )
            )
            continue
        seen[number] = path
        if not _resolves_inside(path, patch_dir):
            violations.append(_escaping_link(Lane.CORE, path, None, "the patch dir"))
            continue
        data = _read_queue_file(Lane.CORE, path, PATCH_LIMIT, container, violations)
        if data is None:
            continue
        _check_mailbox(Lane.CORE, path, data, violations)
        patches.append(Patch(Lane.CORE, path, number, data))
    _check_contiguous(Lane.CORE, [(p.number, p.path, None) for p in patches], violations)
    return patches


def _load_series_lane(patch_dir: Path, lane: Lane, violations: list[Violation], container: Path) -> list[Patch]:
    assert lane.folder is not None
    folder = patch_dir / lane.folder
    if not folder.exists():
        return []
    if not folder.is_dir():
        violations.append(Violation(lane, folder, None, "is not a directory", "remove it or make it a lane folder"))
        return []
    on_disk = {p.name for p in folder.iterdir() if p.name.endswith(".patch")}
    series = folder / "series"
    if not os.path.lexists(series):
        if on_disk:
            violations.append(
                Violation(
                    lane,
                    series,
                    None,
                    f"missing, but the folder holds {len(on_disk)} patch file(s)",
                    f"create {lane.folder}/series listing them in order, one per line",
                )
            )
        return []
    data = _read_queue_file(lane, series, SERIES_LIMIT, container, violations)
    if data is None:
        return []
    listed, entries = _read_series(lane, series, data, on_disk, violations)
    for name in sorted(on_disk - set(listed)):
        violations.append(
            Violation(
                lane,
                folder / name,
                None,
                "is not listed in series",
                f"add {name} to {lane.folder}/series or delete the file",
            )
        )
    return _series_patches(lane, series, entries, violations, container)


def _read_series(
    lane: Lane, series: Path, data: bytes, on_disk: set[str], violations: list[Violation]
) -> tuple[dict[str, int], list[tuple[int, str]]]:
    """Every entry of ``series`` (its bytes: ``data``) with its line (``listed``) and the usable
    ones, in order (``entries``)."""
    listed: dict[str, int] = {}
    entries: list[tuple[int, str]] = []
    text = data.decode("utf-8", errors="replace")
    for lineno, raw in enumerate(text.splitlines(), start=1):
        entry = raw.rstrip("\r").strip()
        if not entry or entry.startswith("#"):
            continue
        problem = _series_entry_problem(lane, entry, listed)
        if problem is None:
            listed[entry] = lineno
            if entry not in on_disk:
                problem = (
                    f"{name_excerpt(entry)} does not exist in {lane.folder}/",
                    "add the patch file or remove the line",
                )
        if problem is not None:
            violations.append(Violation(lane, series, lineno, *problem))
        else:
            entries.append((lineno, entry))
    return listed, entries


def _series_entry_problem(lane: Lane, entry: str, listed: dict[str, int]) -> tuple[str, str] | None:
    """What is wrong with the form of one series line, and its fix (the first rule that fails)."""
    if entry.startswith("/") or "/" in entry or "\\" in entry or entry in (".", "..") or ".." in entry.split("/"):
        return (
            f"entry {excerpt(entry)} is not a plain file name in {lane.folder}/",
            "list patches by file name only; keep them in the lane folder",
        )
    if " " in entry or "\t" in entry:
        return f"entry {excerpt(entry)} carries options or spaces", "one patch file name per line, no quilt options"
    if entry in listed:
        return f"{name_excerpt(entry)} is listed again (first on line {listed[entry]})", "remove the duplicate line"
    return None


def _series_patches(
    lane: Lane, series: Path, entries: list[tuple[int, str]], violations: list[Violation], container: Path
) -> list[Patch]:
    """The patches of the listed entries, each named ``NNNN-subject.patch`` and numbered in order."""
    folder = series.parent
    patches: list[Patch] = []
    numbered: list[tuple[int, Path, int | None]] = []
    for lineno, entry in entries:
        path = folder / entry
        match = NUMBERED.match(entry)
        if match is None:
            violations.append(
                Violation(
                    lane,
                    series,
                    lineno,
                    f"{name_excerpt(entry)} is not named NNNN-subject.patch",
                    "rename the patch with its position in the series",
                )
            )
            continue
        number = int(match["num"])
        numbered.append((number, path, lineno))
        if not _resolves_inside(path, folder):
            violations.append(_escaping_link(lane, series, lineno, f"{lane.folder}/", name=entry))
            continue
        data = _read_queue_file(lane, path, PATCH_LIMIT, container, violations)
        if data is None:
            continue
        _check_mailbox(lane, path, data, violations)
        patches.append(Patch(lane, path, number, data))
    _check_contiguous(lane, numbered, violations, series=series)
    return patches


def unknown_entries(patch_dir: Path) -> list[Violation]:
    """Entries of the patch dir (and of its lane folders) that belong to no lane and no known file."""
    found: list[Violation] = []
    lane_names = {lane.folder: lane for lane in LANES if lane.folder is not None}
    for path in sorted(patch_dir.iterdir()):
        name = path.name
        if name in lane_names or _is_housekeeping(path) or name.endswith(".patch"):
            continue  # the lanes validate these
        if name.endswith(".toml") and path.is_file():
            continue  # configuration kept beside the queue (the parity allowlist)
        found.append(_unknown(Lane.CORE, path, _guess(name)))
    for folder_name, lane in lane_names.items():
        folder = patch_dir / folder_name
        if not folder.is_dir():
            continue
        known = {"series", *LANE_FILES.get(folder_name, frozenset())}
        for path in sorted(folder.iterdir()):
            if path.name in known or _is_housekeeping(path) or (path.name.endswith(".patch") and not path.is_dir()):
                continue
            found.append(_unknown(lane, path, f"{folder_name}/ holds only its series and .patch files"))
    return found


def _is_housekeeping(path: Path) -> bool:
    """VCS/OS files and a README (a note for humans, never a patch)."""
    if path.name in HOUSEKEEPING:
        return True
    stem, _, ext = path.name.partition(".")
    return stem.upper() == "README" and ext in ("", "md", "txt", "rst") and path.is_file()


def _guess(name: str) -> str:
    lowered = re.sub(r"[^a-z]", "", name.lower())
    for lane in LANES:
        if lane.folder is not None and lowered == lane.folder.replace("_", "") and name != lane.folder:
            return f"a lane folder is spelled exactly {lane.folder}/: rename it (git mv {name} {lane.folder})"
    if name.endswith((".diff", ".mbox", ".eml", ".txt")) or "." not in name:
        return (
            "core patches are mailbox files named NNNN-subject.patch (`git format-patch` output): "
            "re-export or rename it, or move it out of the patch dir"
        )
    return "move it out of the patch dir (only the lanes and their files live there)"


def _unknown(lane: Lane, path: Path, fix: str) -> Violation:
    kind = "folder" if path.is_dir() else "file"
    return Violation(lane, path, None, f"unknown {kind}: it belongs to no lane and would be ignored", fix)


def _resolves_inside(path: Path, folder: Path) -> bool:
    """True unless ``path`` is a symlink whose target is not a file directly in ``folder``."""
    if not path.is_symlink():
        return True
    return Path(os.path.realpath(path)).parent == Path(os.path.realpath(folder))


def _escaping_link(lane: Lane, file: Path, line: int | None, where: str, *, name: str | None = None) -> Violation:
    link = file if name is None else file.parent / name
    return Violation(
        lane,
        file,
        line,
        f"{'' if name is None else name + ' '}is a symlink to {os.path.realpath(link)}, outside {where}",
        f"copy the patch into {where} (the queue must not read files from elsewhere)",
    )


def _check_contiguous(
    lane: Lane,
    numbered: list[tuple[int, Path, int | None]],
    violations: list[Violation],
    series: Path | None = None,
) -> None:
    for expected, (number, path, lineno) in enumerate(numbered, start=1):
        if number != expected:
            violations.append(
                Violation(
                    lane,
                    series if series is not None else path,
                    lineno,
                    f"{path.name} is number {number:04d} but position {expected} "
                    f"expects {expected:04d} (numbers run 0001.. without gaps"
                    f"{', in series order' if series is not None else ''})",
                    "renumber the patches (git format-patch --start-number 1 does this)",
                )
            )
            return


def _check_mailbox(lane: Lane, path: Path, data: bytes, violations: list[Violation]) -> None:
    head = data[:_HEADER_LIMIT].decode("utf-8", errors="replace")
    lines = head.splitlines()
    header_end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    headers = lines[:header_end]
    has_from = any(line.startswith("From: ") for line in headers)
    has_subject = any(line.startswith("Subject: ") for line in headers)
    if not (has_from and has_subject):
        missing = [h for h, ok in (("From:", has_from), ("Subject:", has_subject)) if not ok]
        violations.append(
            Violation(
                lane,
                path,
                1,
                f"not a mailbox patch: header block lacks {' and '.join(missing)}",
                "export it with `git format-patch` (a plain `git diff` cannot be applied with `git am`)",
            )
        )
        return
    text = data.decode("utf-8", errors="replace")
    if not re.search(r"^diff --git ", text, flags=re.MULTILINE):
        violations.append(
            Violation(
                lane,
                path,
                header_end + 1,
                "has headers but no `diff --git` section",
                "re-export it with `git format-patch`; empty commits do not belong in the queue",
            )
        )
    for lineno, outside in paths_outside_the_tree(text):
        violations.append(
            Violation(
                lane,
                path,
                lineno,
                f"malformed: it names {excerpt(outside)}, a path outside the llama.cpp tree (a patch's paths are "
                "relative to the tree's root; git refuses this one on every upstream)",
                "fix this patch file: name the file inside the tree (diff --git a/<path> b/<path>), or re-export "
                "the change with `git format-patch` from a commit of the workdir",
            )
        )


def mail_subject(data: bytes) -> str:
    text = data[:_HEADER_LIMIT].decode("utf-8", errors="replace")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            break
        if line.startswith("Subject: "):
            subject = line[len("Subject: ") :]
            for cont in lines[i + 1 :]:
                if cont.startswith((" ", "\t")):
                    subject += " " + cont.strip()
                else:
                    break
            return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject).strip()
    return ""


def _slug(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", stem).strip("-").lower() or "patch"
