"""Fixture upstreams and queues built with real git, hermetically.

Every commit made here has a fixed identity and date, so fixture SHAs (and the
patched SHAs skippy computes from them) are the same on every machine.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

FIXED_DATE = "2024-05-01T12:00:00+0000"


def hermetic_git_env(home: Path, date: str = FIXED_DATE) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
        "GIT_AUTHOR_NAME": "Upstream Dev",
        "GIT_AUTHOR_EMAIL": "dev@upstream.invalid",
        "GIT_COMMITTER_NAME": "Upstream Dev",
        "GIT_COMMITTER_EMAIL": "dev@upstream.invalid",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }


def git(cwd: Path, *args: str, env: Mapping[str, str], input: str | None = None) -> str:
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=dict(env),
        input=input,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed in {cwd}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


@dataclass
class Upstream:
    """A local git repository standing in for upstream llama.cpp."""

    path: Path
    env: dict[str, str]
    commits: list[str] = field(default_factory=list)
    _tick: int = 0

    @classmethod
    def create(cls, path: Path, env: dict[str, str]) -> Upstream:
        path.mkdir(parents=True)
        git(path, "init", "--quiet", "--initial-branch=master", env=env)
        return cls(path, env)

    def commit(self, message: str, files: Mapping[str, str | None]) -> str:
        for rel, content in files.items():
            target = self.path / rel
            if content is None:
                git(self.path, "rm", "--quiet", "--", rel, env=self.env)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
            git(self.path, "add", "--", rel, env=self.env)
        self._tick += 1
        env = dict(self.env)
        date = f"2024-05-{self._tick:02d}T12:00:00+0000"
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
        git(self.path, "commit", "--quiet", "-m", message, env=env)
        sha = git(self.path, "rev-parse", "HEAD", env=self.env).strip()
        self.commits.append(sha)
        return sha

    def read(self, rel: str, rev: str = "HEAD") -> str:
        return git(self.path, "show", f"{rev}:{rel}", env=self.env)


def make_patch(
    upstream: Upstream,
    scratch: Path,
    base: str,
    subject: str,
    files: Mapping[str, str | None],
    *,
    author: str = "Downstream Dev <down@stream.invalid>",
    date: str = "Thu, 2 May 2024 10:00:00 +0200",
) -> bytes:
    """A ``git format-patch`` mailbox patch of ``files`` changed on top of ``base``."""
    if not scratch.exists():
        git(upstream.path.parent, "clone", "--quiet", str(upstream.path), str(scratch), env=upstream.env)
    git(scratch, "fetch", "--quiet", "origin", env=upstream.env)
    git(scratch, "checkout", "--quiet", "--force", "--detach", base, env=upstream.env)
    for rel, content in files.items():
        target = scratch / rel
        if content is None:
            git(scratch, "rm", "--quiet", "--", rel, env=upstream.env)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        git(scratch, "add", "--", rel, env=upstream.env)
    name, _, email = author.partition(" <")
    env = dict(upstream.env)
    env.update({"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">"), "GIT_AUTHOR_DATE": date})
    git(scratch, "commit", "--quiet", "-m", subject, env=env)
    out = git(
        scratch,
        "format-patch",
        "--stdout",
        "--zero-commit",
        "--no-signature",
        "--no-numbered",
        "-1",
        "HEAD",
        env=upstream.env,
    )
    return out.encode("utf-8")


def pyproject(upstream_url: str, extra: str = "") -> str:
    return (
        textwrap.dedent(
            f"""\
        [project]
        name = "downstream-fixture"
        version = "0"

        [tool.skippy]
        upstream_url = "{upstream_url}"
        pin_file = "queue/upstream.txt"
        patch_dir = "queue/patches"
        workdir = ".deps/llama.cpp"
        compat_link = "llama.cpp"
        network_attempts = 2
        network_backoff = 0.0
        lock_timeout = 5
        """
        )
        + extra
    )
