"""Every command-line option, declared once, as data.

The invoke tasks (``tasks.py``), the argument parsing of the nox sessions and the
README's option tables are all made from :data:`COMMANDS`; the library entry
point each command calls takes exactly these options as keyword arguments (a
unit test holds the two together).  ``--json`` and ``--verbose`` are one
declaration each, shared by every command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

Kind = Literal["flag", "text", "list", "int", "positional"]


@dataclass(frozen=True)
class Option:
    """One option: ``name`` is its Python name (``core_head`` -> ``--core-head``)."""

    name: str
    help: str
    kind: Kind = "flag"
    #: the entry point's keyword for it, when not ``name`` (``json`` -> ``as_json``)
    param: str | None = None
    #: the environment variable that gives its default, where there is one
    env: str | None = None
    #: the value it takes on the command line (README tables), e.g. ``SHA``
    metavar: str | None = None
    #: a short form for the nox sessions' arguments (``-j``, ``-D``); invoke tasks have none
    short: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.rstrip("_").replace("_", "-")

    @property
    def keyword(self) -> str:
        return self.param or self.name

    @property
    def default(self) -> bool | str | int | None:
        defaults: dict[Kind, bool | str | int | None] = {"flag": False, "text": ""}
        return defaults.get(self.kind)


JSON: Final = Option("json", "print one JSON report on stdout (also on failure)", param="as_json")
VERBOSE: Final = Option("verbose", "show every command run and step timings")
OFFLINE: Final = Option("offline", "never contact the upstream; use the configured source archive")
CHECKOUT: Final = Option(
    "checkout",
    "the llama.cpp checkout to read (default: the workdir; only temporary worktrees are used)",
    kind="text",
    metavar="PATH",
)

#: options every command takes
COMMON: Final = (JSON, VERBOSE)

WORKDIR_AS_IS: Final = Option(
    "workdir_as_is",
    "build the workdir as it stands (uncommitted edits and local commits included) without preparing or "
    "touching it, in a build dir of its own keyed by its state; the binary reports queue digest `local`",
)

#: the options of ``nox -s build-<backend> -- ...`` (and of ``invoke build`` besides --backend)
BUILD_SESSION: Final = (
    Option(
        "define",
        "a CMake cache value (overrides ours; repeatable): the only arguments passed to CMake",
        kind="list",
        metavar="NAME[:TYPE]=VALUE",
        short="-D",
    ),
    Option("jobs", "parallel build jobs", kind="int", metavar="N", short="-j"),
    Option(
        "skip_unavailable",
        "a backend this host cannot build shows as skipped instead of failing",
        env="SKIPPY_SKIP_UNAVAILABLE",
    ),
    Option("no_spot_check", "build only: no spot check"),
    WORKDIR_AS_IS,
    Option(
        "upstream_tests",
        "then build and run upstream's tests (`ctest -L main` and the queue's own); a failure is checked on "
        "the unpatched pin and traced to the first patch that causes it",
    ),
)


@dataclass(frozen=True)
class Command:
    """One command: an invoke task (or a nox session's options) and the entry point it calls."""

    name: str
    help: str
    #: ``module:function``, called as ``function(env, root=..., **options)``
    target: str
    options: tuple[Option, ...] = ()

    @property
    def all_options(self) -> tuple[Option, ...]:
        return (*self.options, *COMMON)

    def option(self, name: str) -> Option:
        for option in self.all_options:
            if option.name == name:
                return option
        raise KeyError(name)


_MAINTAIN: Final = (CHECKOUT, OFFLINE)

#: the invoke tasks, in the order ``invoke --list`` shows them
COMMANDS: Final[tuple[Command, ...]] = (
    Command(
        "prepare",
        "Check out upstream llama.cpp and apply the patch queue (git am --3way, three lanes).",
        "skippy.cli.app:prepare_main",
        (
            Option("pinned", "prepare the commit in the pin file (default)"),
            Option("latest", "prepare upstream master"),
            Option(
                "sha",
                "prepare this upstream commit (offline, an abbreviation of the pin or of a configured archive works)",
                kind="text",
                metavar="SHA",
            ),
            Option("force", "discard local work in the workdir (saved under a backup ref first)"),
            OFFLINE,
            Option("triage", "only try every patch against the target and report (nothing is applied)"),
            Option("continue_", "finish a stopped conflict session after resolving and staging"),
            Option("skip", "leave the stopped patch out and finish the session"),
            Option("abort", "end the stopped session and go back to the previous checkout"),
            Option(
                "no_interactive",
                "on a conflict, abort and report instead of leaving the session stopped (CI does this)",
            ),
        ),
    ),
    Command(
        "triage",
        "Try every patch of every lane against a target and classify each (clean/3way/conflict/...).",
        "skippy.cli.app:triage_main",
        (
            Option("latest", "triage against upstream master (default: the pin)"),
            Option("sha", "triage against this upstream commit", kind="text", metavar="SHA"),
            OFFLINE,
        ),
    ),
    Command(
        "build",
        "Build and spot-check one backend: what `nox -s build-<backend>` runs, with the same options.",
        "skippy.cli.build:build_task_main",
        (
            Option("backend", "the backend to build (default cpu)", kind="text", metavar="NAME"),
            *BUILD_SESSION,
        ),
    ),
    Command(
        "status",
        "Pin, upstream and patched SHAs, queue digest, local work, and what prepare would do.",
        "skippy.cli.app:status_main",
    ),
    Command(
        "pin_bump",
        "Prepare, build, spot-check and audit a new upstream, then move the pin (atomically) and summarize.",
        "skippy.cli.app:pin_bump_main",
        (
            Option("sha", "the upstream commit to move to (default: upstream master)", kind="text", metavar="SHA"),
            Option(
                "backend",
                "build and spot-check this backend (repeatable; default cpu)",
                kind="list",
                param="backends",
                metavar="NAME",
            ),
            Option("dry_run", "do everything but write the pin"),
            Option("allow_non_descendant", "allow a target that does not descend from the current pin"),
            Option("newest_compatible", "bump to the newest upstream commit the whole queue applies to"),
            Option(
                "offline",
                "never contact the upstream: --sha and the pin come from their source archives (what needs "
                "upstream history is left out, and said so)",
            ),
            Option(
                "no_upstream_tests",
                "skip upstream's tests on the CPU build (by default a test the queue breaks keeps the pin)",
            ),
        ),
    ),
    Command(
        "summary",
        "Pull-request Markdown of upstream OLD..NEW: commits, diffstat, areas, patches exposed.",
        "skippy.cli.app:summary_main",
        (
            Option("old", "older upstream commit", kind="positional", metavar="OLD"),
            Option("new", "newer upstream commit", kind="positional", metavar="NEW"),
        ),
    ),
    Command(
        "bisect",
        "Newest upstream commit the whole queue applies to, and the commit that first breaks each failing patch.",
        "skippy.cli.app:bisect_main",
        (Option("to", "upstream ref to search up to (default: upstream master)", kind="text", metavar="REF"),),
    ),
    Command(
        "regenerate",
        "Write the core and model_support lanes back from the prepared workdir's commits (their Skippy-Patch "
        "trailers say which lane), or from two branches (verified; backup restored on failure).",
        "skippy.cli.maintain:regenerate_main",
        (
            Option(
                "core_head",
                "branch or commit whose commits since the pin become the core lane (default: read from the "
                "workdir's history)",
                kind="text",
                metavar="REF",
            ),
            Option(
                "model_support_head",
                "branch or commit whose commits since --core-head become the model_support lane",
                kind="text",
                metavar="REF",
            ),
            *_MAINTAIN,
        ),
    ),
    Command(
        "generate",
        "Rewrite the generated lane from generated/families.toml and the pinned tree (or --check it).",
        "skippy.cli.maintain:generate_main",
        (Option("check", "only compare the checked-in lane with a fresh generation; fail on drift"), *_MAINTAIN),
    ),
    Command(
        "parity",
        "Audit the arch cases the queue drops (allowlist beside the queue) and list its upstream deletions.",
        "skippy.cli.maintain:parity_main",
        _MAINTAIN,
    ),
    Command(
        "check",
        "Everything a reviewer needs: validate, apply all lanes, parity, generated-lane drift, boundary lint.",
        "skippy.cli.maintain:check_main",
        _MAINTAIN,
    ),
    Command(
        "clean",
        "Remove old build dirs (keeping each backend's newest build of the prepared tree) and source archives "
        "no longer configured; never the workdir, the queue or the backups.",
        "skippy.cli.clean:clean_main",
        (Option("dry_run", "list each path that would be removed, with its size and why, and remove nothing"),),
    ),
)


def command(name: str) -> Command:
    for c in COMMANDS:
        if c.name == name:
            return c
    raise KeyError(name)


@dataclass(frozen=True)
class Parsed:
    """Options parsed from a nox session's arguments."""

    values: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    #: ``-D...`` arguments, in order (build sessions hand them to CMake)
    defines: tuple[str, ...] = ()


def render_table(options: Sequence[Option]) -> str:
    """A Markdown table of ``options`` (the README's option tables are made with this)."""
    lines = ["| option | what it does |", "| --- | --- |"]
    for o in options:
        name = o.metavar if o.kind == "positional" else o.flag + (f" {o.metavar}" if o.metavar else "")
        short = f" (`{o.short}` in nox sessions)" if o.short else ""
        env = f" (default from `{o.env}`)" if o.env else ""
        lines.append(f"| `{name}`{short} | {o.help}{env} |")
    return "\n".join(lines)


#: the README block between these markers is made by :func:`readme_block`
README_BEGIN: Final = "<!-- options: made from skippy/cli/options.py by `python -m skippy.cli.options README.md` -->"
README_END: Final = "<!-- options: end -->"


def readme_block() -> str:
    """The README's option reference: one table per command, in the table's order."""
    parts = [README_BEGIN]
    for c in COMMANDS:
        parts += ["", f"`invoke {c.name.replace('_', '-')}`: {c.help}", "", render_table(c.all_options)]
    parts += ["", README_END]
    return "\n".join(parts)


def rewrite_readme(text: str) -> str:
    """``text`` with its option block replaced by :func:`readme_block` (ValueError without the markers)."""
    start = text.index(README_BEGIN)
    end = text.index(README_END, start) + len(README_END)
    return text[:start] + readme_block() + text[end:]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    readme = Path(sys.argv[1])
    readme.write_text(rewrite_readme(readme.read_text(encoding="utf-8")), encoding="utf-8")
