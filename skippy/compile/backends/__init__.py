"""The backend registry: the backend modules this package ships, plus any that an
installed distribution declares under the ``skippy.backends`` entry-point group
(``name = "package.module:BACKEND"``).

Adding a backend is one module (a :class:`~skippy.compile.backends.base.BackendSpec`
instance named ``BACKEND``) and one line in ``_BUILTIN`` (or an entry point of another
distribution).  ``plan_build``, the toolchain probe, ``nox -s build-<name>``, the build
workflow's matrix (:mod:`skippy.compile.backends.matrix`), the spot check's log patterns,
the upstream summary's areas and the tests all read the registry; nothing else names a
backend.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import metadata
from types import MappingProxyType
from typing import Final

from skippy.compile.backends import cpu, cuda, metal, rocm, vulkan
from skippy.compile.backends.base import BASE_LANGUAGES, Backend, BackendSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "failure_patterns",
    "languages",
    "names",
    "parse_backend",
    "reference_backend",
    "registry",
    "spec",
    "switches",
    "upstream_areas",
]

#: the backends this package ships, in the order menus list them
_BUILTIN: Final = (cpu.BACKEND, metal.BACKEND, cuda.BACKEND, vulkan.BACKEND, rocm.BACKEND)

#: entry-point group through which another distribution adds a backend
ENTRY_POINT_GROUP: Final = "skippy.backends"


@functools.cache
def registry() -> Mapping[Backend, BackendSpec]:
    """Every backend: the built-in ones, then the entry-point ones (a clash is an error)."""
    found: dict[Backend, BackendSpec] = {b.name: b for b in _BUILTIN}
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        backend = entry.load()
        if not isinstance(backend, BackendSpec):
            raise TypeError(f"entry point {entry.name} = {entry.value} is not a BackendSpec")
        if backend.name in found or backend.name != entry.name:
            raise ValueError(f"entry point {entry.name} = {entry.value}: backend name {backend.name!r} clashes")
        found[backend.name] = backend
    return MappingProxyType(found)


def names() -> tuple[Backend, ...]:
    return tuple(registry())


def parse_backend(name: str) -> Backend:
    """``" CUDA "`` -> ``"cuda"``; raises ValueError listing the known names."""
    key = name.strip().lower()
    if key not in registry():
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(registry())}")
    return key


def spec(backend: str) -> BackendSpec:
    return registry()[parse_backend(backend)]


def switches(backend: str, system: str = "") -> dict[str, str]:
    """``backend``'s own switch ON, and OFF the switches the tree turns on by default on
    ``system`` (``platform.system()``: Metal's on macOS; "" names no host: none of them); no
    other backend's switch is named."""
    own = spec(backend)
    out = {b.switch: "OFF" for b in registry().values() if b.switch and system in b.default_on_systems}
    if own.switch:
        out[own.switch] = "ON"
    return out


def languages() -> tuple[str, ...]:
    """Every language a registered backend compiles (what a compiler launcher can be set for)."""
    return tuple(dict.fromkeys([*BASE_LANGUAGES, *(lang for b in registry().values() for lang in b.languages)]))


def reference_backend() -> Backend:
    """The backend every other one is compared with (the default build, the fingerprint reference)."""
    found = [b.name for b in registry().values() if b.reference]
    if len(found) != 1:
        raise ValueError(f"exactly one registered backend must be the reference; found {found or 'none'}")
    return found[0]


def upstream_areas() -> dict[str, tuple[str, ...]]:
    """``{area: path patterns}`` of every backend that names its upstream files."""
    return {b.area: b.upstream_areas for b in registry().values() if b.upstream_areas}


def failure_patterns() -> tuple[tuple[str, str], ...]:
    """Every backend's known failure lines: (regex, what it means), in registry order."""
    return tuple(pattern for b in registry().values() for pattern in b.failure_patterns)
