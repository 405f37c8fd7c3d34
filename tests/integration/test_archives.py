"""Archive imports into real git repositories (hermetic: see tests/conftest.py)."""

from __future__ import annotations

import gzip
import http.server
import io
import socket
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from skippy.core.errors import ArchiveError, NetworkError
from skippy.core.files import sha256_of
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import archive_fetch, archives
from skippy.queue.archive_fetch import FetchContext
from tests.gitfixtures import git

pytestmark = pytest.mark.integration

UPSTREAM = "4df29be4f4c3673f428170fda944a5b19f743bb8"
FOLDER = "tiny-1.0/vendor/llama.cpp"
#: the fixture archive below is byte-for-byte reproducible ...
TINY_SHA256 = "0a2d4f162eb9d1b41f995b08ad65b9af3c3c29d70054fd4e8ad2f84929fdc9da"
#: ... and so is its import, on every machine
TINY_COMMIT = "c669813b9d9593bf8ac0e94cb62f609f7f7b253a"

TINY_FILES: dict[str, tuple[int, bytes]] = {
    "tiny-1.0/setup.py": (0o644, b"print('not part of the tree')\n"),
    f"{FOLDER}/CMakeLists.txt": (0o644, b"cmake_minimum_required(VERSION 3.14)\nproject(llama)\n"),
    f"{FOLDER}/src/llama-model.cpp": (0o644, b"// model\nint main() { return 0; }\n"),
    f"{FOLDER}/scripts/build.sh": (0o755, b"#!/bin/sh\necho build\n"),
    f"{FOLDER}/.gitignore": (0o644, b"/src/\n*.cpp\n"),
    f"{FOLDER}/.git": (0o644, b"gitdir: ../../.git/modules/vendor/llama.cpp\n"),
}


def make_tar_gz(path: Path, files: dict[str, tuple[int, bytes]], links: dict[str, str] | None = None) -> Path:
    """A reproducible .tar.gz: fixed mtimes, owners and gzip header."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (mode, data) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
        for name, target in sorted((links or {}).items()):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 1_700_000_000
            tar.addfile(info)
    with path.open("wb") as out, gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return path


class CountingFetcher:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, url: str, into: Path, ctx: FetchContext) -> Path:
        self.calls += 1
        return archive_fetch.fetch(url, into, ctx)


def settings_for(root: Path, env: dict[str, str], url: str, sha256: str, folder: str = FOLDER) -> Settings:
    table = {
        "cache_dir": ".deps/cache",
        "network_attempts": 2,
        "network_backoff": 0.0,
        "archives": {UPSTREAM: {"url": url, "sha256": sha256, "folder": folder}},
    }
    return Settings.from_table(root, table, env)


def console() -> Console:
    return Console(stream=io.StringIO())


def new_repo(path: Path, env: dict[str, str], *, bare: bool = False) -> Repo:
    path.mkdir(parents=True)
    git(path, "init", "--quiet", *(["--bare"] if bare else []), "--initial-branch=master", env=env)
    return Repo(path, env=env)


def snapshot(repo: Repo) -> dict[str, str]:
    """Everything an import must not change besides its own ref and objects."""
    state = {
        "refs": repo.out("for-each-ref", "--format=%(refname) %(objectname)"),
        "status": repo.out("status", "--porcelain=v1", "--untracked-files=all", "--ignored"),
        "head": repo.out("symbolic-ref", "HEAD"),
        "objects": repo.out("count-objects", "-v"),
    }
    index = repo.git_dir() / "index"
    state["index"] = index.read_bytes().hex() if index.exists() else ""
    return state


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return make_tar_gz(tmp_path / "tiny-1.0.tar.gz", TINY_FILES, {f"{FOLDER}/docs/model.cpp": "../src/llama-model.cpp"})


@pytest.fixture
def work_repo(tmp_path: Path, git_env: dict[str, str]) -> Repo:
    """A repo with history, a staged change and an untracked file: all must survive an import."""
    repo = new_repo(tmp_path / "work", git_env)
    (repo.path / "mine.txt").write_text("one\n", encoding="utf-8")
    git(repo.path, "add", "mine.txt", env=git_env)
    git(repo.path, "commit", "--quiet", "-m", "mine", env=git_env)
    (repo.path / "mine.txt").write_text("two\n", encoding="utf-8")
    git(repo.path, "add", "mine.txt", env=git_env)
    (repo.path / "scratch.txt").write_text("untracked\n", encoding="utf-8")
    return repo


def test_fixture_archive_is_reproducible(tiny: Path, tmp_path: Path) -> None:
    again = make_tar_gz(tmp_path / "again.tar.gz", TINY_FILES, {f"{FOLDER}/docs/model.cpp": "../src/llama-model.cpp"})
    assert sha256_of(tiny) == sha256_of(again) == TINY_SHA256


def test_import_makes_the_exact_deterministic_commit(
    tiny: Path, tmp_path: Path, work_repo: Repo, git_env: dict[str, str]
) -> None:
    settings = settings_for(tmp_path, git_env, "file:tiny-1.0.tar.gz", TINY_SHA256)
    before = snapshot(work_repo)
    sha = archives.import_archive(settings, work_repo, UPSTREAM, console())

    assert sha == TINY_COMMIT
    assert work_repo.rev_parse(f"refs/skippy/archive/{UPSTREAM}") == sha
    assert archives.archive_commit(work_repo, UPSTREAM) == sha
    tree = work_repo.out("ls-tree", "-r", "--full-tree", sha)
    listing = [(line.split()[0], line.split("\t")[1]) for line in tree.splitlines()]
    assert listing == [
        ("100644", ".gitignore"),
        ("100644", "CMakeLists.txt"),
        ("120000", "docs/model.cpp"),
        ("100755", "scripts/build.sh"),
        ("100644", "src/llama-model.cpp"),
    ]
    assert work_repo.out("cat-file", "blob", f"{sha}:src/llama-model.cpp") == "// model\nint main() { return 0; }"
    assert work_repo.out("cat-file", "blob", f"{sha}:docs/model.cpp") == "../src/llama-model.cpp"
    meta = work_repo.out("log", "-1", "--format=%P|%an <%ae> %ad|%cn <%ce> %cd", "--date=raw", sha)
    who = "skippy archive import <skippy@localhost> 946684800 +0000"
    assert meta == f"|{who}|{who}"
    message = work_repo.out("log", "-1", "--format=%B", sha)
    assert archives.parse_trailers(message) == {
        "Upstream-Commit": UPSTREAM,
        "Archive-SHA256": TINY_SHA256,
        "Archive-Folder": FOLDER,
    }
    after = snapshot(work_repo)
    assert after["status"] == before["status"]
    assert after["index"] == before["index"]
    assert after["head"] == before["head"]
    assert after["refs"] == before["refs"] + f"\nrefs/skippy/archive/{UPSTREAM} {sha}"
    assert (work_repo.path / "mine.txt").read_text(encoding="utf-8") == "two\n"
    assert not any((tmp_path / ".deps" / "cache" / "tmp").iterdir())


def test_same_archive_same_commit_in_a_bare_repo(tiny: Path, tmp_path: Path, git_env: dict[str, str]) -> None:
    settings = settings_for(tmp_path, git_env, tiny.as_uri(), TINY_SHA256)
    bare = new_repo(tmp_path / "bare.git", git_env, bare=True)
    assert archives.import_archive(settings, bare, UPSTREAM, console()) == TINY_COMMIT


def test_second_import_fetches_nothing(tiny: Path, tmp_path: Path, work_repo: Repo, git_env: dict[str, str]) -> None:
    settings = settings_for(tmp_path, git_env, "file:tiny-1.0.tar.gz", TINY_SHA256)
    counting = CountingFetcher()
    first = archives.import_archive(settings, work_repo, UPSTREAM, console(), fetcher=counting)
    assert counting.calls == 1
    # neither the source nor the cache is needed any more: the ref answers
    tiny.unlink()
    for cached in (tmp_path / ".deps" / "cache" / "archives").glob("*.archive"):
        cached.unlink()
    second = archives.import_archive(settings, work_repo, UPSTREAM, console(), fetcher=counting)
    assert second == first
    assert counting.calls == 1


def test_cached_archive_is_reused_for_another_repo(tiny: Path, tmp_path: Path, git_env: dict[str, str]) -> None:
    settings = settings_for(tmp_path, git_env, "file:tiny-1.0.tar.gz", TINY_SHA256)
    counting = CountingFetcher()
    a = archives.import_archive(settings, new_repo(tmp_path / "a", git_env), UPSTREAM, console(), fetcher=counting)
    b = archives.import_archive(settings, new_repo(tmp_path / "b", git_env), UPSTREAM, console(), fetcher=counting)
    assert a == b == TINY_COMMIT
    assert counting.calls == 1


def test_changed_mapping_imports_again(tiny: Path, tmp_path: Path, work_repo: Repo, git_env: dict[str, str]) -> None:
    old = archives.import_archive(
        settings_for(tmp_path, git_env, "file:tiny-1.0.tar.gz", TINY_SHA256), work_repo, UPSTREAM, console()
    )
    changed = dict(TINY_FILES)
    changed[f"{FOLDER}/src/llama-model.cpp"] = (0o644, b"// model v2\n")
    newer = make_tar_gz(tmp_path / "tiny-1.1.tar.gz", changed)
    settings = settings_for(tmp_path, git_env, "file:tiny-1.1.tar.gz", sha256_of(newer))
    new = archives.import_archive(settings, work_repo, UPSTREAM, console())
    assert new != old
    assert work_repo.rev_parse(f"refs/skippy/archive/{UPSTREAM}") == new
    assert work_repo.out("cat-file", "blob", f"{new}:src/llama-model.cpp") == "// model v2"


def test_digest_mismatch_changes_nothing(tiny: Path, tmp_path: Path, work_repo: Repo, git_env: dict[str, str]) -> None:
    wrong = "f" * 64
    settings = settings_for(tmp_path, git_env, "file:tiny-1.0.tar.gz", wrong)
    before = snapshot(work_repo)
    with pytest.raises(ArchiveError) as info:
        archives.import_archive(settings, work_repo, UPSTREAM, console())
    assert f"expected {wrong}" in (info.value.details or "")
    assert f"actual   {TINY_SHA256}" in (info.value.details or "")
    assert snapshot(work_repo) == before
    assert archives.archive_commit(work_repo, UPSTREAM) is None
    cache = tmp_path / ".deps" / "cache"
    assert not list((cache / "archives").glob("*.archive"))
    assert [p.name for p in (cache / "archives" / "quarantine").iterdir()] == [f"{TINY_SHA256}-tiny-1.0.tar.gz"]
    assert not (cache / "tmp").exists() or not any((cache / "tmp").iterdir())


def test_missing_folder_lists_top_level_entries(
    tiny: Path, tmp_path: Path, work_repo: Repo, git_env: dict[str, str]
) -> None:
    settings = settings_for(tmp_path, git_env, "file:tiny-1.0.tar.gz", TINY_SHA256, folder="tiny-1.0/llama.cpp")
    before = snapshot(work_repo)
    with pytest.raises(ArchiveError) as info:
        archives.import_archive(settings, work_repo, UPSTREAM, console())
    assert "'tiny-1.0/llama.cpp' not found" in info.value.what
    assert info.value.details == "top-level entries: tiny-1.0"
    assert snapshot(work_repo) == before


def test_bytes_are_committed_as_they_are_whatever_the_attributes_and_config(
    tmp_path: Path, git_env: dict[str, str]
) -> None:
    """In-tree .gitattributes and a hostile repo config must not rewrite the archive's bytes."""
    files = {
        "t/.gitattributes": (0o644, b"* text eol=crlf ident filter=rot\n"),
        "t/dos.txt": (0o644, b"line one\r\nline two\r\n"),
        "t/id.c": (0o644, b"/* $Id: 0123 $ */\n"),
        "t/run.sh": (0o755, b"#!/bin/sh\n"),
    }
    archive = make_tar_gz(tmp_path / "attrs.tar.gz", files)
    settings = settings_for(tmp_path, git_env, "file:attrs.tar.gz", sha256_of(archive), folder="t")
    clean = new_repo(tmp_path / "clean", git_env)
    hostile = new_repo(tmp_path / "hostile", git_env)
    for key, value in (
        ("core.autocrlf", "true"),
        ("core.fileMode", "false"),
        ("filter.rot.clean", "tr a-z n-za-m"),
        ("filter.rot.required", "true"),
    ):
        git(hostile.path, "config", key, value, env=git_env)
    a = archives.import_archive(settings, clean, UPSTREAM, console())
    b = archives.import_archive(settings, hostile, UPSTREAM, console())
    assert a == b
    for name, (_, data) in files.items():
        blob = hostile.git("cat-file", "blob", f"{b}:{name.removeprefix('t/')}").stdout
        assert blob.encode() == data
    assert hostile.out("ls-tree", b, "run.sh").startswith("100755")


def test_pypi_sdist_goes_through_pip_download(
    tiny: Path, tmp_path: Path, work_repo: Repo, git_env: dict[str, str]
) -> None:
    """The pip boundary: a stand-in interpreter records its argv and drops the sdist into -d."""
    record = tmp_path / "argv.txt"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        f"open({str(record)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
        "dest = sys.argv[sys.argv.index('-d') + 1]\n"
        f"shutil.copy({str(tiny)!r}, dest)\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    settings = settings_for(tmp_path, git_env, "pypi-sdist:tiny==1.0", TINY_SHA256)
    sha = archives.import_archive(settings, work_repo, UPSTREAM, console(), python=str(fake))
    assert sha == TINY_COMMIT
    argv = record.read_text(encoding="utf-8").splitlines()
    assert argv[:4] == ["-m", "pip", "download", "--no-deps"]
    assert argv[-1] == "tiny==1.0"


def test_pip_failure_is_a_network_error(tmp_path: Path, work_repo: Repo, git_env: dict[str, str]) -> None:
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('ERROR: No matching distribution')\nsys.exit(1)\n")
    fake.chmod(0o755)
    settings = settings_for(tmp_path, git_env, "pypi-sdist:tiny==9.9", TINY_SHA256)
    with pytest.raises(NetworkError) as info:
        archives.import_archive(settings, work_repo, UPSTREAM, console(), python=str(fake))
    assert "No matching distribution" in (info.value.details or "")
    assert archives.archive_commit(work_repo, UPSTREAM) is None


# ----------------------------------------------------------------------------- HTTP on loopback


class _Handler(http.server.BaseHTTPRequestHandler):
    plan: ClassVar[list[int]] = []
    body = b""
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        code = type(self).plan.pop(0) if type(self).plan else 200
        self.send_response(code)
        payload = type(self).body if code == 200 else b"nope"
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(tiny: Path) -> Iterator[str]:
    _Handler.plan, _Handler.hits, _Handler.body = [], [], tiny.read_bytes()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def http_ctx(tmp_path: Path, stream: io.StringIO, sleeps: list[float]) -> FetchContext:
    return FetchContext(
        root=tmp_path, env={}, console=Console(stream=stream), attempts=3, backoff=0.5, sleep=sleeps.append, on_ci=True
    )


def test_http_fetch_retries_transient_errors(server: str, tmp_path: Path) -> None:
    _Handler.plan = [503, 502]
    stream = io.StringIO()
    sleeps: list[float] = []
    into = tmp_path / "into"
    into.mkdir()
    got = archive_fetch.fetch_http(f"{server}/files/tiny-1.0.tar.gz", into, http_ctx(tmp_path, stream, sleeps))
    assert got == into / "tiny-1.0.tar.gz"
    assert sha256_of(got) == TINY_SHA256
    assert len(_Handler.hits) == 3
    assert sleeps == [0.5, 1.0]
    out = stream.getvalue()
    assert "HTTP 503" in out and "retry 1/2" in out
    assert "fetching tiny-1.0.tar.gz" in out
    assert "\r" not in out  # CI: plain lines


def test_http_fetch_gives_up_on_not_found(server: str, tmp_path: Path) -> None:
    _Handler.plan = [404]
    sleeps: list[float] = []
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(NetworkError, match="HTTP 404"):
        archive_fetch.fetch_http(f"{server}/missing.tar.gz", into, http_ctx(tmp_path, io.StringIO(), sleeps))
    assert len(_Handler.hits) == 1
    assert sleeps == []
    assert not any(into.iterdir())


def test_http_fetch_gives_up_after_the_attempts(server: str, tmp_path: Path) -> None:
    _Handler.plan = [500, 500, 500]
    sleeps: list[float] = []
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(NetworkError, match="HTTP 500"):
        archive_fetch.fetch_http(f"{server}/a.tar.gz", into, http_ctx(tmp_path, io.StringIO(), sleeps))
    assert len(_Handler.hits) == 3
    assert sleeps == [0.5, 1.0]


def test_unreachable_host_is_retried_then_reported(tmp_path: Path) -> None:
    # a loopback port nobody listens on: connection refused at once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(NetworkError, match="could not fetch"):
        archive_fetch.fetch_http(f"http://127.0.0.1:{port}/a.tgz", into, http_ctx(tmp_path, io.StringIO(), sleeps))
    assert sleeps == [0.5, 1.0]
    assert not any(into.iterdir())
