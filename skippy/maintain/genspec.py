"""The generated lane's spec, ``generated/families.toml``: the families, each with its arch and files.

Validated whole: one error lists every problem (an unknown key, a name or arch of the wrong
shape, a family or arch declared twice, paths outside the tree), and names the old schema
when it meets it.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skippy.core.errors import QueueError
from skippy.core.redact import excerpt, name_excerpt, value_excerpt
from skippy.maintain import graphcode

SCHEMA = 2
SPEC_NAME = "families.toml"


_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


_ARCH = re.compile(r"^LLM_ARCH_[A-Z0-9_]+$")


_SPEC_KEYS = frozenset({"schema", "family"})


_FAMILY_KEYS = frozenset({"name", "arch", "paths"})


@dataclass(frozen=True)
class Family:
    name: str
    arch: str
    #: globs (tree-relative, POSIX) of the family's files; empty: its graph builder's file
    paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    path: Path
    data: bytes
    families: tuple[Family, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def parse_spec(path: Path, data: bytes) -> Spec:
    """Validate the spec; one QueueError listing every problem."""
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QueueError(
            f"{path}: not valid TOML ({exc})", untouched="everything", next_step=f"fix {path.name}"
        ) from exc
    problems: list[str] = []
    _spec_settings(table, problems)
    families = _spec_families(table, problems)
    if problems:
        raise QueueError(
            f"the generated-lane spec {path} is invalid",
            details="\n".join(problems),
            untouched="everything: the generated lane was not changed",
            next_step=f"fix {path.name}, then `invoke generate`",
        )
    return Spec(path, data, tuple(families))


def _spec_settings(table: Mapping[str, Any], problems: list[str]) -> None:
    """Check the spec's top-level keys and schema (problems appended)."""
    if "output_dir" in table:
        problems.append(
            "output_dir is gone: the generator edits each family's own graph code (drop the key, set schema = 2)"
        )
    unknown = sorted(set(table) - _SPEC_KEYS - {"output_dir"})
    if unknown:
        problems.append(
            f"unknown key(s) {', '.join(map(name_excerpt, unknown))} (known: {', '.join(sorted(_SPEC_KEYS))})"
        )
    schema = table.get("schema")
    if schema != SCHEMA:
        was = " (schema 1 was the registration-file generator)" if schema == 1 else ""
        problems.append(f"schema {value_excerpt(schema)} is not supported: write schema = {SCHEMA}{was}")


def _spec_families(table: Mapping[str, Any], problems: list[str]) -> list[Family]:
    """The spec's valid [[family]] entries, in order; a problem appended for each invalid one."""
    raw = table.get("family", [])
    if not isinstance(raw, list):
        problems.append("`family` must be an array of tables ([[family]])")
        raw = []
    families: list[Family] = []
    for index, item in enumerate(raw, start=1):
        family = _spec_family(index, item, families, problems)
        if family is not None:
            families.append(family)
    return families


def _spec_family(index: int, item: object, earlier: Sequence[Family], problems: list[str]) -> Family | None:
    """The spec's family ``index`` if it is valid and new (after the valid ``earlier`` ones); else None and
    its problem appended (an unknown key is a problem too, but does not make the entry unusable)."""
    if not isinstance(item, dict):
        problems.append(f"family {index}: not a table")
        return None
    extra = sorted(set(item) - _FAMILY_KEYS)
    if extra:
        problems.append(f"family {index}: unknown key(s) {', '.join(map(name_excerpt, extra))}")
    name, arch = item.get("name"), item.get("arch")
    problem = _identity_problem(index, name, arch, earlier)
    if problem is not None:
        problems.append(problem)
        return None
    assert isinstance(name, str) and isinstance(arch, str)
    paths = _spec_paths(name, item.get("paths", []), problems)
    if paths is None:
        return None
    return Family(name, arch, paths)


def _identity_problem(index: int, name: object, arch: object, earlier: Sequence[Family]) -> str | None:
    """What is wrong with a family's name and arch (None: nothing)."""
    if not isinstance(name, str) or not _NAME.match(name):
        return f"family {index}: name {value_excerpt(name)} must match [a-z0-9][a-z0-9_-]*"
    if not isinstance(arch, str) or not _ARCH.match(arch):
        return f"family {name}: arch {value_excerpt(arch)} must look like LLM_ARCH_GEMMA3"
    if arch in graphcode.NOT_MODEL_ARCHS:
        return f"family {name}: {arch} is not a model family (it has no graph builder)"
    if any(f.name == name for f in earlier):
        return f"family {name}: declared twice"
    if any(f.arch == arch for f in earlier):
        return f"family {name}: arch {arch} is already declared by another family"
    return None


def _spec_paths(name: str, raw: object, problems: list[str]) -> tuple[str, ...] | None:
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        problems.append(f"family {name}: paths must be a list of tree-relative globs, got {value_excerpt(raw)}")
        return None
    bad = [p for p in raw if p.startswith("/") or ".." in p.split("/") or "\\" in p or p.startswith(".git")]
    if bad:
        problems.append(f"family {name}: paths {', '.join(map(excerpt, bad))} must be relative paths inside the tree")
        return None
    return tuple(raw)
