"""What an archive itself records of its commit (skippy.queue.archive_unpack.recorded_commit)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from skippy.queue.archive_unpack import Record, recorded_commit, submodule_heads

SHA = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
SUPER = "f" * 40
FOLDER = "pkg-1.0/vendor/llama.cpp"
HEAD = "pkg-1.0/.git/modules/vendor/llama.cpp/HEAD"


def tar_of(path: Path, files: dict[str, str], comment: str | None = None) -> Path:
    headers = {"comment": comment} if comment is not None else {}
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT, pax_headers=headers) as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_submodule_heads_of_a_folder_nearest_superproject_first() -> None:
    assert submodule_heads(FOLDER) == (
        "pkg-1.0/vendor/.git/modules/llama.cpp/HEAD",
        HEAD,
        ".git/modules/pkg-1.0/vendor/llama.cpp/HEAD",
    )
    assert submodule_heads(".") == ()


def test_a_vendored_submodule_head_is_the_record_not_the_superprojects_comment(tmp_path: Path) -> None:
    archive = tar_of(tmp_path / "a.tar.gz", {f"{FOLDER}/README.md": "x\n", HEAD: SHA + "\n"}, comment=SUPER)
    assert recorded_commit(archive, FOLDER) == Record(SHA, HEAD)


def test_git_archives_comment_counts_for_a_top_level_folder_only(tmp_path: Path) -> None:
    archive = tar_of(tmp_path / "a.tar.gz", {"llama.cpp/README.md": "x\n", f"{FOLDER}/x": "y\n"}, comment=SHA)
    found = recorded_commit(archive, "llama.cpp")
    assert found is not None and found.commit == SHA and "comment" in found.where
    assert recorded_commit(archive, FOLDER) is None


@pytest.mark.parametrize("head", ["ref: refs/heads/master\n", "not a sha\n"])
def test_a_symbolic_or_odd_head_records_nothing(tmp_path: Path, head: str) -> None:
    archive = tar_of(tmp_path / "a.tar.gz", {f"{FOLDER}/README.md": "x\n", HEAD: head})
    assert recorded_commit(archive, FOLDER) is None


def test_a_zip_is_read_the_same_way(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"{FOLDER}/README.md", "x\n")
        zf.writestr(HEAD, SHA + "\n")
        zf.comment = SUPER.encode()
    assert recorded_commit(archive, FOLDER) == Record(SHA, HEAD)
    top = tmp_path / "top.zip"
    with zipfile.ZipFile(top, "w") as zf:
        zf.writestr("llama.cpp/README.md", "x\n")
        zf.comment = SHA.encode()
    found = recorded_commit(top, "llama.cpp")
    assert found is not None and found.commit == SHA
