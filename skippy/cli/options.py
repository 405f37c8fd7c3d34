"""Every command-line option, declared once, as data.

Each command's options are one frozen dataclass whose fields carry their
declaration (``Annotated[bool, flag("...")]``); :data:`skippy.cli.commands.COMMANDS` names the
commands.  The invoke tasks (``tasks.py``), the nox sessions' argument parsers and
the README's option tables are made from it, and one path
(:func:`skippy.cli.run.run`) turns what either parsed into the command's typed
options object, once.  ``--json`` and ``--verbose`` are one declaration each,
shared by every command (:class:`Common`).
"""

from __future__ import annotations

import re
import shlex
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Annotated, Any, Final, Literal, TypeVar

from skippy.core.errors import SettingsError

Kind = Literal["flag", "text", "list", "int", "positional"]


class Refused(ValueError):
    """A value an option's converter refuses, with the next step that fixes it (a plain
    ValueError gets the generic one: give the option a valid value)."""

    def __init__(self, why: str, *, next_step: str) -> None:
        super().__init__(why)
        self.next_step = next_step


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"wants a positive number of jobs, got {text!r} (e.g. -j2)")
    return value


#: the cache entry types CMake knows (any other it silently takes for STRING)
CMAKE_TYPES: Final = ("BOOL", "FILEPATH", "PATH", "STRING", "INTERNAL", "UNINITIALIZED")
#: a `;`-separated element of a -D value that is itself a define (``-DA=1;-DB=2``)
_SMUGGLED = re.compile(r"^\s*-D\s*[A-Za-z_]")


def _define(text: str) -> tuple[str, str]:
    """``NAME[:TYPE]=VALUE`` -> ``(NAME, VALUE)``, parsed once: the plan passes it to CMake as
    ``-DNAME=VALUE`` (over the value it would set itself); the only arguments passed to CMake.

    A `;` in a value is a CMake list (``-DCMAKE_CUDA_ARCHITECTURES=86;89``), kept; a list
    element that is another define (``-DCMAKE_BUILD_TYPE=Debug;-DX=1``) would reach CMake as
    part of the first value, and is refused, as are a type CMake does not know and a line
    break (they would end in a failed configure or compile that blames the patch)."""
    from skippy.compile.request import DEFINE_ARG

    given = "-D" + text
    match = DEFINE_ARG.match(given)
    if not match:
        named = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.+-]*", text)
        raise Refused(
            f"{given} is not a CMake define: it wants -DNAME=VALUE or -DNAME:TYPE=VALUE",
            next_step=f"rerun with -D{text}=<value>"
            if named
            else "rerun with the define written -DNAME=VALUE (e.g. -DCMAKE_BUILD_TYPE=Release)",
        )
    name, value = match.group(1), match.group(2)
    kind = text[len(name) + 1 : text.index("=")] if text[len(name) : len(name) + 1] == ":" else ""
    if kind and kind not in CMAKE_TYPES:
        raise Refused(
            f"{given}: {kind} is not a CMake cache type ({', '.join(CMAKE_TYPES)}); CMake would take it for STRING",
            next_step=f"rerun with -D{name}:{kind.upper()}={value}"
            if kind.upper() in CMAKE_TYPES
            else f"rerun with -D{name}={value} (or -D{name}:STRING={value})",
        )
    if "\n" in value or "\r" in value:
        raise Refused(
            f"{given!r} has a line break in its value: a CMake cache value is one line",
            next_step=f"rerun with a one-line value for -D{name}",
        )
    first, *rest = value.split(";")
    smuggled = [item.strip() for item in rest if _SMUGGLED.match(item)]
    if smuggled:
        # each define with the list items that follow it
        groups = [[f"-D{text[: text.index('=')]}={first}"]]
        for item in rest:
            if _SMUGGLED.match(item):
                groups.append([item.strip()])
            else:
                groups[-1].append(item)
        defines = " ".join(shlex.quote(";".join(group)) for group in groups)
        raise Refused(
            f"{given} smuggles {' '.join(smuggled)} into the value of {name} after a `;` (a `;` separates the "
            f"items of one CMake list value; each define is a -D of its own)",
            next_step=f"rerun with each define as a -D of its own: {defines}",
        )
    return name, value


#: llama-server arguments the spot check gives itself, which a --server-arg must not change:
#: (the spellings llama.cpp knows for it) -> why, and what to use instead
OWNED_SERVER_ARGS: Final[tuple[tuple[tuple[str, ...], str, str], ...]] = (
    (
        ("--port", "--host"),
        "it starts llama-server on 127.0.0.1 at a free port it picks, and polls that port",
        "rerun without `--server-arg {arg}` and its value: the check picks a free port itself",
    ),
    (
        ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo"),
        "the model is the check's own --model",
        "rerun with --model MODEL (a .gguf path, tiny:<family> or Org/Repo[:quant]) instead of `--server-arg {arg}`",
    ),
    (
        ("--rpc",),
        "its RPC path starts an RPC server of its own",
        "rerun without `--server-arg {arg}` and its value (--no-rpc skips the RPC path)",
    ),
    (
        ("-c", "--ctx-size"),
        "the context size is its setting ctx_size",
        "set ctx_size under [tool.skippy.spot_check] in pyproject.toml and rerun without `--server-arg {arg}`",
    ),
    (
        ("-np", "--parallel"),
        "it runs one request at a time (--parallel 1)",
        "rerun without `--server-arg {arg}` and its value",
    ),
    (
        ("-lv", "--verbosity", "--log-verbosity", "--log-disable", "--log-file"),
        "it reads the server's log at verbosity 4 (failure lines, the device each layer went to)",
        "rerun without `--server-arg {arg}` (and its value)",
    ),
)


def _server_arg(text: str) -> str:
    """One extra llama-server argument; one the spot check gives itself is refused (a second
    ``--port`` would leave the check polling a port nobody listens on for the whole load timeout)."""
    flag = text.split("=", 1)[0]
    if flag.startswith("--"):
        flag = flag.replace("_", "-")  # llama.cpp reads --ctx_size as --ctx-size
    for spellings, why, fix in OWNED_SERVER_ARGS:
        if flag in spellings:
            raise Refused(f"{text}: the spot check sets {flag} itself ({why})", next_step=fix.format(arg=text))
    return text


_SHA = re.compile(r"[0-9a-fA-F]{7,40}")


def _pin_bump_sha(text: str) -> str:
    """A commit SHA, full or abbreviated (7 to 40 hex digits): checked before any network attempt."""
    if not _SHA.fullmatch(text):
        raise Refused(
            f"{text!r} is not a commit SHA (7 to 40 hex digits)",
            next_step="pass an upstream commit SHA, e.g. `invoke pin-bump --sha 4df29be4f4c3` (or no --sha to move "
            "to upstream master)",
        )
    return text


def _backend(text: str) -> str:
    from skippy.compile.backends import parse_backend

    return parse_backend(text) if text else text


@dataclass(frozen=True)
class Spec:
    """How one option is spelled and read (the field it annotates gives its name and type)."""

    help: str
    kind: Kind = "flag"
    #: the value it takes on the command line (help, README tables), e.g. ``SHA``
    metavar: str | None = None
    #: its short form, the same for the invoke task and the nox session (``-j``, ``-D``, ``-v``)
    short: str | None = None
    #: the environment variable that turns a flag on, where there is one
    env: str | None = None
    #: checks and normalizes one value (raises ValueError with the reason)
    convert: Callable[[str], object] | None = None


def flag(help: str, *, short: str | None = None, env: str | None = None) -> Spec:
    return Spec(help, "flag", short=short, env=env)


def text(help: str, metavar: str, *, convert: Callable[[str], object] | None = None) -> Spec:
    return Spec(help, "text", metavar=metavar, convert=convert)


def number(help: str, metavar: str, *, short: str | None = None) -> Spec:
    return Spec(help, "int", metavar=metavar, short=short, convert=_positive)


def repeated(
    help: str, metavar: str, *, short: str | None = None, convert: Callable[[str], object] | None = None
) -> Spec:
    return Spec(help, "list", metavar=metavar, short=short, convert=convert)


def positional(help: str, metavar: str) -> Spec:
    return Spec(help, "positional", metavar=metavar)


@dataclass(frozen=True)
class Option:
    """One option of one command: its field's ``name`` (``core_head`` -> ``--core-head``) and its spec."""

    name: str
    spec: Spec

    @property
    def flag(self) -> str:
        return "--" + self.name.rstrip("_").replace("_", "-")

    @property
    def help(self) -> str:
        return self.spec.help

    @property
    def kind(self) -> Kind:
        return self.spec.kind

    @property
    def metavar(self) -> str | None:
        return self.spec.metavar

    @property
    def short(self) -> str | None:
        return self.spec.short

    @property
    def env(self) -> str | None:
        return self.spec.env

    @property
    def names(self) -> tuple[str, ...]:
        """How it is written on a command line (``-j``, ``--jobs``), the same for invoke and nox."""
        return (self.short, self.flag) if self.short else (self.flag,)

    def value(self, raw: object, env: Mapping[str, str]) -> object:
        """``raw`` (what invoke or argparse parsed; None when not given) as the field's typed value."""
        spec = self.spec
        if spec.kind == "flag":
            on = env.get(spec.env, "").lower() in ("1", "true", "yes") if spec.env else False
            return bool(raw) or on
        if spec.kind == "list":
            items = raw if isinstance(raw, list | tuple) else () if raw is None else (raw,)
            return tuple(self._convert(str(item)) for item in items)
        if spec.kind == "int":
            return None if raw in (None, "") else self._convert(str(raw))
        return self._convert(str(raw)) if raw not in (None, "") else ""

    def _convert(self, raw: str) -> object:
        if self.spec.convert is None:
            return raw
        try:
            return self.spec.convert(raw)
        except ValueError as exc:
            raise SettingsError(
                f"{'/'.join(self.names)}: {exc}",
                untouched="everything: nothing was started",
                next_step=exc.next_step
                if isinstance(exc, Refused)
                else f"give {self.names[-1]} a valid value (see --help)",
            ) from None


# --- the options, by command ---------------------------------------------------

Offline = Annotated[bool, flag("never contact the upstream; use the configured source archive")]
Checkout = Annotated[
    str,
    text("the llama.cpp checkout to read (default: the workdir; only temporary worktrees are used)", "PATH"),
]
Models = Annotated[
    tuple[str, ...],
    repeated(
        "the spot check's model: gemma3-270m (default), tiny:<family>, a .gguf path, or Org/Repo[@rev][:quant]; "
        "repeatable",
        "MODEL",
    ),
]

Recheck = Annotated[
    bool,
    flag(
        "make the spot check's proofs again: a model's proofs made before for the same binaries, model, reference "
        "and settings are otherwise kept (shown `kept from <time>`) and no server is started for it"
    ),
]


@dataclass(frozen=True)
class Common:
    """What every command takes."""

    json: Annotated[bool, flag("print one JSON report on stdout (also on failure)")] = False
    verbose: Annotated[bool, flag("show every command run and step timings", short="-v")] = False


def _one_of(names: Sequence[tuple[str, bool]], *, untouched: str, next_step: str) -> str:
    chosen = [name for name, on in names if on]
    if len(chosen) > 1:
        raise SettingsError(
            f"choose one of {', '.join(n for n, _ in names)} (got {' and '.join(chosen)})",
            untouched=untouched,
            next_step=next_step,
        )
    return chosen[0] if chosen else ""


@dataclass(frozen=True)
class PrepareOptions(Common):
    pinned: Annotated[bool, flag("prepare the commit in the pin file (default)")] = False
    latest: Annotated[bool, flag("prepare upstream master")] = False
    sha: Annotated[
        str,
        text(
            "prepare this upstream commit (offline, an abbreviation of the pin or of a configured archive works)", "SHA"
        ),
    ] = ""
    force: Annotated[bool, flag("discard local work in the workdir (saved under a backup ref first)")] = False
    offline: Offline = False
    triage: Annotated[bool, flag("only try every patch against the target and report (nothing is applied)")] = False
    continue_: Annotated[bool, flag("finish a stopped conflict session after resolving and staging")] = False
    skip: Annotated[bool, flag("leave the stopped patch out and finish the session")] = False
    abort: Annotated[bool, flag("end the stopped session and go back to the previous checkout")] = False
    no_interactive: Annotated[
        bool, flag("on a conflict, abort and report instead of leaving the session stopped (CI does this)")
    ] = False

    def __post_init__(self) -> None:
        target = _one_of(
            (("--pinned", self.pinned), ("--latest", self.latest), ("--sha", bool(self.sha))),
            untouched="everything",
            next_step="invoke prepare --pinned",
        )
        resume = self.resume
        if resume and (target or self.triage or self.force):
            raise SettingsError(
                f"--{resume} drives the stopped session: it takes no target, --triage or --force",
                untouched="everything",
                next_step=f"invoke prepare --{resume}",
            )

    @property
    def resume(self) -> Literal["continue", "skip", "abort", ""]:
        chosen = _one_of(
            (("--continue", self.continue_), ("--skip", self.skip), ("--abort", self.abort)),
            untouched="everything: the stopped session is as it was",
            next_step="invoke prepare --continue (or --skip, or --abort)",
        )
        return typing.cast(Literal["continue", "skip", "abort", ""], chosen.removeprefix("--"))


@dataclass(frozen=True)
class TriageOptions(Common):
    latest: Annotated[bool, flag("triage against upstream master (default: the pin)")] = False
    sha: Annotated[str, text("triage against this upstream commit", "SHA")] = ""
    offline: Offline = False


@dataclass(frozen=True)
class BuildOptions(Common):
    backend: Annotated[
        str, text("the backend to build (default cpu; the nox session's name says it)", "NAME", convert=_backend)
    ] = "cpu"
    #: the -D values as (name, value) pairs, in the order given (a name given twice: the last one wins)
    define: Annotated[
        tuple[tuple[str, str], ...],
        repeated(
            "a CMake cache value (overrides ours; repeatable): the only arguments passed to CMake",
            "NAME[:TYPE]=VALUE",
            short="-D",
            convert=_define,
        ),
    ] = ()
    jobs: Annotated[int | None, number("parallel build jobs", "N", short="-j")] = None
    skip_unavailable: Annotated[
        bool,
        flag("a backend this host cannot build shows as skipped instead of failing", env="SKIPPY_SKIP_UNAVAILABLE"),
    ] = False
    no_spot_check: Annotated[bool, flag("build only: no spot check")] = False
    workdir_as_is: Annotated[
        bool,
        flag(
            "build the workdir as it stands (uncommitted edits and local commits included) without preparing or "
            "touching it, in a build dir of its own keyed by its state; the binary reports queue digest `local`"
        ),
    ] = False
    upstream_tests: Annotated[
        bool,
        flag(
            "then build and run upstream's tests (`ctest -L main` and the queue's own; a GPU backend: its ops "
            "against the CPU); a failure is checked on the unpatched pin and traced to the first patch that causes it"
        ),
    ] = False
    model: Models = ()
    recheck: Recheck = False


@dataclass(frozen=True)
class SpotCheckOptions(Common):
    model: Models = ()
    server: Annotated[str, text("llama-server to check (default: the newest build of --backend)", "PATH")] = ""
    backend: Annotated[str, text("check this backend's newest build (default: cpu)", "NAME", convert=_backend)] = ""
    server_arg: Annotated[
        tuple[str, ...],
        repeated(
            "extra llama-server argument, one per flag or value (--server-arg=--threads --server-arg=2); "
            "repeatable; the ones the check sets itself (--port, --host, --model, --rpc, --ctx-size, --parallel, "
            "the log's) are refused",
            "ARG",
            convert=_server_arg,
        ),
    ] = ()
    no_provenance: Annotated[
        bool, flag("do not require the binary to report the workdir's pin and queue digest (said loudly)")
    ] = False
    workdir_as_is: Annotated[
        bool,
        flag("expect a binary built from the workdir as it stands (queue digest local); refused otherwise"),
    ] = False
    write_reference: Annotated[
        bool, flag("record this CPU build's fingerprints as the committed reference (beside the queue)")
    ] = False
    no_rpc: Annotated[bool, flag("skip the RPC path (the RPC server beside the binary)")] = False
    recheck: Recheck = False


@dataclass(frozen=True)
class StatusOptions(Common):
    pass


@dataclass(frozen=True)
class PinBumpOptions(Common):
    sha: Annotated[
        str, text("the upstream commit to move to (default: upstream master)", "SHA", convert=_pin_bump_sha)
    ] = ""
    backend: Annotated[
        tuple[str, ...],
        repeated("build and spot-check this backend (repeatable; default cpu)", "NAME", convert=_backend),
    ] = ()
    dry_run: Annotated[bool, flag("do everything but write the pin")] = False
    allow_non_descendant: Annotated[bool, flag("allow a target that does not descend from the current pin")] = False
    newest_compatible: Annotated[bool, flag("bump to the newest upstream commit the whole queue applies to")] = False
    offline: Annotated[
        bool,
        flag(
            "never contact the upstream: --sha and the pin come from their source archives (what needs "
            "upstream history is left out, and said so)"
        ),
    ] = False
    no_upstream_tests: Annotated[
        bool, flag("skip upstream's tests on the CPU build (by default a test the queue breaks keeps the pin)")
    ] = False
    drop: Annotated[
        tuple[str, ...],
        repeated(
            "remove this patch from the queue before the bump (one upstream already carries; repeatable; "
            "its file stays in the project's git history)",
            "PATCH",
        ),
    ] = ()
    keep: Annotated[
        tuple[str, ...],
        repeated("keep this patch although upstream seems to carry it already (repeatable)", "PATCH"),
    ] = ()


@dataclass(frozen=True)
class CleanOptions(Common):
    dry_run: Annotated[
        bool, flag("list each path that would be removed, with its size and why, and remove nothing")
    ] = False


@dataclass(frozen=True)
class SummaryOptions(Common):
    old: Annotated[str, positional("older upstream commit", "OLD")] = ""
    new: Annotated[str, positional("newer upstream commit", "NEW")] = ""


@dataclass(frozen=True)
class BisectOptions(Common):
    to: Annotated[str, text("upstream ref to search up to (default: upstream master)", "REF")] = ""


@dataclass(frozen=True)
class RegenerateOptions(Common):
    core_head: Annotated[
        str,
        text(
            "branch or commit whose commits since the pin become the core lane (default: read from the "
            "workdir's history)",
            "REF",
        ),
    ] = ""
    model_support_head: Annotated[
        str, text("branch or commit whose commits since --core-head become the model_support lane", "REF")
    ] = ""
    checkout: Checkout = ""
    offline: Offline = False

    def __post_init__(self) -> None:
        if bool(self.core_head) != bool(self.model_support_head):
            given, missing = ("--core-head", "--model-support-head")[:: 1 if self.core_head else -1]
            raise SettingsError(
                f"regenerate got {given} without {missing}: name both branches, or neither",
                untouched="everything: the queue was not changed",
                next_step="`invoke regenerate` (the lanes from the prepared workdir's history), or "
                "`invoke regenerate --core-head BRANCH --model-support-head BRANCH`",
            )


@dataclass(frozen=True)
class GenerateOptions(Common):
    check: Annotated[bool, flag("only compare the checked-in lane with a fresh generation; fail on drift")] = False
    checkout: Checkout = ""
    offline: Offline = False


@dataclass(frozen=True)
class AuditOptions(Common):
    checkout: Checkout = ""
    offline: Offline = False


OptionsT = TypeVar("OptionsT", bound=Common)


def options_of(cls: type[Common]) -> tuple[Option, ...]:
    """``cls``'s options, in the order of its help: its own, then --json and --verbose."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found = []
    for f in fields(cls):
        spec = next(m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Spec))
        found.append(Option(f.name, spec))
    common = {f.name for f in fields(Common)}
    return (*(o for o in found if o.name not in common), *(o for o in found if o.name in common))


def make(cls: type[OptionsT], values: Mapping[str, object], env: Mapping[str, str], *, prog: str = "") -> OptionsT:
    """The typed options object from what a parser found (option name -> raw value; missing: not given).

    Every value is converted and checked here, once, for invoke and nox alike; a value refused is
    named with the command ``prog`` (``invoke prepare``), as the parser names its own refusals."""
    options = {o.name: o for o in options_of(cls)}
    unknown = sorted(set(values) - set(options))
    if unknown:
        raise ValueError(f"{cls.__name__} has no option {', '.join(unknown)}")  # a bug in an entry point
    try:
        typed: dict[str, Any] = {name: o.value(values[name], env) for name, o in options.items() if name in values}
        typed |= {name: o.value(None, env) for name, o in options.items() if name not in values and o.env}
        return cls(**typed)
    except SettingsError as exc:
        if not prog:
            raise
        raise SettingsError(
            f"{prog}: {exc.what}", untouched=exc.untouched, next_step=exc.next_step, details=exc.details
        ) from exc


#: the one spelling of --json (a run whose arguments cannot be parsed looks for it among them)
JSON_FLAG: Final = "--json"


def render_table(options: Sequence[Option]) -> str:
    """A Markdown table of ``options`` (the README's option tables are made with this)."""
    lines = ["| option | what it does |", "| --- | --- |"]
    for o in options:
        if o.kind == "positional":
            name = f"`{o.metavar}`"
        else:
            value = f" {o.metavar}" if o.metavar else ""
            name = ", ".join(f"`{n}{value}`" for n in o.names)
        env = f" (default from `{o.env}`)" if o.env else ""
        lines.append(f"| {name} | {o.help}{env} |")
    return "\n".join(lines)
