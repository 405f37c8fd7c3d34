"""Many objects in one git process (skippy.core.gitbulk), checked against git's own one-at-a-time answers."""

from __future__ import annotations

from pathlib import Path

from skippy.core import gitbulk
from skippy.core.git import IDENTITY_EMAIL, IDENTITY_NAME, Repo
from tests.gitfixtures import Upstream, git

DATE = "2000-01-01T00:00:00+0000"


def test_read_blobs_gives_each_blob_as_cat_file_does(upstream: Upstream, git_env: dict[str, str]) -> None:
    head = upstream.commit(
        "odd files",
        {
            "no-newline.txt": "last line without one",
            "empty.txt": "",
            "blank-end.txt": "a\n\n\n",
            "with token.txt": "skippy-0000 blob\nnot a header\n",
        },
    )
    repo = Repo(upstream.path, git_env)
    files = gitbulk.tree_blobs(repo, head)
    assert set(files) >= {"no-newline.txt", "empty.txt", "blank-end.txt", "with token.txt"}
    texts = gitbulk.read_blobs(repo, files.values())
    for path, blob in files.items():
        assert texts[blob] == git(upstream.path, "cat-file", "blob", blob, env=git_env), path
    # an id git does not have is left out, and does not spoil the others
    missing = "1" * 40
    again = gitbulk.read_blobs(repo, [*files.values(), missing])
    assert missing not in again and again == texts
    # a size limit leaves out the blobs over it, and only those
    small = gitbulk.read_blobs(repo, files.values(), limit=len("last line without one"))
    assert files["no-newline.txt"] in small and files["with token.txt"] not in small


def test_step_diffs_are_the_diffs_of_each_step(upstream: Upstream, git_env: dict[str, str]) -> None:
    base = upstream.commits[-1]
    one = upstream.commit("one", {"a.txt": "1\n"})
    two = upstream.commit("two", {"a.txt": "1\n2\n", "b.txt": "b\n"})
    git(upstream.path, "commit", "--quiet", "--allow-empty", "-m", "nothing", env=git_env)
    same = git(upstream.path, "rev-parse", "HEAD", env=git_env).strip()
    three = upstream.commit("three", {"a.txt": None})
    repo = Repo(upstream.path, git_env)
    steps = [(base, one), (one, two), (two, same), (same, three)]
    diffs = gitbulk.step_diffs(repo, steps, "-U0")
    for (old, new), diff in zip(steps, diffs, strict=True):
        want = git(upstream.path, "diff", "--full-index", "-U0", old, new, env=git_env)
        assert diff.strip("\n") == want.strip("\n")
    assert diffs[2] == ""
    blobs = gitbulk.diff_files(diffs[3])
    assert list(blobs) == ["a.txt"] and gitbulk.NULL_ID.match(blobs["a.txt"][1])


def test_commit_chain_makes_the_commits_git_commit_makes(
    upstream: Upstream, git_env: dict[str, str], tmp_path: Path
) -> None:
    """The same ids as ``git commit -m`` with skippy's identity and date: a chain is not a lookalike."""
    start = upstream.commit("files", {"keep.txt": "k\n", "gone.txt": "g\n", "tool.sh": "#!/bin/sh\n"})
    git(upstream.path, "update-index", "--chmod=+x", "tool.sh", env=git_env)
    start = upstream.commit("mode", {})
    wanted = upstream.commit("target", {"keep.txt": "changed\n", "new dir/with space.txt": "n\n", "gone.txt": None})
    repo = Repo(upstream.path, git_env)
    entries = gitbulk.tree_entries(repo, wanted, ["keep.txt", "new dir/with space.txt", "gone.txt", "tool.sh"])
    assert set(entries) == {"keep.txt", "new dir/with space.txt", "tool.sh"}
    assert entries["tool.sh"].mode == "100755"
    messages = ["  first: keep\n\n\n\nbody line   \n\n", "second\n", "empty"]
    changes = [
        gitbulk.Change(messages[0], {"keep.txt": entries["keep.txt"], "gone.txt": None}),
        gitbulk.Change(messages[1], {"new dir/with space.txt": entries["new dir/with space.txt"]}),
        gitbulk.Change(messages[2], {}),
    ]
    made = gitbulk.commit_chain(repo, start, changes, date=DATE, scratch=tmp_path)

    env = dict(git_env)
    env.update(
        {
            "GIT_AUTHOR_NAME": IDENTITY_NAME,
            "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
            "GIT_COMMITTER_NAME": IDENTITY_NAME,
            "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
            "GIT_AUTHOR_DATE": DATE,
            "GIT_COMMITTER_DATE": DATE,
        }
    )
    git(upstream.path, "checkout", "--quiet", "--detach", start, env=git_env)
    git(upstream.path, "checkout", wanted, "--", "keep.txt", env=git_env)
    git(upstream.path, "rm", "--quiet", "gone.txt", env=git_env)
    git(upstream.path, "commit", "--quiet", "-m", messages[0], env=env)
    git(upstream.path, "checkout", wanted, "--", "new dir/with space.txt", env=git_env)
    git(upstream.path, "commit", "--quiet", "-m", messages[1], env=env)
    git(upstream.path, "commit", "--quiet", "--allow-empty", "-m", messages[2], env=env)
    by_git = git(upstream.path, "rev-list", "--reverse", f"{start}..HEAD", env=git_env).split()
    assert made == by_git
    # no ref and no marks file is left behind
    assert "refs/skippy/" not in git(upstream.path, "for-each-ref", env=git_env)
    assert not list(tmp_path.glob("marks-*"))
