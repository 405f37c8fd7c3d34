"""The backend registry: the backend modules this package ships, plus any that an
installed distribution declares under the ``skippy.backends`` entry-point group
(``name = "package.module:BACKEND"``).

Adding a backend is one module (a :class:`~skippy.build.backends.base.BackendSpec`
instance named ``BACKEND``) and one line in ``_BUILTIN``.  ``plan_build``, the
toolchain probe, ``nox -s build-<name>`` and the workflows' build matrix all read
the registry; nothing else names a backend.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import metadata
from types import MappingProxyType
from typing import Final

from skippy.build.backends import cpu, cuda, metal, rocm, vulkan
from skippy.build.backends.base import Backend, BackendSpec

__all__ = ["ENTRY_POINT_GROUP", "names", "parse_backend", "registry", "spec", "switches"]

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


def switches(backend: str) -> dict[str, str]:
    """Every registered backend switch OFF but ``backend``'s own."""
    own = spec(backend).switch
    return {b.switch: ("ON" if b.switch == own else "OFF") for b in registry().values() if b.switch}
