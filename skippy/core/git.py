"""A small typed git wrapper that owns the hermetic environment.

Tree-affecting commands (checkout, am, commit) run with no system or global
config, no hooks, no signing, a fixed identity, UTC and the C locale, and
``GIT_CEILING_DIRECTORIES`` set so git can never act on an enclosing
repository.  Network commands (clone, fetch) keep the user's global config so
proxies, ``url.insteadOf`` and credential helpers still work; they never touch
the work tree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skippy.core import gitconfig, proc
from skippy.core.errors import CommandError

IDENTITY_NAME = "skippy"
IDENTITY_EMAIL = "skippy@localhost"

#: config forced on every tree-affecting command, whatever the repo's config says
HERMETIC_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.eol", "lf"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("am.keepcr", "false"),
    ("am.threeWay", "false"),
    ("am.messageId", "false"),
    ("apply.whitespace", "nowarn"),
    ("rerere.enabled", "false"),
    ("merge.conflictStyle", "merge"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("advice.detachedHead", "false"),
    ("init.defaultBranch", "master"),
    ("i18n.commitEncoding", "UTF-8"),
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
)

#: variables from the caller's environment passed through to git
_PASS_THROUGH = (
    "PATH",
    "HOME",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "GIT_SSL_CAINFO",
    "SSH_AUTH_SOCK",
    "GIT_SSH_COMMAND",
)


#: how every queue patch is applied: 3-way fallback, committer date = author date, never signed
AM_ARGS: tuple[str, ...] = ("am", "--3way", "--committer-date-is-author-date", "--no-gpg-sign", "--quiet")
#: author/committer date used when a patch carries no Date header (keeps SHAs reproducible)
FALLBACK_DATE = "2000-01-01T00:00:00+0000"
AM_ENV: Mapping[str, str] = {"GIT_AUTHOR_DATE": FALLBACK_DATE, "GIT_COMMITTER_DATE": FALLBACK_DATE}


def base_env(env: Mapping[str, str]) -> dict[str, str]:
    kept = {k: env[k] for k in _PASS_THROUGH if k in env}
    kept.setdefault("PATH", os.defpath)
    kept.update({"LC_ALL": "C", "LANG": "C", "TZ": "UTC", "GIT_TERMINAL_PROMPT": "0"})
    return kept


def hermetic_env(env: Mapping[str, str], ceiling: Path) -> dict[str, str]:
    """The environment of every tree-affecting git command."""
    out = base_env(env)
    out.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CEILING_DIRECTORIES": str(ceiling),
            "GIT_AUTHOR_NAME": IDENTITY_NAME,
            "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
            "GIT_COMMITTER_NAME": IDENTITY_NAME,
            "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
            "GIT_EDITOR": "true",
            "GIT_SEQUENCE_EDITOR": "true",
            "GIT_MERGE_AUTOEDIT": "no",
            "GIT_PAGER": "cat",
            "GIT_OPTIONAL_LOCKS": "0",
        }
    )
    return out


def config_args(pairs: Sequence[tuple[str, str]] = HERMETIC_CONFIG) -> list[str]:
    args: list[str] = []
    for key, value in pairs:
        args += ["-c", f"{key}={value}"]
    return args


@dataclass(frozen=True)
class Repo:
    """A git repository at ``path`` (its top level)."""

    path: Path
    env: Mapping[str, str] = field(repr=False)
    echo: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    @property
    def ceiling(self) -> Path:
        return self.path.resolve().parent

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = hermetic_env(self.env, self.ceiling)
        if extra:
            env.update(extra)
        return env

    def git(
        self,
        *args: str | Path,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        on_line: Callable[[str], None] | None = None,
        what: str | None = None,
        next_step: str | None = None,
        timeout: float | None = None,
    ) -> proc.Result:
        """A hermetic git command in this repository.

        The repository's own config is audited first (:mod:`skippy.core.gitconfig`): the
        programs it names are switched off, or the command is refused before it runs."""
        programs_off = config_args(gitconfig.audit(self.path, self._env(None)).overrides)
        argv = ["git", "--no-pager", *config_args(), *programs_off, "-C", str(self.path), *map(str, args)]
        if self.echo is not None and _is_noteworthy(args):
            # the hermetic -c options are the same every time: show the command a human would type
            self.echo("$ git -C " + " ".join(proc.quote(str(a)) for a in (self.path, *args)))
        return proc.run(
            argv,
            env=self._env(env),
            check=check,
            input=input,
            on_line=on_line,
            what=what or f"git {args[0]}",
            next_step=next_step,
            timeout=timeout,
        )

    def network(
        self,
        *args: str | Path,
        check: bool = True,
        what: str | None = None,
        timeout: float | None = None,
    ) -> proc.Result:
        """A fetch-like command with the user's global config (proxies, credentials), never a
        program named in the repository's own config (audited as for :meth:`git`)."""
        programs_off = config_args(gitconfig.audit(self.path, self._env(None)).overrides)
        env = base_env(self.env)
        env["GIT_CEILING_DIRECTORIES"] = str(self.ceiling)
        argv = ["git", "--no-pager", "-c", "core.hooksPath=" + os.devnull, *programs_off, "-C", str(self.path)]
        argv += map(str, args)
        return proc.run(argv, env=env, check=check, echo=self.echo, what=what or f"git {args[0]}", timeout=timeout)

    def config_audit(self) -> gitconfig.Audit:
        """The audit of this repository's own config (read once while its files are unchanged)."""
        return gitconfig.audit(self.path, self._env(None))

    def out(self, *args: str | Path) -> str:
        return self.git(*args).stdout.strip()

    def rev_parse(self, rev: str) -> str | None:
        result = self.git("rev-parse", "--verify", "--quiet", "--end-of-options", rev, check=False)
        value = result.stdout.strip()
        return value if result.ok and value else None

    def has_commit(self, sha: str) -> bool:
        return self.git("cat-file", "-e", f"{sha}^{{commit}}", check=False).ok

    def head(self) -> str | None:
        return self.rev_parse("HEAD")

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        result = self.git("merge-base", "--is-ancestor", ancestor, descendant, check=False)
        if result.returncode not in (0, 1):
            raise CommandError(
                "git merge-base failed",
                argv=result.argv,
                returncode=result.returncode,
                output_tail=result.tail(),
            )
        return result.ok

    def git_dir(self) -> Path:
        value = self.out("rev-parse", "--absolute-git-dir")
        return Path(value)

    def toplevel(self) -> Path | None:
        result = self.git("rev-parse", "--show-toplevel", check=False)
        return Path(result.stdout.strip()) if result.ok else None

    def commit_count(self, rev_range: str) -> int:
        return int(self.out("rev-list", "--count", rev_range))


def _is_noteworthy(args: Sequence[str | Path]) -> bool:
    """Echo only commands that change something; queries stay quiet."""
    return bool(args) and str(args[0]) in {
        "am",
        "checkout",
        "clone",
        "fetch",
        "worktree",
        "update-ref",
        "read-tree",
        "clean",
        "reset",
        "init",
    }
