"""Archive specs, safe unpacking and the verified download cache (no git, no network)."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from skippy.core.errors import ArchiveError, SettingsError
from skippy.core.files import sha256_of
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import archive_fetch, archive_specs, archive_unpack, archives
from skippy.queue.archive_fetch import FetchContext
from skippy.queue.archive_specs import ArchiveSpec
from skippy.queue.archive_unpack import Kind, Member

SHA = "4df29be4f4c3673f428170fda944a5b19f743bb8"
DIGEST = "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12"
ROOT = Path(__file__).resolve().parents[2]


def good_entry(**over: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "url": "pypi-sdist:llama-cpp-python==0.3.35",
        "sha256": DIGEST,
        "folder": "llama_cpp_python-0.3.35/vendor/llama.cpp",
    }
    entry.update(over)
    return {k: v for k, v in entry.items() if v is not None}


def quiet() -> Console:
    return Console(stream=io.StringIO())


# ----------------------------------------------------------------------------- specs


def test_parse_valid_spec() -> None:
    specs = archive_specs.parse_archive_specs({SHA: good_entry()})
    spec = specs[SHA]
    assert spec == ArchiveSpec(
        SHA, "pypi-sdist:llama-cpp-python==0.3.35", DIGEST, "llama_cpp_python-0.3.35/vendor/llama.cpp"
    )
    assert spec.kind is archive_specs.UrlKind.PYPI_SDIST
    assert archive_specs.pypi_requirement(spec.url) == "llama-cpp-python==0.3.35"


def test_no_table_means_no_specs() -> None:
    assert archive_specs.parse_archive_specs(None) == {}


@pytest.mark.parametrize(
    ("key", "entry", "names"),
    [
        ("4df29be", good_entry(), '[tool.skippy.archives."4df29be"]'),
        (SHA.upper(), good_entry(), "40-hex lowercase"),
        (SHA, good_entry(url=None), f'[tool.skippy.archives."{SHA}"] url'),
        (SHA, good_entry(sha256=None), f'[tool.skippy.archives."{SHA}"] sha256'),
        (SHA, good_entry(extra="x"), f'[tool.skippy.archives."{SHA}"] extra'),
        (SHA, good_entry(url="ftp://example.invalid/a.tgz"), "unsupported URL"),
        (SHA, good_entry(url="pypi-sdist:llama-cpp-python"), "NAME==VERSION"),
        (SHA, good_entry(url="pypi-sdist:llama-cpp-python>=0.3"), "NAME==VERSION"),
        (SHA, good_entry(url="file://otherhost/a.tgz"), "remote host"),
        (SHA, good_entry(sha256="abc"), "64 lowercase hex"),
        (SHA, good_entry(sha256=DIGEST.upper()), "64 lowercase hex"),
        (SHA, good_entry(folder="../vendor"), "relative path"),
        (SHA, good_entry(folder="/abs/vendor"), "relative path"),
        (SHA, good_entry(folder="a//b"), "relative path"),
        (SHA, good_entry(folder=3), "non-empty string"),
        (SHA, "not a table", "must be a table"),
    ],
)
def test_invalid_specs_name_the_key(key: str, entry: object, names: str) -> None:
    with pytest.raises(SettingsError) as info:
        archive_specs.parse_archive_specs({key: entry})
    assert names in info.value.what
    assert info.value.next_step


def test_archives_must_be_a_table() -> None:
    with pytest.raises(SettingsError, match=r"\[tool.skippy.archives\] must be a table"):
        archive_specs.parse_archive_specs(["x"])


def test_load_archive_specs_reads_settings_subtable(tmp_path: Path) -> None:
    settings = Settings.from_table(tmp_path, {"archives": {SHA: good_entry(folder="tree/")}}, env={})
    specs = archive_specs.load_archive_specs(settings)
    assert list(specs) == [SHA]
    assert specs[SHA].folder == "tree"


def test_project_maps_its_pin_to_an_archive() -> None:
    """The shipped pyproject.toml maps the pinned upstream to llama-cpp-python 0.3.35."""
    settings = Settings.load(ROOT, env={})
    pin = settings.pin_file.read_text(encoding="utf-8").strip()
    spec = archive_specs.load_archive_specs(settings)[pin]
    assert spec.url == "pypi-sdist:llama-cpp-python==0.3.35"
    assert spec.sha256 == DIGEST
    assert spec.folder == "llama_cpp_python-0.3.35/vendor/llama.cpp"


def test_file_urls(tmp_path: Path) -> None:
    assert archive_specs.file_url_path("file:///srv/a.tgz", tmp_path) == Path("/srv/a.tgz")
    assert archive_specs.file_url_path("file://localhost/srv/a.tgz", tmp_path) == Path("/srv/a.tgz")
    assert archive_specs.file_url_path("file:cache/a.tgz", tmp_path) == tmp_path / "cache" / "a.tgz"
    assert archive_specs.file_url_path("file:///srv/with%20space.tgz", tmp_path) == Path("/srv/with space.tgz")


def test_pip_download_argv_is_a_plain_sdist_download(tmp_path: Path) -> None:
    argv = archive_fetch.pip_download_argv("/py/bin/python", "llama-cpp-python==0.3.35", tmp_path, attempts=3)
    assert argv[:4] == ["/py/bin/python", "-m", "pip", "download"]
    assert argv[-1] == "llama-cpp-python==0.3.35"
    joined = " ".join(argv)
    assert "--no-deps" in argv
    assert "--no-binary llama-cpp-python " in joined
    assert ":all:" not in joined
    assert f"-d {tmp_path}" in joined
    assert "--retries 2" in joined


def test_missing_mapping_names_pyproject_and_key(tmp_path: Path) -> None:
    settings = Settings.from_table(tmp_path, {"archives": {SHA: good_entry()}}, env={})
    other = "e3546c7948e3af463d0b401e6421d5a4c2faf565"
    # the repo does not exist: the mapping is checked before git or the network is used
    repo = Repo(tmp_path / "no-such-repo", env={})
    with pytest.raises(ArchiveError) as info:
        archives.import_archive(settings, repo, other, quiet())
    err = info.value
    assert err.what == f"no archive mapped for {other}"
    assert err.next_step is not None
    assert f'[tool.skippy.archives."{other}"]' in err.next_step
    assert "pyproject.toml" in err.next_step
    assert not (tmp_path / "no-such-repo").exists()
    assert not (tmp_path / ".deps").exists()


# ----------------------------------------------------------------------------- plan (pure)


def test_plan_selects_the_folder_and_skips_git_entries() -> None:
    members = [
        Member("pkg-1/setup.py", Kind.FILE),
        Member("pkg-1/vendor/llama.cpp", Kind.DIR),
        Member("pkg-1/vendor/llama.cpp/README.md", Kind.FILE),
        Member("./pkg-1/vendor/llama.cpp/src/run.sh", Kind.FILE, executable=True),
        Member("pkg-1/vendor/llama.cpp/.git", Kind.FILE),
        Member("pkg-1/vendor/llama.cpp/docs/latest", Kind.SYMLINK, "../README.md"),
    ]
    plan = archive_unpack.plan_unpack(members, "pkg-1/vendor/llama.cpp")
    assert [m.name for m in plan.selected] == [
        "pkg-1/vendor/llama.cpp/README.md",
        "pkg-1/vendor/llama.cpp/src/run.sh",
        "pkg-1/vendor/llama.cpp/docs/latest",
    ]
    assert plan.skipped_git == 1
    assert plan.top_level == ("pkg-1",)


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (Member("../evil", Kind.FILE), "'..' in path"),
        (Member("top/../../evil", Kind.FILE), "'..' in path"),
        (Member("/etc/evil", Kind.FILE), "absolute path"),
        (Member("C:/evil", Kind.FILE), "absolute path"),
        (Member("top/dev", Kind.SPECIAL), "device, fifo"),
        (Member("top/link", Kind.SYMLINK, "/etc/passwd"), "absolute path"),
        (Member("top/link", Kind.SYMLINK, "../../outside"), "outside"),
        (Member("top/hard", Kind.HARDLINK, "/etc/passwd"), "hardlink"),
        (Member("top/hard", Kind.HARDLINK, "other/file"), "hardlink"),
    ],
)
def test_plan_refuses_unsafe_members(member: Member, reason: str) -> None:
    members = [Member("top/ok.txt", Kind.FILE), Member("other/file", Kind.FILE), member]
    with pytest.raises(ArchiveError) as info:
        archive_unpack.plan_unpack(members, "top")
    assert reason in (info.value.details or "")
    assert "nothing was unpacked" in (info.value.untouched or "")


def test_plan_refuses_symlink_leaving_the_folder_even_inside_the_archive() -> None:
    members = [Member("top/a", Kind.FILE), Member("secret", Kind.FILE), Member("top/s", Kind.SYMLINK, "../secret")]
    with pytest.raises(ArchiveError, match="unsafe"):
        archive_unpack.plan_unpack(members, "top")


def test_plan_refuses_writing_through_a_symlink_and_duplicates() -> None:
    through = [Member("top/d", Kind.SYMLINK, "sub"), Member("top/sub", Kind.DIR), Member("top/d/x", Kind.FILE)]
    with pytest.raises(ArchiveError) as info:
        archive_unpack.plan_unpack(through, "top")
    assert "through the symlink top/d" in (info.value.details or "")
    dup = [Member("top/x", Kind.FILE), Member("top/x", Kind.SYMLINK, "y")]
    with pytest.raises(ArchiveError, match="unsafe"):
        archive_unpack.plan_unpack(dup, "top")


def test_plan_refuses_a_folder_that_unpacks_past_the_limit() -> None:
    members = [
        Member("top/a", Kind.FILE, size=600),
        Member("top/b", Kind.FILE, size=500),
        Member("big", Kind.FILE, size=9),
    ]
    assert len(archive_unpack.plan_unpack(members, "top", max_bytes=1100).selected) == 2  # only the folder counts
    with pytest.raises(ArchiveError, match=r"would unpack to 1\.1 KiB, over the 1\.1 KiB limit") as info:
        archive_unpack.plan_unpack(members, "top", max_bytes=1099)
    assert "nothing was unpacked" in (info.value.untouched or "")
    assert archive_unpack.MAX_UNPACKED_BYTES >= 1 << 30


def test_plan_reports_a_missing_folder_with_top_level_entries() -> None:
    members = [Member("pkg-2/setup.py", Kind.FILE), Member("pkg-2/vendor/x.c", Kind.FILE), Member("LICENSE", Kind.FILE)]
    with pytest.raises(ArchiveError) as info:
        archive_unpack.plan_unpack(members, "pkg-1/vendor/llama.cpp")
    assert "'pkg-1/vendor/llama.cpp' not found" in info.value.what
    assert info.value.details == "top-level entries: LICENSE, pkg-2"


# ----------------------------------------------------------------------------- real archives


def _info(name: str, **attrs: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def make_tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def regular(name: str, data: bytes = b"x\n", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, mode=mode), data


def make_zip(path: Path, entries: list[tuple[str, int, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, mode, data in entries:
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


def assert_nothing_unpacked(dest: Path, tmp_path: Path) -> None:
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "outside").exists()


EVIL_TARS: dict[str, list[tuple[tarfile.TarInfo, bytes | None]]] = {
    "traversal": [regular("top/ok"), regular("top/../../evil")],
    "absolute": [regular("top/ok"), regular("/tmp/skippy-evil-absolute")],
    "symlink-out": [regular("top/ok"), (_info("top/link", type=tarfile.SYMTYPE, linkname="../../outside"), None)],
    "symlink-absolute": [regular("top/ok"), (_info("top/link", type=tarfile.SYMTYPE, linkname="/etc"), None)],
    "hardlink-out": [regular("top/ok"), (_info("top/hard", type=tarfile.LNKTYPE, linkname="../outside"), None)],
    "hardlink-absolute": [regular("top/ok"), (_info("top/hard", type=tarfile.LNKTYPE, linkname="/etc/passwd"), None)],
    "device": [regular("top/ok"), (_info("top/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3), None)],
    "fifo": [regular("top/ok"), (_info("top/pipe", type=tarfile.FIFOTYPE), None)],
    "write-through-symlink": [
        (_info("top/d", type=tarfile.SYMTYPE, linkname="."), None),
        regular("top/d/x"),
    ],
}


@pytest.mark.parametrize("case", sorted(EVIL_TARS))
def test_evil_tar_is_refused_and_nothing_unpacked(tmp_path: Path, case: str) -> None:
    archive = make_tar(tmp_path / f"{case}.tar.gz", EVIL_TARS[case])
    dest = tmp_path / "dest" / "tree"
    with pytest.raises(ArchiveError, match="refusing"):
        archive_unpack.safe_unpack(archive, dest, "top")
    assert_nothing_unpacked(dest, tmp_path)


def test_symlink_chain_escape_is_refused(tmp_path: Path) -> None:
    """Each link looks harmless lexically; together they leave the folder."""
    archive = make_tar(
        tmp_path / "chain.tar.gz",
        [
            regular("top/p/ok"),
            (_info("top/p/d", type=tarfile.SYMTYPE, linkname=".."), None),
            (_info("top/p/e", type=tarfile.SYMTYPE, linkname="d/.."), None),
        ],
    )
    with pytest.raises(ArchiveError, match="refusing"):
        archive_unpack.safe_unpack(archive, tmp_path / "dest", "top")


def test_symlink_chain_escape_in_zip_is_refused(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "chain.zip",
        [
            ("top/p/ok", stat.S_IFREG | 0o644, b"ok"),
            ("top/p/d", stat.S_IFLNK | 0o777, b".."),
            ("top/p/e", stat.S_IFLNK | 0o777, b"d/.."),
        ],
    )
    with pytest.raises(ArchiveError, match="refusing"):
        archive_unpack.safe_unpack(archive, tmp_path / "dest", "top")


@pytest.mark.parametrize(
    "entry",
    [
        ("../evil", stat.S_IFREG | 0o644, b"evil"),
        ("/tmp/skippy-evil-zip", stat.S_IFREG | 0o644, b"evil"),
        ("top/link", stat.S_IFLNK | 0o777, b"../../outside"),
        ("top/dev", stat.S_IFCHR | 0o644, b""),
        ("top/fifo", stat.S_IFIFO | 0o644, b""),
    ],
    ids=["traversal", "absolute", "symlink-out", "device", "fifo"],
)
def test_evil_zip_is_refused(tmp_path: Path, entry: tuple[str, int, bytes]) -> None:
    archive = make_zip(tmp_path / "evil.zip", [("top/ok", stat.S_IFREG | 0o644, b"ok"), entry])
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError, match="refusing"):
        archive_unpack.safe_unpack(archive, dest, "top")
    assert_nothing_unpacked(dest, tmp_path)
    assert not Path("/tmp/skippy-evil-zip").exists()


def test_good_tar_unpacks_only_the_folder_with_modes_and_links(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "good.tar.gz",
        [
            regular("pkg/setup.py"),
            regular("pkg/vendor/tree/README.md", b"readme\n"),
            regular("pkg/vendor/tree/tools/run.sh", b"#!/bin/sh\n", mode=0o755),
            (_info("pkg/vendor/tree/docs", type=tarfile.SYMTYPE, linkname="README.md"), None),
            (_info("pkg/vendor/tree/copy.md", type=tarfile.LNKTYPE, linkname="pkg/vendor/tree/README.md"), None),
            regular("pkg/vendor/tree/.git", b"gitdir: ../../.git/modules/tree\n"),
        ],
    )
    top = archive_unpack.safe_unpack(archive, tmp_path / "dest", "pkg/vendor/tree")
    assert top == (tmp_path / "dest" / "pkg" / "vendor" / "tree").resolve()
    assert sorted(p.relative_to(top).as_posix() for p in top.rglob("*")) == [
        "README.md",
        "copy.md",
        "docs",
        "tools",
        "tools/run.sh",
    ]
    assert (top / "docs").is_symlink()
    assert (top / "docs").readlink() == Path("README.md")
    assert (top / "copy.md").read_bytes() == b"readme\n"
    assert (top / "tools" / "run.sh").stat().st_mode & 0o111
    assert not (top / "README.md").stat().st_mode & 0o111
    assert not (tmp_path / "dest" / "pkg" / "setup.py").exists()


def test_good_zip_unpacks(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "good.zip",
        [
            ("repo-main/a.txt", stat.S_IFREG | 0o644, b"a\n"),
            ("repo-main/bin/x", stat.S_IFREG | 0o755, b"#!/bin/sh\n"),
            ("repo-main/l", stat.S_IFLNK | 0o777, b"a.txt"),
        ],
    )
    top = archive_unpack.safe_unpack(archive, tmp_path / "dest", "repo-main")
    assert (top / "a.txt").read_bytes() == b"a\n"
    assert (top / "bin" / "x").stat().st_mode & 0o111
    assert (top / "l").readlink() == Path("a.txt")


def test_not_an_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00not an archive" * 10)
    with pytest.raises(ArchiveError, match="neither a tar nor a zip"):
        archive_unpack.safe_unpack(junk, tmp_path / "dest", ".")


def test_read_member_text(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar.gz", [regular("pkg/.git/modules/x/HEAD", b"abc\n")])
    assert archive_unpack.read_member_text(archive, "pkg/.git/modules/x/HEAD") == "abc\n"
    assert archive_unpack.read_member_text(archive, "pkg/missing") is None


# ----------------------------------------------------------------------------- verified cache


def ctx_for(tmp_path: Path, console: Console | None = None) -> FetchContext:
    return FetchContext(root=tmp_path, env={}, console=console or quiet(), attempts=2, backoff=0.0)


class CountingFetcher:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, url: str, into: Path, ctx: FetchContext) -> Path:
        self.calls.append(url)
        return archive_fetch.fetch(url, into, ctx)


def test_fetch_verified_caches_by_digest(tmp_path: Path) -> None:
    source = make_tar(tmp_path / "src.tar.gz", [regular("top/a")])
    digest = sha256_of(source)
    counting = CountingFetcher()
    cache = tmp_path / "cache"
    first = archive_fetch.fetch_verified("file:src.tar.gz", digest, cache, ctx_for(tmp_path), fetcher=counting)
    second = archive_fetch.fetch_verified("file:src.tar.gz", digest, cache, ctx_for(tmp_path), fetcher=counting)
    assert first == second == cache / f"{digest}.archive"
    assert counting.calls == ["file:src.tar.gz"]
    assert sha256_of(first) == digest
    assert not [p for p in cache.iterdir() if p.name.startswith(".fetch-")]


def test_fetch_verified_refetches_a_corrupted_cache_entry(tmp_path: Path) -> None:
    source = make_tar(tmp_path / "src.tar.gz", [regular("top/a")])
    digest = sha256_of(source)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{digest}.archive").write_bytes(b"truncated")
    counting = CountingFetcher()
    out = archive_fetch.fetch_verified("file:src.tar.gz", digest, cache, ctx_for(tmp_path), fetcher=counting)
    assert counting.calls == ["file:src.tar.gz"]
    assert out.read_bytes() == source.read_bytes()


def test_digest_mismatch_quarantines_and_caches_nothing(tmp_path: Path) -> None:
    source = make_tar(tmp_path / "src.tar.gz", [regular("top/a")])
    actual = sha256_of(source)
    wanted = "0" * 64
    cache = tmp_path / "cache"
    with pytest.raises(ArchiveError) as info:
        archive_fetch.fetch_verified("file:src.tar.gz", wanted, cache, ctx_for(tmp_path))
    err = info.value
    assert "does not match its sha256" in err.what
    assert f"expected {wanted}" in (err.details or "")
    assert f"actual   {actual}" in (err.details or "")
    assert not (cache / f"{wanted}.archive").exists()
    assert [p.name for p in (cache / "quarantine").iterdir()] == [f"{actual}-src.tar.gz"]
    assert not [p for p in cache.iterdir() if p.name.startswith(".fetch-")]
    assert source.exists()


def test_missing_local_archive(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="not found"):
        archive_fetch.fetch_verified("file:nope.tar.gz", "0" * 64, tmp_path / "cache", ctx_for(tmp_path))


def test_import_message_trailers_round_trip() -> None:
    spec = ArchiveSpec(SHA, "pypi-sdist:x==1", DIGEST, "x-1/tree")
    trailers = archives.parse_trailers(archives.import_message(spec))
    assert trailers == {"Upstream-Commit": SHA, "Archive-SHA256": DIGEST, "Archive-Folder": "x-1/tree"}


def test_member_sizes_come_from_real_tar_and_zip_headers(tmp_path: Path) -> None:
    tar = make_tar(tmp_path / "t.tar.gz", [regular("top/a", b"12345"), regular("top/b", b"x" * 70000)])
    zipped = make_zip(tmp_path / "z.zip", [("top/a", 0o100644, b"12345"), ("top/b", 0o100644, b"x" * 70000)])
    for archive in (tar, zipped):
        members = archive_unpack.archive_members(archive)
        assert {m.name: m.size for m in members if m.kind is Kind.FILE} == {"top/a": 5, "top/b": 70000}
        with pytest.raises(ArchiveError, match="over the"):
            archive_unpack.plan_unpack(members, "top", max_bytes=70004)
