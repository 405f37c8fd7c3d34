"""An aside worktree that writes only some folders (the built-in generator's sandbox): the rest of
the tree is not written, yet stays in the index, so a commit made there holds the whole tree."""

from __future__ import annotations

from pathlib import Path

from skippy.core.git import Repo
from skippy.queue.triage import aside_worktree
from tests.gitfixtures import Upstream, git


def test_only_the_folders_asked_for_are_written_and_a_commit_keeps_the_rest(
    upstream: Upstream, git_env: dict[str, str], tmp_path: Path
) -> None:
    head = upstream.commit("layout", {"src/models/a.cpp": "int a;\n", "ggml/big.c": "int big;\n", "top.txt": "t\n"})
    repo = Repo(upstream.path, git_env)
    where = tmp_path / "aside"
    with aside_worktree(repo, None, head, path=where, only=("src",)) as aside:
        written = sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file() and ".git" not in p.parts)
        assert "src/models/a.cpp" in written
        assert not any(p.startswith("ggml/") or p == "top.txt" for p in written), written
        assert aside.out("status", "--porcelain") == ""  # the files not written are not "deleted"
        (where / "src/models/a.cpp").write_text("int a = 1;\n")
        aside.git("add", "-A")
        aside.git("commit", "--quiet", "-m", "edit")
        after = aside.out("rev-parse", "HEAD")
    files = git(upstream.path, "ls-tree", "-r", "--name-only", after, env=git_env).split()
    assert {"src/models/a.cpp", "ggml/big.c", "top.txt"} <= set(files)
    assert git(upstream.path, "diff", "--name-only", head, after, env=git_env).split() == ["src/models/a.cpp"]
    assert not where.exists()
