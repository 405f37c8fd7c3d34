"""Reading what a failed or stopped ``git am`` says, for skippy's own messages.

git names the paths it could not patch in several forms (``error: patch failed:
P:N``, ``error: P: patch does not apply``, ``... lacking or useless (P)``); each is
read whole, as git prints it relative to the top of the tree.  git's own next-step
hints (``run "git am --continue"``) are dropped: skippy names its own commands.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from skippy.core.git import Repo

#: git's advice after a stopped `git am`; skippy's sessions are driven by `invoke prepare --continue|--skip|--abort`
_AM_HINT = re.compile(
    r"^(hint: .*"
    r'|When you have resolved this problem, run "git am --continue"\.'
    r'|If you prefer to skip this patch, run "git am --skip" instead\.'
    r'|To restore the original branch and stop patching, run "git am --abort"\.'
    r"|To record the empty patch as an empty commit, run \"git am --allow-empty\"\.)$"
)

#: what the plain apply could not patch (the 3-way fallback may still merge these)
_FAILED_PATH = (
    re.compile(r"^error: patch failed: (.+):\d+$"),
    re.compile(r"^error: (.+): patch does not apply$"),
    re.compile(r"^error: (.+): does not exist in index$"),
    re.compile(r"^error: (.+): already exists in (?:index|working directory)$"),
    re.compile(r"^error: (.+): No such file or directory$"),
)
#: what the 3-way fallback could not merge for want of the blobs the patch was made against
_NO_ANCESTOR = re.compile(r"sha1 information is lacking or useless \((.+)\)\.?$")

#: the most lines of a failing patch shown in an error
HUNK_LINES = 80


def without_am_hints(output: str) -> str:
    return "\n".join(line for line in output.splitlines() if not _AM_HINT.match(line))


def failed_paths(output: str) -> tuple[str, ...]:
    """The paths git's errors name as not applying, in order, each once, as git prints them (from the
    top of the tree).  When the 3-way fallback names the paths it could not merge, only those: the
    plain apply's failures before it (a hunk whose context moved) are what the fallback is for."""
    lines = output.splitlines()
    unmergeable = [m[1] for m in map(_NO_ANCESTOR.search, lines) if m is not None]
    if unmergeable:
        return tuple(dict.fromkeys(unmergeable))
    found: list[str] = []
    for line in lines:
        match = next((m for m in (p.search(line) for p in _FAILED_PATH) if m is not None), None)
        if match is not None and match[1] not in found:
            found.append(match[1])
    return tuple(found)


def unmerged_paths(repo: Repo) -> tuple[str, ...]:
    """Paths with conflict markers (unmerged in the index)."""
    out = repo.git("diff", "--name-only", "--diff-filter=U", check=False).stdout
    return tuple(line for line in out.splitlines() if line)


def stopped_failures(repo: Repo) -> tuple[str, ...]:
    """The paths the patch ``git am`` stopped at does not apply to, checked again on the tree as it
    is (``git apply --check`` of ``git am --show-current-patch=diff``); read-only."""
    diff = repo.git("am", "--show-current-patch=diff", check=False)
    if not diff.ok or not diff.stdout.strip():
        return ()
    check = repo.git("apply", "--check", input=diff.stdout, check=False)
    return failed_paths(check.stdout + check.stderr)


def stopped_patch_paths(repo: Repo) -> tuple[str, ...]:
    """The paths the patch ``git am`` is stopped at changes (empty when no ``git am`` is stopped)."""
    diff = repo.git("am", "--show-current-patch=diff", check=False)
    if not diff.ok:
        return ()
    sections = re.split(r"(?m)^(?=diff --git )", diff.stdout.split("\n-- \n", 1)[0])
    return tuple(_section_path(s) for s in sections if s.startswith("diff --git "))


def _section_path(section: str) -> str:
    first = section.splitlines()[0] if section else ""
    return first.removeprefix("diff --git a/").partition(" b/")[0]


def failing_hunks(repo: Repo, paths: Sequence[str], *, limit: int = HUNK_LINES) -> str:
    """The diff of the patch ``git am`` stopped at (``git am --show-current-patch=diff``), cut to the
    files of ``paths`` (the whole diff when none of them is in it), at most ``limit`` lines."""
    diff = repo.git("am", "--show-current-patch=diff", check=False).stdout
    diff = diff.split("\n-- \n", 1)[0]  # a mail signature, when the patch has one
    sections = [s for s in re.split(r"(?m)^(?=diff --git )", diff) if s.startswith("diff --git ")]
    kept = [s for s in sections if _section_path(s) in paths] or sections
    lines = "".join(kept).rstrip("\n").splitlines()
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more line(s))"]
    return "\n".join(lines)
