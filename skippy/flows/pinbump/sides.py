"""The two sides of a pin move and ``invoke summary``: the workdir's repository (prepared at the
pin when there is none), the pin and a target resolved in it, whether each is upstream history or
a source archive alone, and the summary of the upstream move between them.
"""

from __future__ import annotations

from skippy.compile.backends import upstream_areas
from skippy.core.errors import SettingsError
from skippy.core.git import Repo
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.maintain.summary import Summary, summarize
from skippy.queue import workdir as wd
from skippy.queue.model import Queue, load_queue
from skippy.queue.prepare import prepare, resolve_target
from skippy.queue.scratch import owned_scratch
from skippy.queue.target import Target, read_pin
from skippy.queue.upstream import Resolved


def repo_for(settings: Settings, console: Console, *, offline: bool = False) -> Repo:
    """The workdir repository; prepared at the pin first if there is none yet."""
    if wd.git_dir_of(settings.workdir) is None:
        prepare(settings, Target.pinned(), console=console, interactive=False, offline=offline)
    return Repo(settings.workdir, settings.env, echo=console.command)


def target_of(target_sha: str | None) -> Target:
    """The target named by ``--sha``/``--to``; upstream master when none is."""
    return Target.at(target_sha) if target_sha else Target.latest()


def upstream_pin(settings: Settings, repo: Repo, console: Console) -> tuple[str, str]:
    """(pin SHA, local commit for it in upstream history) — archive imports have no history."""
    pin = read_pin(settings)
    upstream_sha, base, source = resolve_target(settings, repo, Target.pinned(), console=console)
    if source == "archive" and not repo.has_commit(upstream_sha):
        raise SettingsError(
            f"the pin {pin[:12]} is only available from its source archive here, without upstream history",
            untouched="everything",
            next_step="run where the upstream answers (LLAMA_UPSTREAM_URL can point at a local mirror)",
        )
    return pin, base


def in_history(at: Resolved) -> bool:
    """Whether ``at`` is an upstream commit of the repository's history (not an archive import)."""
    return at.base == at.upstream_sha


def archive_only(old: Resolved, new: Resolved) -> str:
    """Which side(s) of a bump are known only from their source archive, for a message."""
    only = [at.upstream_sha[:12] for at in (old, new) if not in_history(at)]
    what = " and ".join(only)
    return f"{what} {'is' if len(only) == 1 else 'are'} known here only from " + (
        "its source archive" if len(only) == 1 else "their source archives"
    )


def summarize_move(settings: Settings, repo: Repo, old_base: str, new_base: str, queue: Queue) -> Summary:
    """The summary of the upstream move ``old_base..new_base`` (local commits) for ``queue``."""
    with owned_scratch(settings.cache_dir / "tmp", "summary-") as tmp:
        return summarize(
            repo,
            old_base,
            new_base,
            queue,
            upstream_url=settings.upstream_url,
            backend_areas=upstream_areas(),
            scratch=tmp,
        )


def run_summary(settings: Settings, old: str, new: str, *, console: Console) -> Summary:
    """The summary of ``old..new``; a side known only from its source archive gives the diffstat
    between the two trees and says the commit list is unavailable (:func:`summarize`)."""
    repo = repo_for(settings, console)
    old_at = resolve_target(settings, repo, Target.at(old), console=console)
    new_at = resolve_target(settings, repo, Target.at(new), console=console)
    old_base, old_source = old_at.base, old_at.source
    if not repo.is_ancestor(old_base, new_at.base) and in_history(old_at) and in_history(new_at):
        raise SettingsError(
            f"{old[:12]} is not an ancestor of {new[:12]}"
            + (" (it is only known from its source archive)" if old_source == "archive" else ""),
            untouched="everything",
            next_step="summarize OLD..NEW where OLD is an upstream ancestor of NEW",
        )
    return summarize_move(settings, repo, old_base, new_at.base, load_queue(settings.patch_dir))
