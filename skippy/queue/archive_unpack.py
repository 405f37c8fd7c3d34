"""Unpacking a source archive safely: every member checked first (pure), then extracted,
then the result scanned again so that nothing resolves outside the chosen folder."""

from __future__ import annotations

import contextlib
import enum
import os
import posixpath
import re
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from skippy.core.errors import ArchiveError
from skippy.core.ui import Console, Progress, human_size

_CHUNK = 1 << 20


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    SPECIAL = "special"  # devices, fifos, sockets, anything else


@dataclass(frozen=True)
class Member:
    """One archive entry, independent of the archive format."""

    name: str
    kind: Kind
    link: str = ""
    executable: bool = False
    #: bytes the entry unpacks to (0 for everything but files)
    size: int = 0


@dataclass(frozen=True)
class UnpackPlan:
    selected: tuple[Member, ...]
    skipped_git: int
    top_level: tuple[str, ...]


def _normalise(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _inside(path: str, folder: str) -> bool:
    return folder in (".", path) or path.startswith(folder + "/")


def _escapes(path: str) -> bool:
    """A normalised relative path that leaves its base."""
    return path == ".." or path.startswith("../") or path.startswith("/")


#: what the selected folder of an archive may unpack to (a llama.cpp tree is ~0.1 GiB): a
#: guard against a decompression bomb, checked from the headers before anything is written
MAX_UNPACKED_BYTES: Final = 4 << 30


@dataclass
class _Scan:
    """What checking one member needs to know of the members before it."""

    folder: str
    symlinks: set[str] = field(default_factory=set)
    seen: dict[str, Kind] = field(default_factory=dict)
    top: set[str] = field(default_factory=set)

    def check(self, member: Member) -> tuple[str | None, str | None]:
        """``(normalised name, None)`` of an acceptable member (name None: the archive root),
        or ``(None, refusal)``."""
        raw = member.name
        if not raw or "\x00" in raw:
            return None, f"{raw!r}: empty or NUL in name"
        if raw.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", raw):
            return None, f"{raw}: absolute path"
        name = _normalise(raw)
        if not name or name == ".":
            return None, None
        parts = name.split("/")
        if ".." in parts:
            return None, f"{raw}: '..' in path"
        self.top.add(parts[0])
        problem = self._path_problem(name, parts, member.kind) or self._kind_problem(name, member)
        return (None, f"{raw}: {problem}") if problem else (name, None)

    def _path_problem(self, name: str, parts: list[str], kind: Kind) -> str | None:
        through = next((p for p in ("/".join(parts[:i]) for i in range(1, len(parts))) if p in self.symlinks), None)
        if through is not None:
            return f"path goes through the symlink {through}"
        if name in self.seen and not (kind is Kind.DIR and self.seen[name] is Kind.DIR):
            return "duplicate entry"
        self.seen[name] = kind
        return None

    def _kind_problem(self, name: str, member: Member) -> str | None:
        base = self.folder if _inside(name, self.folder) else "."
        if member.kind is Kind.SPECIAL:
            return "device, fifo or other special file"
        if member.kind is Kind.SYMLINK:
            self.symlinks.add(name)
            if not member.link or member.link.startswith("/") or "\x00" in member.link:
                return f"symlink to an absolute path {member.link!r}"
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.link))
            if _escapes(resolved) or not _inside(resolved, base):
                return f"symlink points outside {base!r} ({member.link})"
        if member.kind is Kind.HARDLINK:
            target = _normalise(member.link)
            if (
                not target
                or member.link.startswith("/")
                or ".." in target.split("/")
                or not _inside(target, base)
                or self.seen.get(target) is not Kind.FILE
            ):
                return f"hardlink to {member.link!r} outside {base!r} or not an earlier file"
        return None


def plan_unpack(members: Sequence[Member], folder: str, *, max_bytes: int = MAX_UNPACKED_BYTES) -> UnpackPlan:
    """Check every member of an archive and pick those under ``folder`` (pure).

    Refused, for the whole archive: absolute names, ``..`` components, paths
    through a symlink member, duplicate non-directory entries, devices, fifos
    and other special files, symlinks and hardlinks that leave ``folder``
    (or the archive, for members outside ``folder``).  Entries named ``.git``
    are skipped: git can never record them.
    """
    scan = _Scan(folder)
    refusals: list[str] = []
    selected: list[Member] = []
    skipped_git = 0
    for member in members:
        name, refusal = scan.check(member)
        if refusal is not None:
            refusals.append(refusal)
        elif name is None:
            continue
        elif ".git" in name.split("/"):
            skipped_git += 1
        elif _inside(name, folder) and name != folder:
            selected.append(Member(name, member.kind, member.link, member.executable, member.size))
        elif name == folder and member.kind is not Kind.DIR:
            refusals.append(f"{member.name}: the folder {folder!r} is not a directory in the archive")
    _refuse(refusals)
    _check_selected(selected, folder, scan.top, max_bytes)
    return UnpackPlan(tuple(selected), skipped_git, tuple(sorted(scan.top)))


def _refuse(refusals: list[str]) -> None:
    if refusals:
        shown = refusals[:20]
        more = len(refusals) - len(shown)
        raise ArchiveError(
            f"refusing to unpack the archive: {len(refusals)} unsafe member(s)",
            untouched="the repository (nothing was unpacked or committed)",
            next_step="check the archive's origin; do not import it",
            details="\n".join(shown) + (f"\n... and {more} more" if more else ""),
        )


def _check_selected(selected: list[Member], folder: str, top: set[str], max_bytes: int) -> None:
    """The folder was found in the archive and does not unpack to more than ``max_bytes``."""
    if not selected:
        listing = ", ".join(sorted(top)[:30]) or "(empty archive)"
        raise ArchiveError(
            f"folder {folder!r} not found in the archive",
            untouched="the repository (nothing was committed)",
            next_step="set folder in pyproject.toml [tool.skippy.archives] to one of the paths inside the archive",
            details=f"top-level entries: {listing}",
        )
    total = sum(m.size for m in selected if m.kind is Kind.FILE)
    if total > max_bytes:
        raise ArchiveError(
            f"refusing to unpack the archive: {folder!r} would unpack to {human_size(total)}, "
            f"over the {human_size(max_bytes)} limit",
            untouched="the repository (nothing was unpacked or committed)",
            next_step="check that folder names the llama.cpp tree and that the archive is the one intended",
        )


def _tar_member(info: tarfile.TarInfo) -> Member:
    if info.isreg():
        kind = Kind.FILE
    elif info.isdir():
        kind = Kind.DIR
    elif info.issym():
        kind = Kind.SYMLINK
    elif info.islnk():
        kind = Kind.HARDLINK
    else:
        kind = Kind.SPECIAL
    return Member(info.name, kind, info.linkname, bool(info.mode & 0o111), info.size if kind is Kind.FILE else 0)


def _zip_member(info: zipfile.ZipInfo) -> Member:
    mode = info.external_attr >> 16
    if info.is_dir() or stat.S_ISDIR(mode):
        kind = Kind.DIR
    elif stat.S_ISLNK(mode):
        kind = Kind.SYMLINK
    elif mode == 0 or stat.S_ISREG(mode):
        kind = Kind.FILE
    else:
        kind = Kind.SPECIAL
    return Member(info.filename, kind, "", bool(mode & 0o111), info.file_size if kind is Kind.FILE else 0)


def archive_members(archive: Path) -> list[Member]:
    """Every entry of a tar (any compression) or zip archive, format-independent."""
    with _open(archive) as opened:
        if isinstance(opened, tarfile.TarFile):
            return [_tar_member(m) for m in opened.getmembers()]
        members = []
        for info in opened.infolist():
            member = _zip_member(info)
            if member.kind is Kind.SYMLINK:
                member = Member(member.name, member.kind, opened.read(info).decode("utf-8", "replace"))
            members.append(member)
        return members


@contextlib.contextmanager
def _open(archive: Path) -> Iterator[tarfile.TarFile | zipfile.ZipFile]:
    try:
        tar = tarfile.open(archive, "r:*")  # noqa: SIM115 (closed by the `with tar` below)
    except (tarfile.ReadError, EOFError, OSError):
        tar = None
    if tar is not None:
        with tar:
            yield tar
        return
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            yield zf
        return
    raise ArchiveError(
        f"{archive.name} is neither a tar nor a zip archive",
        untouched="the repository (nothing was unpacked)",
        next_step="check the url in pyproject.toml [tool.skippy.archives] points at a source archive",
    )


def read_member_text(archive: Path, name: str) -> str | None:
    """The text of one regular member (e.g. metadata beside the folder), or None."""
    with _open(archive) as opened:
        try:
            if isinstance(opened, tarfile.TarFile):
                info = opened.getmember(name)
                fh = opened.extractfile(info) if info.isreg() else None
                return fh.read().decode("utf-8", "replace") if fh is not None else None
            return opened.read(name).decode("utf-8", "replace")
        except KeyError:
            return None


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Record:
    """The upstream commit an archive says its folder holds, and where it says so."""

    commit: str
    #: a member (a git submodule's ``HEAD``) or the archive's comment (``git archive`` writes the commit there)
    where: str


def submodule_heads(folder: str) -> tuple[str, ...]:
    """The members that would record the commit of ``folder`` when it is a git submodule of a
    superproject inside the archive: ``<super>/.git/modules/<path>/HEAD`` for each split of the
    folder's path (``pkg-1.0/vendor/llama.cpp`` -> ``pkg-1.0/.git/modules/vendor/llama.cpp/HEAD``)."""
    if folder == ".":
        return ()
    parts = folder.split("/")
    return tuple(
        "/".join([*parts[:cut], ".git", "modules", *parts[cut:], "HEAD"]) for cut in range(len(parts) - 1, -1, -1)
    )


def recorded_commit(archive: Path, folder: str) -> Record | None:
    """The commit the archive itself records for ``folder``, or None when it records none.

    Two records are read, in one pass over the archive: the ``HEAD`` of a submodule checkout
    (a source distribution that vendors the tree as a git submodule ships it) and, for a folder
    at the archive's top level, the commit ``git archive`` (and so a forge's release tarball)
    writes as the archive's comment (the pax global header of a tar, the comment of a zip).
    A symbolic ``HEAD`` (``ref: ...``) records no commit."""
    wanted = set(submodule_heads(folder))
    top = folder == "." or "/" not in folder
    found: dict[str, str] = {}
    comment = ""
    with _open(archive) as opened:
        if isinstance(opened, tarfile.TarFile):
            for info in opened:
                name = _normalise(info.name)
                if name in wanted and info.isreg() and info.size <= 4096:
                    fh = opened.extractfile(info)
                    if fh is not None:
                        found[name] = fh.read().decode("utf-8", "replace").strip()
            comment = opened.pax_headers.get("comment", "")
        else:
            for name in wanted & set(opened.namelist()):
                if opened.getinfo(name).file_size <= 4096:
                    found[name] = opened.read(name).decode("utf-8", "replace").strip()
            comment = opened.comment.decode("ascii", "replace")
    for name in submodule_heads(folder):
        if _COMMIT.match(found.get(name, "")):
            return Record(found[name], name)
    if top and _COMMIT.match(comment.strip()):
        return Record(comment.strip(), "the archive's comment (git archive records the commit there)")
    return None


def safe_unpack(archive: Path, dest: Path, folder: str, *, console: Console | None = None) -> Path:
    """Unpack the members under ``folder`` into the empty directory ``dest``; return ``dest/folder``.

    Every member is checked first (:func:`plan_unpack`); tar extraction also
    runs through Python's ``data`` filter, and the result is scanned again so
    that no symlink chain resolves outside the folder.  With ``console``, the
    unpacking shows its progress (bytes written of the folder's size).
    """
    plan = plan_unpack(archive_members(archive), folder)
    root = dest.resolve()
    size = sum(m.size for m in plan.selected if m.kind is Kind.FILE)
    label = posixpath.basename(folder) if folder != "." else archive.name
    progress = console.progress(label, size, verb="unpacking") if console is not None else None
    with _open(archive) as opened, progress if progress is not None else contextlib.nullcontext():
        if isinstance(opened, tarfile.TarFile):
            _extract_tar(opened, root, {m.name for m in plan.selected}, progress)
        else:
            _extract_zip(opened, root, plan, progress)
    top = root / folder if folder != "." else root
    if not top.is_dir():
        raise ArchiveError(
            f"folder {folder!r} is not a directory in the archive",
            untouched="the repository (nothing was committed)",
            next_step="set folder in pyproject.toml [tool.skippy.archives] to a directory inside the archive",
            details="top-level entries: " + ", ".join(plan.top_level),
        )
    _rescan(top)
    return top


def _extract_tar(opened: tarfile.TarFile, root: Path, wanted: set[str], progress: Progress | None) -> None:
    def chosen() -> Iterator[tarfile.TarInfo]:
        for info in opened.getmembers():
            if _normalise(info.name) in wanted:
                yield info  # extracted when the next one is asked for: count it then
                if progress is not None and info.isreg():
                    progress.advance(info.size)

    try:
        opened.extractall(root, members=chosen(), filter="data")
    except tarfile.FilterError as exc:
        raise ArchiveError(
            f"refusing to unpack the archive: {exc}",
            untouched="the repository (nothing was committed)",
            next_step="check the archive's origin; do not import it",
        ) from exc


def _extract_zip(opened: zipfile.ZipFile, root: Path, plan: UnpackPlan, progress: Progress | None) -> None:
    by_name = {_normalise(i.filename): i for i in opened.infolist()}
    for member in plan.selected:
        target = root / member.name
        if member.kind is Kind.DIR:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if member.kind is Kind.SYMLINK:
            target.symlink_to(member.link)
            continue
        with opened.open(by_name[member.name]) as src, target.open("xb") as out:
            shutil.copyfileobj(src, out, _CHUNK)
        target.chmod(0o755 if member.executable else 0o644)
        if progress is not None:
            progress.advance(member.size)


def _rescan(top: Path) -> None:
    real_top = os.path.realpath(top)
    bad: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                real = os.path.realpath(path)
                if real != real_top and not real.startswith(real_top + os.sep):
                    bad.append(f"{path.relative_to(top)}: symlink resolves outside the folder")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                bad.append(f"{path.relative_to(top)}: special file")
    if bad:
        raise ArchiveError(
            "refusing to import the archive: unsafe entries after unpacking",
            untouched="the repository (nothing was committed)",
            next_step="check the archive's origin; do not import it",
            details="\n".join(bad[:20]),
        )
