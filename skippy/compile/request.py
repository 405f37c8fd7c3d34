"""What one build is asked to be: the backend (its registry entry), the -D values, the jobs, the targets.

A :class:`BuildRequest` is made once per command (:func:`build_request`: the command line's
``-D`` values, already parsed into names and values by the option table, over the ones
``[tool.skippy.build]`` and the environment ask for) and planned by
:func:`skippy.compile.plan.plan_build`; the toolchain probe is given the same values.  A
build of other targets or with another define (upstream's tests) is another request,
planned again: a plan is never edited after it is made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

from skippy.compile.backends import registry, spec
from skippy.compile.backends.base import Backend, BackendSpec
from skippy.core.settings import Settings

#: one CMake define as the command line writes it: ``-DNAME=VALUE`` or ``-DNAME:TYPE=VALUE``
DEFINE_ARG: Final = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_.+-]*)(?::[A-Za-z]+)?=(.*)$", re.DOTALL)

#: [tool.skippy.build] keys of every build, besides those each backend reads
COMMON_TABLE_KEYS: Final = frozenset({"native", "jobs", "compiler_cache", "cache_storage", "dist"})


def build_table_keys() -> frozenset[str]:
    """Every key [tool.skippy.build] may hold: the common ones and each registered backend's."""
    return COMMON_TABLE_KEYS.union(*(b.table_keys for b in registry().values()))


def build_table(settings: Settings) -> Mapping[str, Any]:
    """``[tool.skippy.build]``, its keys checked."""
    return settings.subtable("build", build_table_keys(), example="jobs = 2")


@dataclass(frozen=True)
class BuildRequest:
    """One build as asked: what :func:`skippy.compile.plan.plan_build` plans."""

    #: the backend's registry entry (the name resolved once)
    spec: BackendSpec
    #: the -D values asked for, by name: the command line's over [tool.skippy.build]'s and the
    #: environment's (read by the backend they concern); they win over everything the plan decides
    defines: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    jobs: int | None = None
    #: the targets to build (None: the backend's own, the RPC server as the tree names it)
    targets: tuple[str, ...] | None = None

    @property
    def backend(self) -> Backend:
        return self.spec.name

    def with_define(self, name: str, value: str) -> BuildRequest:
        """The same build with ``name`` set to ``value`` (over the value asked for, if any)."""
        return replace(self, defines=MappingProxyType({**self.defines, name: value}))

    def with_targets(self, targets: Sequence[str]) -> BuildRequest:
        """The same build of ``targets`` instead."""
        return replace(self, targets=tuple(targets))


def build_request(
    backend: str,
    settings: Settings,
    *,
    defines: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    jobs: int | None = None,
    targets: Sequence[str] | None = None,
) -> BuildRequest:
    """The request of a build of ``backend``: ``defines`` (the command line's, as (name, value)
    pairs or a mapping; a name given twice keeps its last value) over what ``[tool.skippy.build]``
    and the environment ask that backend for."""
    s = spec(backend)
    asked = s.requested(build_table(settings), settings.env)
    asked.update(dict(defines))
    return BuildRequest(
        spec=s,
        defines=MappingProxyType(asked),
        jobs=jobs,
        targets=tuple(targets) if targets is not None else None,
    )
