"""A CUDA toolkit assembled from the package index's wheels, for machines without one.

NVIDIA publishes the CUDA 13 compiler and libraries as wheels (``nvidia-cuda-nvcc``,
``nvidia-cuda-runtime``, ``nvidia-cublas``, ``nvidia-cuda-cccl``, ``nvidia-cuda-crt``,
``nvidia-nvvm``); each unpacks under ``nvidia/cu13/``.  :func:`assemble` downloads the
versions pinned in ``[tool.skippy.build.cuda_wheels]`` with pip (hash-checked twice: by
pip and here), unpacks them once under the project cache and merges them into one
directory shaped like an installed toolkit, which CMake's ``enable_language(CUDA)`` and
FindCUDAToolkit accept:

* ``bin/`` a real directory (nvcc reads ``nvcc.profile`` beside itself), ``include/``,
  ``nvvm/``, ``lib/`` with the versionless ``libX.so`` links the linker needs (the wheels
  ship only the SONAME files), ``lib64 -> lib`` and ``targets/x86_64-linux/{include,lib}``;
* ``lib/stubs/libcuda.so``: the driver's link-time stub (the wheels carry no driver; an
  installed toolkit ships one there), generated from the toolkit's ``cuda.h``: every
  driver entry point returns CUDA_ERROR_STUB_LIBRARY, SONAME ``libcuda.so.1``.

Files are hard links into the unpacked wheels (copies across file systems), so resolving
a path (CMake resolves nvcc's) never leaves the merged tree.  The toolkit is made
once (:func:`skippy.compile.fetched.fetch_once`): a folder without its marker (an interrupted
run) is never used; the downloaded wheels are kept apart (:func:`wheels_home`).

The pure parts (pins, the choice of toolkit, the merge layout, the stub's source) are
separate functions for the unit tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import sys
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Final

from skippy.compile.backends.base import resolve_choice
from skippy.compile.fetched import fetch_once
from skippy.core import pip, proc
from skippy.core.errors import CommandError, NetworkError, SettingsError, ToolchainMissing
from skippy.core.files import sha256_of

#: the wheels that make a toolkit able to build ggml-cuda (compiler, front ends, runtime, cuBLAS, CCCL)
REQUIRED_WHEELS: Final = (
    "nvidia-cuda-nvcc",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
    "nvidia-cublas",
)

#: where every CUDA 13 wheel puts its files
WHEEL_PREFIX: Final = PurePosixPath("nvidia/cu13")

#: the target directory name of an x86_64 Linux toolkit (nvcc.profile's ``$(_TARGET_DIR_)``)
TARGET_DIR: Final = PurePosixPath("targets/x86_64-linux")

#: ``[tool.skippy.build] cuda_toolkit`` / ``SKIPPY_CUDA_TOOLKIT`` values
TOOLKIT_CHOICES: Final = ("auto", "system", "wheels")
TOOLKIT_ENV: Final = "SKIPPY_CUDA_TOOLKIT"

#: the driver's "this is the stub library" result (cuda.h: CUDA_ERROR_STUB_LIBRARY)
CUDA_ERROR_STUB_LIBRARY: Final = 34
STUB_SONAME: Final = "libcuda.so.1"

#: seconds the whole download may take (about 500 MB)
PIP_TIMEOUT: Final = 3600.0


def _bad_pins(problem: str) -> SettingsError:
    return SettingsError(
        f"pyproject.toml [tool.skippy.build.cuda_wheels]: {problem}",
        untouched="everything: nothing was downloaded or built",
        next_step='give each wheel as name = { version = "13.0.88", sha256 = "<64 hex digits>" } '
        f"(the wheels: {', '.join(REQUIRED_WHEELS)})",
    )


# --- pure parts --------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelPin:
    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def parse_wheel_pins(table: object) -> tuple[WheelPin, ...]:
    """``[tool.skippy.build.cuda_wheels]`` -> the pins, in :data:`REQUIRED_WHEELS` order."""
    if not isinstance(table, Mapping) or not table:
        raise _bad_pins("missing (the wheel toolkit needs its versions and hashes)")
    unknown = sorted(set(table) - set(REQUIRED_WHEELS))
    if unknown:
        raise _bad_pins(f"unknown wheel(s) {', '.join(unknown)}")
    missing = [name for name in REQUIRED_WHEELS if name not in table]
    if missing:
        raise _bad_pins(f"missing {', '.join(missing)}")
    pins: list[WheelPin] = []
    for name in REQUIRED_WHEELS:
        entry = table[name]
        if not isinstance(entry, Mapping) or set(entry) != {"version", "sha256"}:
            raise _bad_pins(f"{name} must be a table with exactly version and sha256")
        version, digest = entry["version"], entry["sha256"]
        if not isinstance(version, str) or not re.fullmatch(r"\d+(\.\d+)*", version):
            raise _bad_pins(f"{name}: version {version!r} is not a release number")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _bad_pins(f"{name}: sha256 {digest!r} is not 64 lowercase hex digits")
        pins.append(WheelPin(name, version, digest))
    return tuple(pins)


def pins_digest(pins: Iterable[WheelPin]) -> str:
    """A short name for one set of pins (the cache directory and the build directory follow it)."""
    blob = "\n".join(f"{p.name}=={p.version} {p.sha256}" for p in sorted(pins, key=lambda p: p.name))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def toolkit_version(pins: Iterable[WheelPin]) -> str:
    """The CUDA version a set of pins stands for: nvcc's."""
    for pin in pins:
        if pin.name == "nvidia-cuda-nvcc":
            return pin.version
    raise ValueError("no nvidia-cuda-nvcc pin")


def resolve_toolkit_choice(table: Mapping[str, object], env: Mapping[str, str]) -> str:
    """``SKIPPY_CUDA_TOOLKIT``, else ``[tool.skippy.build] cuda_toolkit``, else ``auto``."""
    return resolve_choice(
        table, env, key="cuda_toolkit", env_var=TOOLKIT_ENV, choices=TOOLKIT_CHOICES, what="CUDA toolkit"
    )


def wheels_supported(system: str, machine: str) -> bool:
    """The pinned wheels are Linux x86_64 builds."""
    return system == "Linux" and machine.lower() in ("x86_64", "amd64")


@dataclass(frozen=True)
class MergePlan:
    """The merged toolkit, relative to its root: hard links to wheel files, then symbolic links."""

    #: destination -> (wheel name, path under the wheel's nvidia/cu13)
    files: Mapping[str, tuple[str, str]]
    #: destination -> link text (relative)
    symlinks: Mapping[str, str]
    #: destinations more than one wheel provides: (destination, the wheels), first one kept
    overlaps: tuple[tuple[str, tuple[str, ...]], ...] = ()


_SONAME_RE = re.compile(r"^(lib[^/]+\.so)\.\d+$")


def plan_merge(wheel_files: Mapping[str, Iterable[str]]) -> MergePlan:
    """Where each wheel file goes in the merged toolkit (``wheel_files``: name -> paths under
    nvidia/cu13, in pin order; the first wheel providing a path wins)."""
    files: dict[str, tuple[str, str]] = {}
    providers: dict[str, list[str]] = {}
    for wheel, paths in wheel_files.items():
        for raw in paths:
            rel = PurePosixPath(raw)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                raise ValueError(f"{wheel}: unsafe path {raw!r}")
            dest = str(rel)
            providers.setdefault(dest, []).append(wheel)
            files.setdefault(dest, (wheel, dest))
    symlinks: dict[str, str] = {}
    for dest in sorted(files):
        parent, name = PurePosixPath(dest).parent, PurePosixPath(dest).name
        m = _SONAME_RE.match(name)
        if str(parent) == "lib" and m:
            plain = str(parent / m.group(1))
            if plain not in files and plain not in symlinks:
                symlinks[plain] = name
    symlinks["lib64"] = "lib"
    symlinks[str(TARGET_DIR / "include")] = "../../include"
    symlinks[str(TARGET_DIR / "lib")] = "../../lib"
    overlaps = tuple((dest, tuple(w)) for dest, w in sorted(providers.items()) if len(w) > 1)
    return MergePlan(files=files, symlinks=symlinks, overlaps=overlaps)


_DEFINE_RE = re.compile(r"^\s*#\s*define\s+(cu[A-Za-z0-9_]+)\s+(cu[A-Za-z0-9_]+)\s*$", re.MULTILINE)
_DECL_RE = re.compile(r"\bCUresult\s+CUDAAPI\s+(cu[A-Za-z0-9_]+)\s*\(")


def driver_entry_points(cuda_h: str) -> tuple[str, ...]:
    """The driver functions ``cuda.h`` declares, under the names callers link against.

    cuda.h renames most functions to a versioned symbol (``#define cuCtxCreate cuCtxCreate_v4``)
    before declaring them; the stub exports both the declared and the versioned names, so a
    program built against any API version links.
    """
    renames = {m.group(1): m.group(2) for m in _DEFINE_RE.finditer(cuda_h)}
    names: set[str] = set()
    for m in _DECL_RE.finditer(cuda_h):
        name = m.group(1)
        names.add(name)
        seen = {name}
        while name in renames and renames[name] not in seen:
            name = renames[name]
            seen.add(name)
            names.add(name)
    return tuple(sorted(names))


def stub_source(entry_points: Iterable[str]) -> str:
    """C source of the link-time driver stub: every entry point returns CUDA_ERROR_STUB_LIBRARY.

    The functions take no declared parameters: on the C ABIs CUDA supports, a callee that
    ignores its arguments returns an ``int`` the caller reads as CUresult.
    """
    lines = [
        "/* libcuda link-time stub, generated by skippy from the toolkit's cuda.h. */",
        "/* Every entry point returns CUDA_ERROR_STUB_LIBRARY: no driver is behind it. */",
        f"#define SKIPPY_STUB_RESULT {CUDA_ERROR_STUB_LIBRARY}",
        "",
    ]
    lines += [f"int {name}(void) {{ return SKIPPY_STUB_RESULT; }}" for name in entry_points]
    return "\n".join(lines) + "\n"


def stub_cc_argv(cc: str, source: Path, output: Path) -> list[str]:
    return [cc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{STUB_SONAME}", "-o", str(output), str(source)]


def pip_download_argv(python: str, requirements: Path, into: Path, *, attempts: int) -> list[str]:
    """``pip download`` of the pinned wheels (hash-checking mode: pip refuses a mismatch)."""
    # the wheels are kept in our cache: no second copy in pip's
    options = ("--only-binary", ":all:", "--require-hashes", "--no-cache-dir")
    return pip.pip_download_argv(python, into, attempts=attempts, options=options, what=("-r", str(requirements)))


def requirements_text(pins: Iterable[WheelPin]) -> str:
    return "".join(f"{p.requirement} --hash=sha256:{p.sha256}\n" for p in pins)


# --- assembling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelToolkit:
    """A finished toolkit from wheels."""

    root: Path
    version: str
    digest: str
    #: seconds the download and the assembly took (0 when reused)
    download_seconds: float = 0.0
    assembly_seconds: float = 0.0
    downloaded_bytes: int = 0
    reused: bool = False

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def label(self) -> str:
        return f"wheels {self.version} (pins {self.digest})"


@dataclass(frozen=True)
class AssemblyContext:
    cache_dir: Path
    env: Mapping[str, str] = field(repr=False)
    #: the C compiler for the driver stub
    cc: str = "cc"
    python: str = sys.executable
    attempts: int = 3
    lock_timeout: float = 3600.0
    log: Callable[[str], None] = field(default=lambda _line: None, repr=False)


def toolkit_home(cache_dir: Path, pins: Iterable[WheelPin]) -> Path:
    pins = tuple(pins)
    return cache_dir / "cuda" / f"{toolkit_version(pins)}-{pins_digest(pins)}"


def wheels_home(cache_dir: Path) -> Path:
    """Where the downloaded wheels are kept (each checked against its pin before use): outside
    the toolkit's folder, so an interrupted assembly never downloads them again."""
    return cache_dir / "cuda" / "wheels"


def _record(pins: Iterable[WheelPin]) -> dict[str, object]:
    return {"wheels": {p.name: [p.version, p.sha256] for p in pins}}


def assemble(pins: tuple[WheelPin, ...], ctx: AssemblyContext) -> WheelToolkit:
    """The toolkit for ``pins`` under the cache: reused when finished, else made
    (:func:`skippy.compile.fetched.fetch_once`)."""
    version, digest = toolkit_version(pins), pins_digest(pins)
    stats: dict[str, float] = {}

    def done(home: Path, record: Mapping[str, object]) -> WheelToolkit | None:
        ready = record == _record(pins) and (home / "toolkit" / "bin" / "nvcc").is_file()
        return WheelToolkit(home / "toolkit", version, digest, reused=True) if ready else None

    def make(folder: Path) -> Mapping[str, object]:
        stats.update(_assemble_into(folder, pins, ctx))
        return _record(pins)

    kit, made = fetch_once(
        toolkit_home(ctx.cache_dir, pins),
        done=done,
        make=make,
        what="assembling the CUDA toolkit",
        timeout=ctx.lock_timeout,
    )
    if not made:
        return kit
    return replace(
        kit,
        reused=False,
        download_seconds=stats["download_seconds"],
        assembly_seconds=stats["assembly_seconds"],
        downloaded_bytes=int(stats["downloaded_bytes"]),
    )


def _assemble_into(folder: Path, pins: tuple[WheelPin, ...], ctx: AssemblyContext) -> dict[str, float]:
    """Download (what the wheel folder lacks), unpack, merge and add the driver stub in ``folder``."""
    started = time.monotonic()
    wheels, nbytes = _download(pins, wheels_home(ctx.cache_dir), ctx)
    downloaded = time.monotonic() - started
    started = time.monotonic()
    wheel_files: dict[str, list[str]] = {}
    for pin in pins:
        wheel_files[pin.name] = _unpack(wheels[pin.name], folder / "unpacked" / pin.name)
    plan = plan_merge(wheel_files)
    root = folder / "toolkit"
    _merge(plan, folder / "unpacked", root)
    _make_stub(root, folder / "stub", ctx)
    took = time.monotonic() - started
    ctx.log(f"assembled the CUDA {toolkit_version(pins)} toolkit from wheels in {took:.1f} s")
    return {"download_seconds": downloaded, "assembly_seconds": took, "downloaded_bytes": float(nbytes)}


def _wheel_of(pin: WheelPin, directory: Path) -> Path | None:
    stem = pin.name.replace("-", "_") + "-" + pin.version + "-"
    found = sorted(p for p in directory.glob("*.whl") if p.name.startswith(stem))
    return found[0] if found else None


def _download(pins: tuple[WheelPin, ...], into: Path, ctx: AssemblyContext) -> tuple[dict[str, Path], int]:
    """The verified wheel of every pin in ``into``; only the missing or corrupt ones are fetched."""
    into.mkdir(parents=True, exist_ok=True)
    have: dict[str, Path] = {}
    for pin in pins:
        wheel = _wheel_of(pin, into)
        if wheel is not None and sha256_of(wheel) == pin.sha256:
            have[pin.name] = wheel
        elif wheel is not None:
            wheel.unlink()
    todo = [p for p in pins if p.name not in have]
    nbytes = 0
    if todo:
        requirements = into / f"requirements-{os.getpid()}.txt"
        requirements.write_text(requirements_text(todo), encoding="utf-8")
        ctx.log(f"downloading {len(todo)} CUDA wheels: {', '.join(p.requirement for p in todo)}")
        started = time.monotonic()
        try:
            proc.run(
                pip_download_argv(ctx.python, requirements, into, attempts=ctx.attempts),
                env=ctx.env,
                timeout=PIP_TIMEOUT,
                what="pip download (CUDA toolkit wheels)",
            )
        except CommandError as exc:
            requirements.unlink(missing_ok=True)
            raise NetworkError(
                "could not download the CUDA toolkit wheels",
                untouched="the wheels already in the cache; nothing was built",
                next_step="check the package index is reachable and the pins in [tool.skippy.build.cuda_wheels] "
                "exist for this platform, then run the build again",
                details=exc.details,
            ) from exc
        requirements.unlink(missing_ok=True)
        for pin in todo:
            wheel = _wheel_of(pin, into)
            if wheel is None or sha256_of(wheel) != pin.sha256:
                raise NetworkError(
                    f"the downloaded {pin.requirement} wheel is missing or does not match its sha256",
                    untouched="the other wheels in the cache; nothing was built",
                    next_step="check the pin in [tool.skippy.build.cuda_wheels] and run the build again",
                )
            nbytes += wheel.stat().st_size
            have[pin.name] = wheel
        mib = nbytes / (1 << 20)
        ctx.log(f"downloaded {mib:.0f} MiB of CUDA wheels in {time.monotonic() - started:.1f} s")
    return have, nbytes


def _unpack(wheel: Path, into: Path) -> list[str]:
    """Unpack the ``nvidia/cu13`` part of ``wheel`` into ``into`` (modes kept); the paths below it."""
    partial = into.with_name(into.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    out: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = PurePosixPath(info.filename)
            if info.is_dir() or name.parts[: len(WHEEL_PREFIX.parts)] != WHEEL_PREFIX.parts:
                continue
            rel = PurePosixPath(*name.parts[len(WHEEL_PREFIX.parts) :])
            if not rel.parts or rel.is_absolute() or ".." in rel.parts:
                raise ToolchainMissing(
                    f"{wheel.name} holds an unsafe path {info.filename!r}",
                    untouched="everything: nothing was built",
                    next_step="check the pins in [tool.skippy.build.cuda_wheels]",
                )
            target = partial.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = (info.external_attr >> 16) & 0o777
            if stat.S_ISLNK(info.external_attr >> 16):
                target.symlink_to(zf.read(info).decode())
            else:
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                target.chmod(mode or 0o644)
            out.append(str(rel))
    partial.rename(into)
    return sorted(out)


def _link_or_copy(source: Path, dest: Path) -> None:
    if source.is_symlink():
        dest.symlink_to(source.readlink())
        return
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _merge(plan: MergePlan, unpacked: Path, root: Path) -> None:
    for dest, wheels in plan.overlaps:
        first = unpacked / wheels[0] / dest
        for other in wheels[1:]:
            if first.read_bytes() != (unpacked / other / dest).read_bytes():
                raise ToolchainMissing(
                    f"the CUDA wheels {wheels[0]} and {other} both ship {dest}, with different contents",
                    untouched="everything: nothing was built",
                    next_step="pin wheels of one CUDA release in [tool.skippy.build.cuda_wheels]",
                )
    root.mkdir(parents=True)
    for dest, (wheel, rel) in sorted(plan.files.items()):
        target = root / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(unpacked / wheel / rel, target)
    for dest, text in sorted(plan.symlinks.items()):
        target = root / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(text)


def _make_stub(root: Path, work: Path, ctx: AssemblyContext) -> None:
    """``lib/stubs/libcuda.so``, unless the toolkit already has a libcuda."""
    lib = root / "lib"
    if any(lib.glob("libcuda.so*")) or any((lib / "stubs").glob("libcuda.so*")):
        return
    header = root / "include" / "cuda.h"
    if not header.is_file():
        raise ToolchainMissing(
            "the assembled CUDA toolkit has no include/cuda.h to make the driver stub from",
            untouched="everything: nothing was built",
            next_step="check that nvidia-cuda-runtime is pinned in [tool.skippy.build.cuda_wheels]",
        )
    names = driver_entry_points(header.read_text(encoding="utf-8", errors="replace"))
    work.mkdir(parents=True, exist_ok=True)
    source = work / "libcuda_stub.c"
    source.write_text(stub_source(names), encoding="utf-8")
    (lib / "stubs").mkdir(parents=True, exist_ok=True)
    output = lib / "stubs" / "libcuda.so"
    try:
        proc.run(stub_cc_argv(ctx.cc, source, output), env=ctx.env, timeout=300, what="cc (libcuda stub)")
    except CommandError as exc:
        with contextlib.suppress(OSError):
            output.unlink()
        raise ToolchainMissing(
            "could not compile the libcuda link-time stub",
            untouched="everything: nothing was built",
            next_step="check the C compiler (CC, else cc) works, then run the build again",
            details=exc.details,
        ) from exc
    ctx.log(f"generated the libcuda link-time stub ({len(names)} driver entry points)")


__all__ = [
    "REQUIRED_WHEELS",
    "TOOLKIT_CHOICES",
    "AssemblyContext",
    "MergePlan",
    "WheelPin",
    "WheelToolkit",
    "assemble",
    "driver_entry_points",
    "parse_wheel_pins",
    "plan_merge",
    "resolve_toolkit_choice",
    "stub_source",
]
