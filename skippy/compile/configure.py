"""Whether a build dir must be configured (pure), and what CMake's output and cache say."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippy.compile.plan import GENERATOR, BuildPlan

_TRUE = frozenset({"ON", "TRUE", "YES", "Y", "1"})
_FALSE = frozenset({"OFF", "FALSE", "NO", "N", "0", ""})


@dataclass(frozen=True)
class ConfigureDecision:
    needed: bool
    #: remove CMakeCache.txt and CMakeFiles/ first
    wipe: bool
    reason: str


def parse_cmake_cache(text: str) -> dict[str, str]:
    """``NAME:TYPE=VALUE`` lines of CMakeCache.txt -> {NAME: VALUE}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith(("#", "//")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.partition(":")[0]] = value
    return out


def parse_cmake_cache_types(text: str) -> dict[str, str]:
    """``NAME:TYPE=VALUE`` lines of CMakeCache.txt -> {NAME: TYPE}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith(("#", "//")):
            continue
        key, sep, _ = line.partition("=")
        if sep and ":" in key:
            name, _, kind = key.partition(":")
            out[name] = kind
    return out


def unknown_given(given: Iterable[str], types: Mapping[str, str], mentioned: Callable[[str], bool]) -> list[str]:
    """The user's -D names the project never declared: CMake left them ``UNINITIALIZED`` in its
    cache (no ``option()`` or ``set(... CACHE ...)`` took them) and no CMake file of the tree
    names them.  CMake's own unused-variable check misses these when the project reads every
    variable of a prefix (ggml reads all ``GGML_*``).  ``CMAKE_*`` names are CMake's own."""
    return [
        name
        for name in given
        if not name.startswith("CMAKE_") and types.get(name, "UNINITIALIZED") == "UNINITIALIZED" and not mentioned(name)
    ]


def known_cache_names(types: Mapping[str, str]) -> list[str]:
    """The cache variables the project (or CMake) declared: what a typo is compared with."""
    return sorted(name for name, kind in types.items() if kind not in ("UNINITIALIZED", "INTERNAL", "STATIC"))


#: the source whose compile line carries every enabled backend's ``GGML_USE_<NAME>``
BACKEND_REGISTRY_SOURCE: Final = "ggml/src/ggml-backend-reg.cpp"
_USE_DEFINE: Final = re.compile(r"-DGGML_USE_([A-Z0-9_]+)\b")


def backend_uses(commands: Iterable[Mapping[str, Any]], source_dir: Path) -> dict[str, frozenset[str]]:
    """{source path relative to the tree: the ``GGML_USE_*`` names on its compile line} from the
    entries of ``compile_commands.json`` (sources outside the tree are left out)."""
    out: dict[str, frozenset[str]] = {}
    for entry in commands:
        file = Path(str(entry.get("file", "")))
        try:
            rel = file.relative_to(source_dir).as_posix()
        except ValueError:
            continue
        command = entry.get("command")
        text = command if isinstance(command, str) else " ".join(str(a) for a in entry.get("arguments", ()))
        out[rel] = frozenset(_USE_DEFINE.findall(text))
    return out


def unreached_readers(uses: Mapping[str, frozenset[str]], read: Callable[[str], str]) -> dict[str, list[str]]:
    """{source outside ggml/: the enabled backends' ``GGML_USE_<NAME>`` it reads but its compile
    line lacks}.  The enabled names are those on ggml's backend registry's line; a source of
    llama, common, the tools or the tests that tests one of them must get it too (queue patch
    0005 gives it only to the targets that link ``ggml-backend-use``), or its ``#ifdef`` would
    silently take the other branch."""
    enabled = uses.get(BACKEND_REGISTRY_SOURCE)
    if not enabled:
        return {}
    gaps: dict[str, list[str]] = {}
    for rel, names in sorted(uses.items()):
        if rel.startswith("ggml/"):
            continue
        lacking = enabled - names
        if not lacking:
            continue
        text = read(rel)
        missing = sorted(n for n in lacking if re.search(rf"\bGGML_USE_{n}\b", text))
        if missing:
            gaps[rel] = [f"GGML_USE_{n}" for n in missing]
    return gaps


def _cache_problem(
    plan: BuildPlan, cache: Mapping[str, str], has_build_ninja: bool, exists: Callable[[str], bool]
) -> str | None:
    """Why an existing CMake cache cannot be reused as it is (None when it can)."""
    generator = cache.get("CMAKE_GENERATOR", "")
    if generator != GENERATOR:
        return f"generator mismatch: the cache says {generator!r}"
    home = cache.get("CMAKE_HOME_DIRECTORY")
    if home and Path(home) != plan.source_dir:
        return f"the cache was made for another source tree ({home})"
    for key, label in (("CMAKE_COMMAND", "cmake"), ("CMAKE_MAKE_PROGRAM", "ninja")):
        tool = cache.get(key)
        if tool and not exists(tool):
            return f"the {label} this dir was configured with is gone ({tool})"
    if not has_build_ninja:
        return "the last configure did not finish (no build.ninja)"
    return None


_STAMP_LABELS: Final = {
    "patched_sha": "the patched tree changed",
    "configure_args": "the configure arguments changed",
    "tools": "the tools changed",
}


def _stamp_change(stamp: Mapping[str, Any] | None, planned: Mapping[str, Any]) -> str | None:
    if stamp is None:
        return "no stamp (configured outside skippy)"
    changed = [key for key in sorted(set(stamp) | set(planned)) if stamp.get(key) != planned.get(key)]
    return "; ".join(_STAMP_LABELS.get(k, f"{k} changed") for k in changed) or None


def decide_configure(
    plan: BuildPlan,
    *,
    stamp: Mapping[str, Any] | None,
    cache: Mapping[str, str] | None,
    has_build_ninja: bool,
    exists: Callable[[str], bool],
) -> ConfigureDecision:
    if cache is None:
        return ConfigureDecision(True, False, "new build directory")
    why = _cache_problem(plan, cache, has_build_ninja, exists) or _stamp_change(stamp, plan.stamp)
    if why:
        return ConfigureDecision(True, True, why)
    return ConfigureDecision(False, False, "up to date")


def parse_unused_variables(output: str) -> list[str]:
    """Names under CMake's "Manually-specified variables were not used by the project:"."""
    names: list[str] = []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "Manually-specified variables were not used by the project" not in line:
            continue
        started = False
        for follow in lines[i + 1 :]:
            token = follow.strip()
            if not token:
                if started:
                    break
                continue
            if not follow.startswith((" ", "\t")) or " " in token:
                break
            started = True
            names.append(token)
    return names


def cmake_on(value: str) -> bool:
    """Whether a CMake cache value is true (``ON``, ``TRUE``, ``YES``, ``Y``, ``1``)."""
    return value.strip().upper() in _TRUE


def _normalize(value: str) -> str:
    upper = value.strip().upper()
    if upper in _TRUE:
        return "ON"
    if upper in _FALSE:
        return "OFF"
    return value.strip()


def cache_mismatches(expectations: Mapping[str, str], cache: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{name: (wanted, in force)} for every expectation CMakeCache.txt does not hold."""
    out: dict[str, tuple[str, str]] = {}
    for name, wanted in expectations.items():
        actual = cache.get(name)
        if actual is None or _normalize(actual) != _normalize(wanted):
            out[name] = (wanted, "<unset>" if actual is None else actual)
    return out


_DEFINE_ARG = re.compile(r"^-D([^:=]+)(?::[^=]*)?=(.*)$")


def missing_path_define(plan: BuildPlan, output: str) -> tuple[str, str] | None:
    """The ``(name, value)`` of a ``-D`` argument of the configure command whose value is a path
    that does not exist and that CMake's ``output`` names: the cause of a failed configure that
    is the setting's, not the tree's.  None when no such argument is to blame."""
    for arg in plan.configure_argv:
        match = _DEFINE_ARG.match(arg)
        if match is None:
            continue
        name, value = match.group(1), match.group(2).strip()
        if "/" not in value or value not in output:
            continue
        candidates = (
            [plan.host_path(value)] if value.startswith("/") else [plan.build_dir / value, plan.source_dir / value]
        )
        if not any(c.exists() for c in candidates):
            return name, value
    return None
