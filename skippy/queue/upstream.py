"""Steps that reach the upstream: clone, fetch (with retries), and resolving a target to a commit.

None of them needs the queue.  When the upstream does not answer, the source
archive mapped for the commit (``[tool.skippy.archives]``) stands in.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from skippy.core.errors import CommandError, NetworkError, SettingsError
from skippy.core.git import Repo
from skippy.queue.disk import disk_problem
from skippy.queue.run import Run
from skippy.queue.target import Target, expand_known_sha


class Resolved(NamedTuple):
    """A target found: the upstream SHA, the local commit standing for it, and where it came from."""

    upstream_sha: str
    base: str
    #: "git" (fetched or already there) or "archive" (imported from the source archive)
    source: str


def has_archive_fallback(run: Run) -> bool:
    return bool(run.settings.raw.get("archives"))


def retry(run: Run, action: Callable[[], object], what: str, cleanup: Callable[[], None] | None = None) -> None:
    """Run a network ``action`` up to ``network_attempts`` times with exponential backoff.

    A disk problem (no space, read-only, permission) is raised at once: retrying cannot help.
    """
    attempts = run.settings.network_attempts
    last: CommandError | None = None
    for attempt in range(1, attempts + 1):
        try:
            action()
            return
        except CommandError as exc:
            last = exc
            if cleanup is not None:
                cleanup()
            if disk_problem(exc.output_tail) is not None:
                raise
            if attempt < attempts:
                delay = run.settings.network_backoff * (2 ** (attempt - 1))
                run.console.warn(f"{what} failed (attempt {attempt}/{attempts}); retrying in {delay:.0f} s")
                run.sleep(delay)
    assert last is not None
    raise NetworkError(
        f"could not {what} after {attempts} attempt(s)",
        details=last.details,
        untouched=f"{run.rel(run.workdir)}: nothing was changed",
        next_step="check the network and LLAMA_UPSTREAM_URL / [tool.skippy] upstream_url, then re-run; "
        "for the pinned commit, `invoke prepare --offline` uses the configured source archive",
    )


def init_empty(run: Run, path: Path) -> None:
    path.mkdir(parents=True)
    repo = run.repo(path)
    repo.git("init", "--quiet")
    repo.git("remote", "add", "origin", run.settings.upstream_url)


def clone_or_init(run: Run, partial: Path) -> None:
    """Clone upstream (full history, no checkout) into ``partial``, or init it for an archive.

    An unreachable upstream with an archive configured turns the run offline (noted)."""
    url = run.settings.upstream_url
    if run.offline:
        init_empty(run, partial)
        return
    try:
        retry(
            run,
            lambda: run.repo(partial.parent).network(
                "clone", "--no-checkout", "--origin", "origin", "--", url, partial.name, what="git clone"
            ),
            f"clone {url}",
            cleanup=lambda: shutil.rmtree(partial, ignore_errors=True),
        )
    except NetworkError as exc:
        if not has_archive_fallback(run):
            raise
        run.console.warn(f"{exc.what}; falling back to the source archive")
        run.notes.append("upstream unreachable: used the source archive")
        shutil.rmtree(partial, ignore_errors=True)
        init_empty(run, partial)
        run.offline = True
        run.unreachable = exc


def fetch(run: Run, repo: Repo) -> None:
    """Fetch the upstream branch and tags into ``repo`` (``origin`` set to the configured URL)."""
    url = run.settings.upstream_url
    current = repo.git("remote", "get-url", "origin", check=False)
    if not current.ok:
        repo.git("remote", "add", "origin", url)
    elif current.stdout.strip() != url:
        repo.git("remote", "set-url", "origin", url)
    branch = run.settings.upstream_branch
    retry(
        run,
        lambda: repo.network(
            "fetch",
            "--tags",
            "--quiet",
            "origin",
            f"+refs/heads/{branch}:refs/remotes/origin/{branch}",
            what="git fetch",
        ),
        f"fetch {branch} from {url}",
    )


def resolve(run: Run, repo: Repo, target: Target, pin: str | None) -> Resolved:
    """The commit ``target`` names, made available in ``repo`` (fetched, or imported from its archive)."""
    if target.mode == "latest":
        return _resolve_latest(run, repo)
    wanted = pin if target.mode == "pinned" else expand_known_sha(run.settings, (target.sha or "").lower())
    assert wanted
    named = f"--sha {target.sha}" if target.mode == "sha" else f"the pin file {run.rel(run.settings.pin_file)}"
    return resolve_commit(run, repo, wanted, named=named)


def _resolve_latest(run: Run, repo: Repo) -> Resolved:
    if run.unreachable is not None:
        # offline because the clone found no upstream, not because --offline was given
        url = run.settings.upstream_url
        raise NetworkError(
            f"--latest needs the upstream, and {url} did not answer ({run.unreachable.what}); "
            "a source archive stands in for a pinned commit only, never for the latest one",
            details=run.unreachable.details,
            untouched=f"{run.rel(run.workdir)}: nothing was cloned or changed",
            next_step="check the network and LLAMA_UPSTREAM_URL / [tool.skippy] upstream_url, then re-run "
            "with --latest; `invoke prepare --pinned` prepares the pin from its source archive meanwhile",
        )
    if run.offline:
        raise SettingsError(
            "--latest needs the upstream: it cannot run --offline",
            untouched="everything",
            next_step="drop --offline, or use `invoke prepare --pinned --offline`",
        )
    fetch(run, repo)
    ref = f"refs/remotes/origin/{run.settings.upstream_branch}"
    sha = repo.rev_parse(ref + "^{commit}")
    if sha is None:
        raise NetworkError(
            f"upstream has no branch {run.settings.upstream_branch}",
            untouched=f"{run.rel(run.workdir)}",
            next_step="check [tool.skippy] upstream_branch",
        )
    return Resolved(sha, sha, "git")


def resolve_commit(run: Run, repo: Repo, wanted: str, *, named: str | None = None) -> Resolved:
    """``wanted`` (a full SHA or an abbreviation): already here, fetched, or its source archive.

    ``named``: how the user gave it (``--sha X``, the pin file), for the refusal of a commit that is
    neither here nor mapped to a source archive when offline."""
    local = lookup(run, repo, wanted)
    if local is not None:
        return local
    if run.offline and wanted not in mapped_commits(run):
        raise _unmapped_offline(run, wanted, named or f"commit {wanted}")
    fetch_error: NetworkError | None = None
    if not run.offline:
        try:
            local = _fetch_commit(run, repo, wanted)
        except NetworkError as exc:
            fetch_error = exc
        if local is not None:
            return local
    if _archive_stands_in(run, wanted, fetch_error):
        from skippy.queue import archives  # only archive users pay for the import

        if fetch_error is not None:
            run.console.warn(f"{fetch_error.what}; falling back to the source archive for {wanted[:12]}")
        base = archives.import_archive(run.settings, repo, wanted, run.console)
        return Resolved(wanted, base, "archive")
    if fetch_error is not None:
        raise fetch_error
    raise SettingsError(
        f"commit {wanted} is not in the upstream {run.settings.upstream_url}",
        untouched=f"{run.rel(run.workdir)}: nothing was changed",
        next_step="check the SHA (and the pin file), or map it to a source archive in "
        "[tool.skippy.archives] to prepare it offline",
    )


def mapped_commits(run: Run) -> list[str]:
    """The upstream commits mapped to a source archive in ``[tool.skippy.archives]``, sorted."""
    return sorted(str(k).lower() for k in (run.settings.raw.get("archives") or {}))


def is_local_url(url: str) -> bool:
    """Whether git reads ``url`` from this machine: a ``file://`` URL or a path (not ``host:path``)."""
    if url.startswith("file://"):
        return True
    return "://" not in url and ":" not in url.split("/", 1)[0]


def near_miss(wanted: str, known: Sequence[str]) -> str | None:
    """The one known commit ``wanted`` looks like a typo of: at most two digits differ (or one
    is added or left out), compared over ``wanted``'s length for an abbreviation."""
    found = []
    for key in known:
        if len(wanted) < len(key) - 1:
            near = _differ(wanted, key[: len(wanted)]) <= (1 if len(wanted) < 20 else 2)
        else:
            near = _differ(wanted, key) <= 2 or _one_edit(wanted, key)
        if near:
            found.append(key)
    return found[0] if len(found) == 1 else None


def _differ(a: str, b: str) -> int:
    return sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))


def _one_edit(a: str, b: str) -> bool:
    """``a`` and ``b`` differ by one inserted or deleted character."""
    if abs(len(a) - len(b)) != 1:
        return False
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _command(run: Run, sha: str | None, *, offline: bool) -> str:
    """The command that ran (``run.rerun``), with ``sha`` for its ``--sha`` and ``--offline`` as asked."""
    words = [w for w in run.rerun.split() if w != "--offline"]
    if sha is not None:
        if "--sha" in words and words.index("--sha") + 1 < len(words):
            words[words.index("--sha") + 1] = sha
        else:
            words += ["--sha", sha]
    return " ".join([*words, "--offline"] if offline else words)


def _unmapped_offline(run: Run, wanted: str, named: str) -> SettingsError:
    """Offline, a commit that is neither in the workdir nor mapped to a source archive: a typo of a
    mapped one (or of the pin), a local upstream that ``--offline`` does not read, or no source."""
    settings = run.settings
    url = settings.upstream_url
    pyproject = run.rel(settings.root / "pyproject.toml")
    mapped = mapped_commits(run)
    pin_mode = named.startswith("the pin file")
    untouched = f"{run.rel(run.workdir)}: nothing was fetched, imported or changed"
    listed = ", ".join(m[:12] for m in mapped) or "none"
    near = near_miss(wanted, mapped)
    if near is not None:
        fix = (
            f"put {near} in {run.rel(settings.pin_file)}, then `invoke prepare --offline`"
            if pin_mode
            else f"`{_command(run, near, offline=True)}`"
        )
        return SettingsError(
            f"{named}: {wanted} is not here and no source archive is mapped for it; {pyproject} maps {near}, "
            "a few digits away: a typo?",
            untouched=untouched,
            next_step=fix,
            details=f"commits mapped to a source archive in {pyproject} [tool.skippy.archives]: {listed}",
        )
    why = (
        f"--offline reads no upstream, not even the local repository {url}: offline, a commit comes from the "
        f"workdir or from a source archive mapped in {pyproject} [tool.skippy.archives] (mapped: {listed})"
    )
    if is_local_url(url):
        step = (
            f"drop --offline: `{_command(run, None if pin_mode else wanted, offline=False)}` reads the local "
            f"upstream {url} without the network; or map {wanted[:12]} to a source archive in "
            "[tool.skippy.archives]"
        )
    else:
        others = [m for m in mapped if m != wanted]
        step = "check the SHA (and the pin file), or map it to a source archive in [tool.skippy.archives]" + (
            f"; a mapped one: `{_command(run, others[-1][:12], offline=True)}`" if others and not pin_mode else ""
        )
    return SettingsError(
        f"commit {wanted} is not in the upstream {url} (offline: no archive is configured for it)",
        untouched=untouched,
        next_step=step,
        details=why,
    )


def _fetch_commit(run: Run, repo: Repo, wanted: str) -> Resolved | None:
    """Fetch the upstream branch, then (a full SHA not on it) the commit itself; raises NetworkError."""
    fetch(run, repo)
    local = lookup(run, repo, wanted)
    if local is None and len(wanted) == 40:
        try:
            repo.network("fetch", "--quiet", "origin", wanted, what="git fetch")
        except CommandError as exc:
            if disk_problem(exc.output_tail) is not None:
                raise
        local = lookup(run, repo, wanted)
    return local


def _archive_stands_in(run: Run, wanted: str, fetch_error: NetworkError | None) -> bool:
    """Offline any configured archive may hold ``wanted``; after a failed fetch, only one mapped for
    this very commit can stand in (an unmapped one would bury the fetch's own error under "no
    archive mapped")."""
    if len(wanted) != 40 or not has_archive_fallback(run):
        return False
    mapped = wanted in (run.settings.raw.get("archives") or {})
    return run.offline or (fetch_error is not None and mapped)


def lookup(run: Run, repo: Repo, wanted: str) -> Resolved | None:
    """``wanted`` when ``repo`` already has it (as a commit, or as the import of its archive)."""
    if len(wanted) != 40:
        full = repo.rev_parse(f"{wanted}^{{commit}}")
        return Resolved(full, full, "git") if full is not None else None
    if repo.has_commit(wanted):
        return Resolved(wanted, wanted, "git")
    archived = repo.rev_parse(f"refs/skippy/archive/{wanted}^{{commit}}")
    if archived is None:
        return None
    if wanted in (run.settings.raw.get("archives") or {}):
        # re-checks the recorded digest against the mapping (re-imports if it changed)
        from skippy.queue import archives

        return Resolved(wanted, archives.import_archive(run.settings, repo, wanted, run.console), "archive")
    return Resolved(wanted, archived, "archive")
