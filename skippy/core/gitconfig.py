"""What a repository's own git config may make git run, and how skippy answers it.

skippy runs git with no system or global config for everything that touches a tree, but git
always reads the repository's own ``.git/config`` (and ``config.worktree``, and the files they
include).  Several keys there name a program git runs on its own: a filter driver runs on
``status``, ``checkout``, ``add`` and ``am``; a diff driver's ``textconv`` on ``diff``; a merge
driver on ``am --3way`` and ``cherry-pick``; ``remote.<name>.uploadpack`` on ``fetch``.  A
workdir's config is writable by anything that can write the workdir (a restored CI cache, a
script), so none of those programs may run.  Each key of that class is, by :data:`PROGRAM_KEYS`:

- ``off``: switched off on every command with a ``-c`` override or an environment variable,
  as hooks are (filter drivers become empty, which git treats as "no filter", and are no longer
  ``required``; the pager, the editors, fsmonitor and the hooks are fixed in
  :mod:`skippy.core.git`);
- ``refused``: no value switches it off from outside (an empty ``textconv`` or merge driver is
  still run, as an empty command), so a repository whose config sets one is refused before git
  runs, naming the key, the file and the command that removes it;
- ``unread``: read only by git commands skippy never runs (``mergetool``, ``send-email`` ...).

The audit reads the config with ``git config --list`` (which runs nothing) and is kept per
repository until one of the files it came from changes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal

from skippy.core import proc
from skippy.core.errors import UnsafeGitConfig

Handling = Literal["off", "refused", "unread"]

#: every config key that names a program git runs (``*`` is a subsection, matched lower-case),
#: with how skippy answers it and why
PROGRAM_KEYS: Final[Mapping[str, tuple[Handling, str]]] = {
    "core.hookspath": ("off", "hooks: core.hooksPath is forced to an empty path"),
    "core.fsmonitor": ("off", "forced to false"),
    "core.pager": ("off", "--no-pager and GIT_PAGER=cat"),
    "pager.*": ("off", "--no-pager and GIT_PAGER=cat"),
    "core.editor": ("off", "GIT_EDITOR=true"),
    "sequence.editor": ("off", "GIT_SEQUENCE_EDITOR=true"),
    "filter.*.clean": ("off", "forced empty: no filter (and filter.<driver>.required forced false)"),
    "filter.*.smudge": ("off", "forced empty: no filter (and filter.<driver>.required forced false)"),
    "filter.*.process": ("off", "forced empty: no filter (and filter.<driver>.required forced false)"),
    "diff.external": ("refused", "an empty value is run as a command: diff fails"),
    "diff.*.command": ("refused", "an empty value is run as a command: diff fails"),
    "diff.*.textconv": ("refused", "an empty value is run as a command: diff fails"),
    "merge.*.driver": ("refused", "an empty driver is run and keeps 'ours': a silently wrong merge"),
    "gpg.program": ("refused", "signing is off, but no value makes a verification safe"),
    "gpg.*.program": ("refused", "signing is off, but no value makes a verification safe"),
    "gpg.ssh.defaultkeycommand": ("refused", "signing is off, but no value makes it safe"),
    "core.sshcommand": ("refused", "fetches keep the user's global config, not the workdir's"),
    "core.gitproxy": ("refused", "fetches keep the user's global config, not the workdir's"),
    "core.askpass": ("refused", "fetches keep the user's global config, not the workdir's"),
    "credential.helper": ("refused", "fetches keep the user's global config, not the workdir's"),
    "credential.*.helper": ("refused", "fetches keep the user's global config, not the workdir's"),
    "remote.*.uploadpack": ("refused", "run by a fetch from a local or ssh remote"),
    "remote.*.receivepack": ("refused", "run by a push to a local or ssh remote"),
    "remote.*.vcs": ("refused", "names the remote helper a fetch runs"),
    "core.alternaterefscommand": ("refused", "run by a fetch into a repository with alternates"),
    "uploadpack.packobjectshook": ("refused", "git reads it from protected config only; refused all the same"),
    "trailer.*.command": ("refused", "run by interpret-trailers"),
    "trailer.*.cmd": ("refused", "run by interpret-trailers"),
    "core.worktree": ("refused", "not a program, but it moves the work tree out of the workdir"),
    "includeif.*.path": ("refused", "a conditional include can change what is read after the audit"),
    "protocol.allow": ("off", "protocol.ext.allow is forced to never: no ext:: command"),
    "protocol.*.allow": ("off", "protocol.ext.allow is forced to never: no ext:: command"),
    "submodule.*.update": ("unread", "only `git submodule update` runs it (submodule.recurse is forced off)"),
    "alias.*": ("unread", "an alias never replaces a built-in command, and skippy runs only built-ins"),
    "diff.tool": ("unread", "only difftool"),
    "diff.guitool": ("unread", "only difftool"),
    "difftool.*.cmd": ("unread", "only difftool"),
    "difftool.*.path": ("unread", "only difftool"),
    "merge.tool": ("unread", "only mergetool"),
    "merge.guitool": ("unread", "only mergetool"),
    "mergetool.*.cmd": ("unread", "only mergetool"),
    "mergetool.*.path": ("unread", "only mergetool"),
    "web.browser": ("unread", "only help and instaweb"),
    "browser.*.cmd": ("unread", "only help and instaweb"),
    "browser.*.path": ("unread", "only help and instaweb"),
    "man.*.cmd": ("unread", "only help"),
    "man.*.path": ("unread", "only help"),
    "sendemail.*": ("unread", "only send-email"),
    "instaweb.*": ("unread", "only instaweb"),
}

#: overrides of every command, whatever the repository's config holds (the ``off`` rows that
#: need no key from the config; hooks and fsmonitor are in :data:`skippy.core.git.HERMETIC_CONFIG`)
ALWAYS_OFF: Final[tuple[tuple[str, str], ...]] = (
    ("core.attributesFile", os.devnull),
    ("protocol.ext.allow", "never"),
    ("submodule.recurse", "false"),
    ("log.showSignature", "false"),
)


def handling(key: str) -> tuple[Handling, str] | None:
    """How skippy answers config ``key`` (any case), or None when it names no program."""
    lowered = key.lower()
    for pattern, answer in PROGRAM_KEYS.items():
        if _matches(lowered, pattern):
            return answer
    return None


def _matches(key: str, pattern: str) -> bool:
    """``pattern``'s ``*`` is one subsection, which may itself hold dots (``credential.https://x.y.helper``)."""
    section, _, rest = pattern.partition(".")
    if "*" not in rest:
        return key == pattern
    if not key.startswith(section + "."):
        return False
    head, _, tail = rest.partition("*")
    middle = key[len(section) + 1 :]
    return middle.startswith(head) and middle.endswith(tail) and len(middle) > len(head) + len(tail)


@dataclass(frozen=True)
class Entry:
    """One key of the repository's config and the file it came from."""

    key: str
    origin: str


@dataclass(frozen=True)
class Audit:
    """What the repository's config names: the ``-c`` overrides that switch it off, what is refused."""

    overrides: tuple[tuple[str, str], ...]
    refused: tuple[Entry, ...]
    #: a partial clone (a promisor remote ``origin`` or ``extensions.partialClone``): read with the
    #: rest, so asking it costs no git process of its own
    partial: bool = False


_Signature = tuple[tuple[str, tuple[int, int, int] | None], ...]
_AUDITS: dict[Path, tuple[_Signature, Audit]] = {}


def audit(path: Path, env: Mapping[str, str]) -> Audit:
    """The audit of the repository at ``path`` (``env``: the hermetic environment, no global config).

    Raises :class:`UnsafeGitConfig` when the config sets a ``refused`` key: before git runs
    anything in ``path``."""
    known = _AUDITS.get(path)
    if known is not None and _signature(known[0]) == known[0]:
        found = known[1]
    else:
        entries, partial = _read(path, env)
        found = replace(_judge(entries), partial=partial)
        files = sorted({e.origin for e in entries} | {str(p) for p in _base_files(path)})
        _AUDITS[path] = (tuple((f, _stat(Path(f))) for f in files), found)
    if found.refused:
        raise _refusal(path, found.refused)
    return found


def _base_files(path: Path) -> tuple[Path, ...]:
    """The files whose appearance means the config must be read again (a repository made later)."""
    dotgit = path / ".git"
    return (dotgit, dotgit / "config", dotgit / "config.worktree", path / "config")


def _stat(path: Path) -> tuple[int, int, int] | None:
    """What tells a file's change: inode, size and mtime; a directory (``.git``) by its inode
    alone, since its mtime moves with every ref or lock git writes in it, never its config."""
    try:
        info = path.stat()
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode):
        return (info.st_ino, 0, 0)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _signature(previous: _Signature) -> _Signature:
    return tuple((name, _stat(Path(name))) for name, _ in previous)


def _read(path: Path, env: Mapping[str, str]) -> tuple[list[Entry], bool]:
    """Every key of the repository's own config (includes followed) with its file, none outside a
    repository; and whether that config makes it a partial clone."""
    if not path.is_dir():
        return [], False
    result = proc.run(
        ["git", "--no-pager", "-C", str(path), "config", "--null", "--list", "--show-origin"],
        env=env,
        check=False,
        what="git config --list",
    )
    if not result.ok:
        return [], False  # not a repository (yet): nothing of its own to read
    fields = result.stdout.split("\0")
    entries: list[Entry] = []
    partial = False
    for origin, item in zip(fields[0::2], fields[1::2], strict=False):
        if not origin:
            continue
        key, _, value = item.partition("\n")
        # git names the repository's own files relative to it (`file:.git/config`)
        entries.append(Entry(key=key, origin=str(path / origin.removeprefix("file:"))))
        lowered = key.lower()
        if (lowered == "remote.origin.promisor" and value.strip().lower() == "true") or (
            lowered == "extensions.partialclone" and value.strip()
        ):
            partial = True
    return entries, partial


def _judge(entries: list[Entry]) -> Audit:
    overrides: list[tuple[str, str]] = list(ALWAYS_OFF)
    refused: list[Entry] = []
    drivers: list[str] = []
    for entry in entries:
        answer = handling(entry.key)
        if answer is None:
            continue
        if answer[0] == "refused":
            refused.append(entry)
        elif entry.key.lower().startswith("filter."):
            driver = entry.key[len("filter.") :].rpartition(".")[0]
            if driver not in drivers:
                drivers.append(driver)
    for driver in drivers:
        overrides += [(f"filter.{driver}.{part}", "") for part in ("clean", "smudge", "process")]
        overrides.append((f"filter.{driver}.required", "false"))
    return Audit(overrides=tuple(overrides), refused=tuple(refused))


def _refusal(path: Path, refused: tuple[Entry, ...]) -> UnsafeGitConfig:
    once = tuple(dict.fromkeys(refused))  # a key set twice in one file is named, and unset, once
    names = ", ".join(f"{e.key} ({e.origin})" for e in once)
    fixes = " && ".join(f"git config --file {proc.quote(e.origin)} --unset-all {proc.quote(e.key)}" for e in once)
    return UnsafeGitConfig(
        f"the git config of {path} names a program git would run: {names}",
        untouched=f"{path}: no git command ran in it; its config was read, not changed",
        next_step=f"{fixes}, then re-run (skippy never runs a program named in a repository's own config)",
    )
