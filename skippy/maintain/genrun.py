"""Running a generator of the generated lane in a sandbox, and what it changed.

The sandbox is a folder of this run (``<cache_dir>/tmp/generate-*``) holding:

* ``tree/``: a detached worktree of the workdir's repository at the commit the lane
  applies to (pin + core + model_support), where the generator runs (its cwd);
* ``families.json``: the families to generate (``SKIPPY_FAMILIES`` names it);
* ``build/``: a configured CMake build dir, when the generator asks for
  ``compile_commands.json`` (``SKIPPY_COMPILE_COMMANDS`` names the file);
* ``tmp/``: the generator's ``TMPDIR``.

A user's generator (``[tool.skippy.generated] command``) runs with the user's
environment plus those variables and ``SKIPPY_TREE``.  Afterwards skippy refuses
what it should not have done, naming it, before anything of the lane is written:
exiting non-zero, running past its ``timeout``, creating anything in the sandbox
beside its tree, changing the project's files (the queue, ``pyproject.toml``,
anything at the project's top level) or the workdir, committing or moving the
tree's HEAD, adding a symlink or a submodule to the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.core import proc
from skippy.core.errors import CommandError, QueueError, SettingsError
from skippy.core.git import Repo
from skippy.core.redact import value_excerpt
from skippy.core.settings import Settings
from skippy.core.ui import Console

#: what is expected in the sandbox beside the tree (anything else was written by the generator)
SANDBOX_ENTRIES = frozenset({"tree", "families.json", "build", "tmp"})
UNTOUCHED = "everything: the generated lane was not changed (the generator ran in a temporary worktree)"


@dataclass(frozen=True)
class Generator:
    """Which generator makes the lane: the built-in (no argv) or the user's command."""

    argv: tuple[str, ...] = ()
    timeout: float = 600.0
    compile_commands: bool = False

    @property
    def builtin(self) -> bool:
        return not self.argv

    def files(self, root: Path) -> list[Path]:
        """The generator's own files: the arguments that name a regular file inside the project."""
        out: list[Path] = []
        for arg in self.argv:
            path = Path(arg) if Path(arg).is_absolute() else root / arg
            try:
                resolved = path.resolve()
            except OSError:
                continue
            if resolved.is_file() and resolved.is_relative_to(root.resolve()):
                out.append(resolved)
        return out

    def resolved_argv(self, root: Path) -> list[str]:
        """The command line with each argument that names a file of the project (relative to its
        root) made absolute: the generator runs in the tree, not in the project."""
        return [str(root / arg) if not Path(arg).is_absolute() and (root / arg).is_file() else arg for arg in self.argv]

    def digest(self, root: Path) -> str:
        """sha256 over the command line and its own files' paths and bytes."""
        h = hashlib.sha256(json.dumps(list(self.argv)).encode())
        for path in self.files(root):
            h.update(b"\0" + str(path.relative_to(root.resolve())).encode() + b"\0")
            h.update(path.read_bytes())
        return h.hexdigest()


GENERATED_KEYS = ("command", "timeout", "compile_commands")
EXAMPLE = 'command = ["python3", "tools/gen_families.py"]'


def generator_from_settings(settings: Settings) -> Generator:
    """``[tool.skippy.generated]``: the built-in generator unless ``command`` names one."""
    table = settings.subtable("generated", GENERATED_KEYS, example=EXAMPLE)
    where = "pyproject.toml [tool.skippy.generated]"
    command = table.get("command", [])
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list) or not all(isinstance(a, str) and a for a in command):
        raise _settings_error(
            f"{where} command must be a list of non-empty strings (argv), got {value_excerpt(command)}"
        )
    timeout = table.get("timeout", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= 86400:
        raise _settings_error(f"{where} timeout must be seconds between 1 and 86400, got {value_excerpt(timeout)}")
    wants = table.get("compile_commands", False)
    if not isinstance(wants, bool):
        raise _settings_error(f"{where} compile_commands must be true or false, got {value_excerpt(wants)}")
    if wants and not command:
        raise _settings_error(f"{where} compile_commands is for a generator command (the built-in reads no build)")
    return Generator(tuple(command), float(timeout), wants)


def _settings_error(what: str) -> SettingsError:
    return SettingsError(what, untouched="everything", next_step=f"fix it in pyproject.toml, e.g. {EXAMPLE}")


# --------------------------------------------------------------------------- snapshots


def _files_under(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            yield Path(dirpath) / name


def _stat_key(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return (st.st_mode, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class ProjectSnapshot:
    """What of the project a generator must leave as it was."""

    entries: Mapping[str, tuple[int, int, int]]
    workdir: tuple[str, str] | None

    @classmethod
    def take(cls, settings: Settings) -> ProjectSnapshot:
        entries: dict[str, tuple[int, int, int]] = {}
        root = settings.root
        for child in sorted(root.iterdir()):
            if child.name in (".git",):
                continue
            entries[child.name] = _stat_key(child)
        if settings.patch_dir.is_dir():
            for path in _files_under(settings.patch_dir):
                entries[str(path.relative_to(root))] = _stat_key(path)
        workdir = None
        if (settings.workdir / ".git").exists():
            repo = Repo(settings.workdir, settings.env)
            status = repo.git("status", "--porcelain", "--untracked-files=all", check=False).stdout
            workdir = (repo.head() or "", status)
        return cls(entries, workdir)

    def changes(self, after: ProjectSnapshot) -> list[str]:
        changed = sorted(k for k in {*self.entries, *after.entries} if self.entries.get(k) != after.entries.get(k))
        if self.workdir != after.workdir:
            changed.append("the workdir (its HEAD or its files)")
        return changed


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Sandbox:
    root: Path
    tree: Repo
    start: str  # the commit the tree started at

    @property
    def families_json(self) -> Path:
        return self.root / "families.json"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"


def write_families(sandbox: Sandbox, families: Sequence[Mapping[str, object]]) -> None:
    data = {"schema": 1, "tree": str(sandbox.tree.path), "families": list(families)}
    sandbox.families_json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def configure(sandbox: Sandbox, settings: Settings, console: Console) -> Path:
    """A configured CMake build dir of the tree beside it; its ``compile_commands.json``."""
    argv = [
        "cmake",
        "-S",
        str(sandbox.tree.path),
        "-B",
        str(sandbox.build_dir),
        "-G",
        "Ninja",
        "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DGGML_RPC=ON",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
    ]
    with console.step("generate: configure the tree for the generator's compile_commands.json"):
        proc.run(argv, env=dict(settings.env), echo=console.command, what="cmake configure for the generator")
    path = sandbox.build_dir / "compile_commands.json"
    if not path.is_file():
        raise QueueError(
            f"cmake did not write {path.name} for the generator",
            untouched=UNTOUCHED,
            next_step="check that cmake and ninja are installed (`cmake --version`), then `invoke generate`",
        )
    return path


def run_generator(
    generator: Generator,
    sandbox: Sandbox,
    settings: Settings,
    console: Console,
    *,
    compile_commands: Path | None,
    attempt: str,
) -> None:
    """Run the user's generator in the sandbox's tree; QueueError for anything it should not do."""
    (sandbox.root / "tmp").mkdir(exist_ok=True)
    env = dict(settings.env)
    env.update(
        {
            "SKIPPY_TREE": str(sandbox.tree.path),
            "SKIPPY_FAMILIES": str(sandbox.families_json),
            "TMPDIR": str(sandbox.root / "tmp"),
        }
    )
    env.pop("SKIPPY_COMPILE_COMMANDS", None)
    if compile_commands is not None:
        env["SKIPPY_COMPILE_COMMANDS"] = str(compile_commands)
    before = ProjectSnapshot.take(settings)
    shown = " ".join(generator.argv)
    try:
        with console.step(f"generate: run the generator ({attempt}): {shown}"):
            proc.run(
                generator.resolved_argv(settings.root),
                env=env,
                cwd=sandbox.tree.path,
                timeout=generator.timeout,
                echo=console.command,
                on_line=console.detail,
                what=f"the generator `{shown}` ({attempt})",
            )
    except CommandError as exc:
        raise QueueError(
            f"the generator `{shown}` failed ({attempt}): {exc.what}",
            details=exc.details,
            untouched=UNTOUCHED,
            next_step="fix the generator named by [tool.skippy.generated] command in pyproject.toml "
            "(it runs in a worktree of pin + core + model_support; SKIPPY_FAMILIES names its families), "
            "then `invoke generate`",
        ) from exc
    problems = [f"wrote {name} beside the tree" for name in _sandbox_extras(sandbox)]
    problems += [f"changed {what} of the project" for what in before.changes(ProjectSnapshot.take(settings))]
    head = sandbox.tree.head()
    if head != sandbox.start:
        problems.append(f"moved the tree's HEAD (to {head or 'nothing'}): skippy makes the commits")
    problems += _tree_problems(sandbox.tree)
    if problems:
        raise QueueError(
            f"the generator `{shown}` wrote outside its tree ({attempt})",
            details="\n".join(problems),
            untouched=UNTOUCHED + "; what it wrote outside is named above, not undone",
            next_step="make the generator edit only files of the tree it runs in (its cwd, SKIPPY_TREE), "
            "then `invoke generate`",
        )


def _sandbox_extras(sandbox: Sandbox) -> list[str]:
    return sorted(p.name for p in sandbox.root.iterdir() if p.name not in SANDBOX_ENTRIES)


def _tree_problems(tree: Repo) -> list[str]:
    """Links and submodules added to the tree (the lane carries regular files only)."""
    kinds = {"120000": "a symlink", "160000": "a submodule"}
    return [f"added {kinds[mode]} {path}" for path, (_status, mode) in _staged(tree).items() if mode in kinds]


def _staged(tree: Repo) -> dict[str, tuple[str, str]]:
    """Everything that differs from HEAD in the tree, staged (untracked files included):
    path -> (status letter, new mode)."""
    tree.git("add", "-A")
    fields = tree.git("diff", "--cached", "--raw", "-z", "--no-renames", "HEAD").stdout.split("\0")
    # --raw -z: ":<old mode> <new mode> <old id> <new id> <status>" NUL "<path>" NUL, per file
    return {
        path: (meta.split()[4], meta.split()[1])
        for meta, path in zip(fields[0::2], fields[1::2], strict=False)
        if meta.startswith(":")
    }


def changed_files(tree: Repo) -> dict[str, str]:
    """What differs from HEAD in the tree (untracked files included): path -> status letter."""
    return {path: status for path, (status, _mode) in _staged(tree).items()}
