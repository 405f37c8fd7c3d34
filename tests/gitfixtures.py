"""Fixture upstreams and queues built with real git, hermetically.

Every commit made here has a fixed identity and date, so fixture SHAs (and the
patched SHAs skippy computes from them) are the same on every machine.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
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
        day = datetime.date(2024, 5, 1) + datetime.timedelta(days=self._tick - 1)  # one day per commit
        date = f"{day.isoformat()}T12:00:00+0000"
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


# ------------------------------------------------------------------ a private mount namespace

#: runs in a new mount namespace (``unshare --mount``): binds each ``readonly`` path onto itself
#: read-only, and puts each ``full`` directory's content on a small tmpfs filled up to the last
#: page (the filler file at the given relative path), then execs the command: real EROFS and
#: ENOSPC for that command alone; the test's own view of the files is never changed
MOUNT_HELPER = """
import json, os, shutil, subprocess, sys, tempfile
spec = json.loads(sys.argv[1])
for path in spec.get("readonly", []):
    subprocess.run(["mount", "--bind", path, path], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", path, path], check=True)
for path, filler in spec.get("full", []):
    keep = tempfile.mkdtemp()
    shutil.copytree(path, keep, symlinks=True, dirs_exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", path], check=True)
    shutil.copytree(keep, path, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(keep)
    try:
        with open(os.path.join(path, filler), "wb") as fh:
            while True:
                fh.write(bytes(4096))
                fh.flush()
    except OSError:
        pass
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _unshare_prefix() -> list[str] | None:
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        return None
    for prefix in ([unshare, "--mount", "--"], [unshare, "--mount", "--map-root-user", "--"]):
        with tempfile.TemporaryDirectory() as probe:
            result = subprocess.run(
                [*prefix, mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe],
                capture_output=True,
                check=False,
            )
        if result.returncode == 0:
            return prefix
    return None


@functools.cache
def mount_namespace() -> list[str] | None:
    """The ``unshare`` prefix that gives a command its own mount namespace here, or None."""
    return _unshare_prefix()


def in_mount_namespace(
    argv: Sequence[str], *, readonly: Sequence[Path] = (), full: Sequence[tuple[Path, str]] = ()
) -> list[str]:
    prefix = mount_namespace()
    assert prefix is not None
    spec = {"readonly": [str(p) for p in readonly], "full": [[str(p), f] for p, f in full]}
    return [*prefix, sys.executable, "-c", MOUNT_HELPER, json.dumps(spec), *argv]
