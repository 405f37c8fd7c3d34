"""Upstream sources from verified archives.

``[tool.skippy.archives."<upstream sha>"]`` in pyproject.toml maps an upstream
commit to a source archive that vendors the same tree::

    [tool.skippy.archives."4df29be4f4c3673f428170fda944a5b19f743bb8"]
    url = "pypi-sdist:llama-cpp-python==0.3.35"   # or https://..., or file:...
    sha256 = "1139dbb5..."
    folder = "llama_cpp_python-0.3.35/vendor/llama.cpp"

:func:`import_archive` fetches the archive into a download cache, checks its
sha256 *before* unpacking anything, unpacks it safely into a temporary
directory and turns the named folder into a parentless local commit whose tree
is exactly that folder's content.  The commit has a fixed identity and date,
so the same archive gives the same commit SHA on every machine; it is recorded
under ``refs/skippy/archive/<upstream sha>``.  The repository's work tree and
index are never touched.

The import is made once per cache: in a shared bare repository under the cache dir
(:data:`STORE_NAME` in ``<cache_dir>/git``, created atomically under a file lock), and every
repository that needs it (a new workdir, a temporary store of ``invoke check``, a pin-bump's
repository) gets the commit's objects from there, hard-linked (copied across file systems) as a
local ``git clone`` does, never through alternates: a repository holds its own objects, so
removing the cache never breaks it.

This module commits; the other pieces are modules of their own, usable alone
(the test-bed builds on them): :mod:`skippy.queue.archive_specs` (the table,
validated), :mod:`skippy.queue.archive_fetch` (download + digest check + cache),
:mod:`skippy.queue.archive_unpack` (pure member checks, safe unpacking),
:mod:`skippy.queue.scratch` (scratch folders of live runs), and here
:func:`commit_folder` (tree of a directory -> commit, deterministically).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import filelock

from skippy.core.errors import ArchiveError, LockBusyError
from skippy.core.git import IDENTITY_EMAIL, Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.archive_fetch import FetchContext, Fetcher, cache_path, fetch, fetch_verified
from skippy.queue.archive_specs import ArchiveSpec, check_file_url, load_archive_specs, spec_key
from skippy.queue.archive_unpack import Record, recorded_commit, safe_unpack
from skippy.queue.imports import (
    TRAILER_DIGEST,
    TRAILER_FOLDER,
    TRAILER_UPSTREAM,
    archive_ref,
    parse_trailers,
)
from skippy.queue.scratch import owned_scratch, report_swept, sweep_stale

# the trailers and their reading live in skippy.queue.imports (re-exported here)
__all__ = [
    "IMPORT_DATE",
    "IMPORT_EMAIL",
    "IMPORT_NAME",
    "STORE_NAME",
    "TRAILER_DIGEST",
    "TRAILER_FOLDER",
    "TRAILER_UPSTREAM",
    "archive_commit",
    "archive_ref",
    "check_key",
    "commit_env",
    "commit_folder",
    "import_archive",
    "import_message",
    "parse_trailers",
    "provenance",
    "shared_store",
]

#: the shared object store of imports, in ``<cache_dir>/git``
STORE_NAME: Final = "llama.cpp.git"
#: the object format of the shared store (git's default): a repository of another gets its own import
STORE_FORMAT: Final = "sha1"

#: identity and date of every import commit: the same archive gives the same SHA everywhere
IMPORT_NAME: Final = "skippy archive import"
IMPORT_EMAIL: Final = IDENTITY_EMAIL
#: 2000-01-01T00:00:00Z, in git's raw date format
IMPORT_DATE: Final = "946684800 +0000"

#: config that decides how `git add` turns files into blobs, forced over the repo's own
_TREE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fileMode", "true"),
    ("core.symlinks", "true"),
    ("core.ignoreCase", "false"),
    ("core.precomposeUnicode", "false"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.hooksPath", os.devnull),
    ("gc.auto", "0"),
)
#: in-tree .gitattributes must not rewrite archive bytes (eol, ident, filters, encodings)
_NO_CONVERSION_ATTRIBUTES = "* -text -eol -crlf -ident -filter -working-tree-encoding\n"


def _config_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def commit_env(name: str = IMPORT_NAME, email: str = IMPORT_EMAIL, date: str = IMPORT_DATE) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }


def _absolute(repo: Repo, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (repo.path / path).resolve()


def commit_folder(
    repo: Repo,
    folder: Path,
    message: str,
    *,
    parents: Sequence[str] = (),
    date: str = IMPORT_DATE,
    scratch: Path,
) -> str:
    """A commit in ``repo`` whose tree is exactly ``folder``'s content; its SHA.

    Runs ``git add -A --force`` with a temporary index, ``folder`` as the work
    tree and a scratch git dir that shares ``repo``'s object store, so neither
    the repository's work tree, its index nor its config (filters, attributes)
    take part; in-tree ``.gitattributes`` are overridden so the bytes are
    committed as they are.  Identity and date are fixed: the same folder,
    message, parents and date give the same SHA on every machine.
    """
    objects = _absolute(repo, repo.out("rev-parse", "--git-path", "objects"))
    fmt = repo.git("rev-parse", "--show-object-format", check=False).stdout.strip() or "sha1"
    gitdir = scratch / "git"
    (gitdir / "info").mkdir(parents=True)
    (gitdir / "refs").mkdir()
    (gitdir / "HEAD").write_text("ref: refs/heads/master\n", encoding="ascii")
    (gitdir / "config").write_text(
        f"[core]\n\trepositoryformatversion = 1\n\tbare = false\n[extensions]\n\tobjectformat = {fmt}\n",
        encoding="ascii",
    )
    (gitdir / "info" / "attributes").write_text(_NO_CONVERSION_ATTRIBUTES, encoding="ascii")
    env = {
        "GIT_DIR": str(gitdir),
        "GIT_WORK_TREE": str(folder),
        "GIT_INDEX_FILE": str(scratch / "index"),
        "GIT_OBJECT_DIRECTORY": str(objects),
        **_config_env(_TREE_CONFIG),
        **commit_env(date=date),
    }
    repo.git("-C", folder, "add", "-A", "--force", "--", ".", env=env, what="git add (archive tree)")
    tree = repo.git("write-tree", env=env, what="git write-tree (archive tree)").stdout.strip()
    argv: list[str] = ["commit-tree", tree]
    for parent in parents:
        argv += ["-p", parent]
    argv += ["-F", "-"]
    return repo.git(*argv, env=env, input=message, what="git commit-tree (archive import)").stdout.strip()


def import_message(spec: ArchiveSpec) -> str:
    """The message of an import commit: a subject and the trailers that identify it."""
    return (
        f"Import upstream {spec.upstream_sha[:12]} from a verified archive\n"
        "\n"
        f"{TRAILER_UPSTREAM}: {spec.upstream_sha}\n"
        f"{TRAILER_DIGEST}: {spec.sha256}\n"
        f"{TRAILER_FOLDER}: {spec.folder}\n"
    )


def _recorded(repo: Repo, upstream_sha: str) -> tuple[str, dict[str, str]] | None:
    """``(commit, trailers)`` of the import recorded for ``upstream_sha``, read with one git
    command (``cat-file --batch`` answers the ref with the commit's SHA and its text)."""
    found = repo.git("cat-file", "--batch", input=archive_ref(upstream_sha) + "^{commit}\n", check=False)
    header, _, body = found.stdout.partition("\n")
    fields = header.split()
    if not found.ok or len(fields) != 3 or fields[1] != "commit":
        return None
    trailers = parse_trailers(body.partition("\n\n")[2])
    if trailers.get(TRAILER_UPSTREAM) != upstream_sha:
        return None
    return fields[0], trailers


def archive_commit(repo: Repo, upstream_sha: str) -> str | None:
    """The local commit already imported for ``upstream_sha``, if any."""
    found = _recorded(repo, upstream_sha)
    return found[0] if found else None


def import_archive(
    settings: Settings,
    repo: Repo,
    upstream_sha: str,
    console: Console,
    *,
    python: str | None = None,
    fetcher: Fetcher = fetch,
) -> str:
    """Import the archive mapped to ``upstream_sha`` into ``repo``; the commit SHA.

    Idempotent: when ``refs/skippy/archive/<sha>`` already holds an import of
    the same archive (same digest and folder), that commit is returned without
    fetching anything.
    """
    specs = load_archive_specs(settings)
    spec = specs.get(upstream_sha)
    if spec is None:
        known = ", ".join(s[:12] for s in sorted(specs)) or "none"
        raise ArchiveError(
            f"no archive mapped for {upstream_sha}",
            untouched="everything: nothing was fetched or written",
            next_step=(
                f"add {spec_key(upstream_sha)} with url, sha256 and folder to "
                f"{settings.relative(settings.root / 'pyproject.toml')}"
            ),
            details=f"archives mapped for: {known}",
        )
    check_file_url(settings, spec)
    scratch_root = settings.cache_dir / "tmp"
    report_swept(sweep_stale(scratch_root, "archive-"), scratch_root, console)
    found = _recorded(repo, upstream_sha)
    if found and _same_spec(found[1], spec):
        console.detail(f"archive for {upstream_sha[:12]} already imported as {found[0][:12]}")
        return found[0]
    objects, fmt = repo.out("rev-parse", "--git-path", "objects", "--show-object-format").splitlines()
    if fmt != STORE_FORMAT:
        sha = _import_into(settings, repo, spec, console, python=python, fetcher=fetcher)
    else:
        sha = _from_store(settings, spec, _absolute(repo, objects), console, python=python, fetcher=fetcher)
    repo.git(
        "update-ref",
        "-m",
        f"skippy: import archive {spec.sha256[:12]}",
        archive_ref(upstream_sha),
        sha,
        what="git update-ref (archive import)",
    )
    return sha


def _same_spec(trailers: dict[str, str], spec: ArchiveSpec) -> bool:
    return trailers.get(TRAILER_DIGEST) == spec.sha256 and trailers.get(TRAILER_FOLDER) == spec.folder


def _import_into(
    settings: Settings, repo: Repo, spec: ArchiveSpec, console: Console, *, python: str | None, fetcher: Fetcher
) -> str:
    """Fetch (or take from the download cache), unpack and commit the archive in ``repo``; the
    commit (no ref is written)."""
    ctx = FetchContext.from_settings(settings, console, python=python)
    cache = settings.cache_dir / "archives"
    archive = fetch_verified(spec.url, spec.sha256, cache, ctx, fetcher=fetcher, lock_timeout=settings.lock_timeout)
    check_key(settings, spec, archive)
    upstream_sha = spec.upstream_sha
    with (
        console.step(f"importing upstream {upstream_sha[:12]} from {archive.name}"),
        owned_scratch(settings.cache_dir / "tmp", "archive-", console=console) as tmp,
    ):
        try:
            unpacked = safe_unpack(archive, tmp / "tree", spec.folder, console=console)
            console.info(f"adding the unpacked {unpacked.name} to git (git add, write-tree)")
            sha = commit_folder(repo, unpacked, import_message(spec), scratch=tmp / "scratch")
        except OSError as exc:
            if exc.filename is not None or exc.errno is None:
                raise
            # a write that names no file (tar's copy into the tree): the scratch folder is where
            raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
    console.info(f"imported upstream {upstream_sha[:12]} from archive as {sha[:12]}")
    return sha


def check_key(settings: Settings, spec: ArchiveSpec, archive: Path) -> Record | None:
    """Refuse an archive whose own record names another commit than its key in pyproject.toml
    (a typo in the 40-hex key would otherwise become the upstream SHA of every import, and then
    the pin); the record, or None when the archive records no commit (the key is then taken on
    trust, and :func:`provenance` says so)."""
    record = recorded_commit(archive, spec.folder)
    if record is None or record.commit == spec.upstream_sha:
        return record
    pyproject = settings.relative(settings.root / "pyproject.toml")
    raise ArchiveError(
        f"{pyproject} {spec_key(spec.upstream_sha)}: the archive {spec.url} holds upstream {record.commit}, "
        f"not {spec.upstream_sha} (the key)",
        details=f"the archive records its commit in {record.where}",
        untouched="the repository, the pin and the workdir: nothing was unpacked or committed "
        "(the verified download stays in the cache)",
        next_step=f'rename the table to [tool.skippy.archives."{record.commit}"] in {pyproject} (the key is the '
        f"upstream commit the archive holds), then `invoke prepare --sha {record.commit} --offline`",
    )


def provenance(settings: Settings, upstream_sha: str) -> str:
    """What vouches for ``upstream_sha`` when only its source archive holds it: the archive, its
    digest and (the download still cached) whether the archive's own record names the commit."""
    spec = load_archive_specs(settings).get(upstream_sha)
    if spec is None:
        return "no source archive is mapped for it any more"
    said = f"the source archive {spec.url} (sha256 {spec.sha256[:12]}...)"
    cached = cache_path(settings.cache_dir / "archives", spec.sha256)
    if not cached.is_file():
        return f"{said}; its own record of the commit was not read (the download is no longer cached)"
    record = recorded_commit(cached, spec.folder)
    if record is None:
        return f"{said}; the archive records no commit: the key in pyproject.toml is taken on trust"
    return f"{said}, whose own record ({record.where}) names it"


def shared_store(settings: Settings) -> Path:
    """The bare repository under the cache dir that holds every archive import once."""
    return settings.cache_dir / "git" / STORE_NAME


def _from_store(
    settings: Settings,
    spec: ArchiveSpec,
    objects: Path,
    console: Console,
    *,
    python: str | None,
    fetcher: Fetcher,
) -> str:
    """The import of ``spec``, from the shared store (imported there first when it is not yet, or
    no longer whole), its objects linked into the object directory ``objects``; the commit."""
    store = shared_store(settings)
    store.parent.mkdir(parents=True, exist_ok=True)
    lock = store.parent / f"{STORE_NAME}.lock"
    try:
        with filelock.FileLock(str(lock), timeout=settings.lock_timeout):
            store_repo = Repo(store, settings.env, echo=console.command)
            found = _recorded(store_repo, spec.upstream_sha) if store.is_dir() else None
            sha = found[0] if found and _same_spec(found[1], spec) else None
            linked = _link_import(store_repo, sha, objects) if sha else None
            if sha is not None and linked is None:
                console.warn(
                    f"the shared store {settings.relative(store)} lacks objects of upstream "
                    f"{spec.upstream_sha[:12]} (removed by hand?): importing the archive there again"
                )
            if sha is None or linked is None:
                if not store.is_dir():
                    _create_store(settings, store, console)
                sha = _import_into(settings, store_repo, spec, console, python=python, fetcher=fetcher)
                store_repo.git(
                    "update-ref",
                    "-m",
                    f"skippy: import archive {spec.sha256[:12]}",
                    archive_ref(spec.upstream_sha),
                    sha,
                    what="git update-ref (archive import, shared store)",
                )
                linked = _link_import(store_repo, sha, objects)
                if linked is None:
                    shown = settings.relative(store)
                    raise ArchiveError(
                        f"the import of upstream {spec.upstream_sha[:12]} in the shared store {shown} is not whole "
                        "right after it was made",
                        untouched="the repository being prepared: no ref was written in it",
                        next_step=f"rm -rf {shown} (a cache: the next run makes it again), then run the command again",
                    )
    except filelock.Timeout as exc:
        raise LockBusyError(
            f"another process is importing into the shared store {settings.relative(store)} (lock {exc.lock_file})",
            untouched="everything",
            next_step="wait for it to finish, then run the command again",
        ) from exc
    console.info(
        f"upstream {spec.upstream_sha[:12]} taken from the shared store as {sha[:12]} "
        f"({linked} object file(s) linked, not imported again)"
    )
    return sha


def _create_store(settings: Settings, store: Path, console: Console) -> None:
    """A new, empty bare repository at ``store``: made in a scratch folder, renamed into place."""
    with owned_scratch(store.parent, ".new-", console=console) as tmp:
        made = tmp / STORE_NAME
        Repo(tmp, settings.env, echo=console.command).git(
            "init", "--bare", "--quiet", f"--object-format={STORE_FORMAT}", str(made), what="git init (shared store)"
        )
        made.rename(store)


def _link_import(store: Repo, sha: str, objects: Path) -> int | None:
    """Every object ``sha`` reaches in the store, hard-linked (copied across file systems) into the
    object directory ``objects`` as a local ``git clone`` does: loose files one by one, and the
    store's packs when some are packed (a ``git gc`` ran there).  The number of files linked, or
    None when the store lacks some object (the import is made again there; what was linked is
    valid, content-addressed, and stays)."""
    listed = store.git("rev-list", "--objects", "--no-object-names", sha, check=False)
    if not listed.ok:
        return None
    ids = listed.stdout.split()
    for prefix in {oid[:2] for oid in ids}:
        (objects / prefix).mkdir(parents=True, exist_ok=True)
    # plain strings in this loop: thousands of files, and pathlib's cost per path adds up
    source, target = f"{store.path}/objects", str(objects)
    count = 0
    copy = False
    absent: list[str] = []
    for oid in ids:
        rel = f"/{oid[:2]}/{oid[2:]}"
        try:
            copy = _put(source + rel, target + rel, copy)
            count += 1
        except FileExistsError:
            continue
        except FileNotFoundError:
            absent.append(oid)
    if not absent:
        return count
    checked = store.git("cat-file", "--batch-check=%(objectname)", input="\n".join(absent) + "\n", check=False)
    if not checked.ok or any(line.endswith(" missing") for line in checked.stdout.splitlines()):
        return None
    return count + _link_packs(store.path / "objects" / "pack", objects / "pack", copy)


def _link_packs(source: Path, target: Path, copy: bool) -> int:
    """The packs of ``source`` linked (or copied) into ``target``, each index after its pack (git
    takes a pack up once its index is there); the number of files."""
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    for pack in sorted(source.glob("pack-*.pack")):
        for part in (pack, pack.with_suffix(".rev"), pack.with_suffix(".idx")):
            if part.is_file():
                with contextlib.suppress(FileExistsError):
                    copy = _put(str(part), str(target / part.name), copy)
                    count += 1
    return count


def _put(source: str, target: str, copy: bool) -> bool:
    """``source`` hard-linked at ``target`` or (``copy``, or when the link is refused: another file
    system) copied beside it and renamed into place; whether to copy from now on.  Raises
    FileExistsError when ``target`` is there, FileNotFoundError when ``source`` is not."""
    if not copy:
        try:
            os.link(source, target)
            return False
        except (FileExistsError, FileNotFoundError):
            raise
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
                raise
    final = Path(target)
    if final.exists() or final.is_symlink():
        raise FileExistsError(errno.EEXIST, "already there", target)
    partial = final.with_name(f"tmp_obj_{uuid.uuid4().hex[:12]}")
    try:
        shutil.copyfile(source, partial)
        partial.chmod(0o444)
        partial.replace(final)
    finally:
        partial.unlink(missing_ok=True)
    return True
