"""Every setting, declared once, as data: its key, the variable that overrides it, its type,
its range or choices, its default and what it does.

:class:`~skippy.core.settings.Settings` checks ``[tool.skippy]`` and its ``build`` and
``spot_check`` tables against these declarations when it is loaded (before any work), and
the modules that own a table read its values through :func:`value` (checked the same way),
so a value of the wrong type or out of range is refused with its key, the variable it came
from, the value and the form expected, instead of being ignored, coerced or crashing later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from skippy.core.errors import SettingsError

Kind = Literal["str", "path", "optional_path", "int", "float", "bool", "str_list"]

#: what the environment may say for a boolean (TOML has real booleans)
ENV_TRUE: Final = frozenset({"1", "true", "yes"})
ENV_FALSE: Final = frozenset({"0", "false", "no"})


@dataclass(frozen=True)
class Spec:
    """One setting of a ``[tool.skippy...]`` table."""

    key: str
    kind: Kind
    default: Any
    doc: str
    #: the environment variable that overrides the table's value (an empty value does not)
    env: str | None = None
    #: the range of a number (inclusive); ``None``: unbounded on that side
    low: float | None = None
    high: float | None = None
    #: the values a string may take (compared in lower case)
    choices: tuple[str, ...] = ()

    def expected(self) -> str:
        """The form a value must have, for messages."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        noun = {
            "str": "a non-empty string",
            "path": "a non-empty path string",
            "optional_path": 'a path string, or "" for none',
            "int": "a whole number",
            "float": "a finite number",
            "bool": "true or false",
            "str_list": 'a list of strings, e.g. ["build/", "*.gguf"]',
        }[self.kind]
        if self.kind == "bool":
            return noun + (" (from the environment: 1/0, true/false, yes/no)" if self.env else "")
        if self.low is not None and self.high is not None:
            return f"{noun} from {_num(self.low)} to {_num(self.high)}"
        if self.low is not None:
            return f"{noun} of at least {_num(self.low)}"
        return noun

    def example(self) -> str:
        """A valid TOML line for the key (its default where it has one)."""
        value = self.default
        if value is None:
            value = self.low if self.low is not None else ""
            value = int(value) if self.kind == "int" else value
        if isinstance(value, bool):
            return f"{self.key} = {'true' if value else 'false'}"
        if isinstance(value, str):
            return f'{self.key} = "{value}"'
        if isinstance(value, (list, tuple)):
            return f"{self.key} = [" + ", ".join(f'"{v}"' for v in value) + "]"
        return f"{self.key} = {value!r}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _bad(spec: Spec, table: str, value: object, env_value: str | None) -> SettingsError:
    if env_value is not None:
        assert spec.env is not None
        return SettingsError(
            f"{spec.env}={env_value!r} (it sets {table} {spec.key}): expected {spec.expected()}",
            untouched="everything: nothing was read or written",
            next_step=f"unset {spec.env} (or set it to a valid value), then re-run",
        )
    return SettingsError(
        f"pyproject.toml {table} {spec.key} = {value!r}: expected {spec.expected()}",
        untouched="everything: nothing was read or written",
        next_step=f"write {spec.example()} under {table} in pyproject.toml (or remove the key for the default)",
    )


def _number(spec: Spec, value: object, *, from_env: bool) -> float | int | None:
    """``value`` as the spec's number, or None when it is not one (a bool is not a number, and
    only the environment's values are text)."""
    if isinstance(value, bool) or isinstance(value, str) != from_env:
        return None
    if isinstance(value, str):
        try:
            value = int(value.strip()) if spec.kind == "int" else float(value.strip())
        except ValueError:
            return None
    if spec.kind == "int":
        return value if isinstance(value, int) else None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _checked_number(spec: Spec, value: object, table: str, env_value: str | None) -> float | int:
    number = _number(spec, env_value if env_value is not None else value, from_env=env_value is not None)
    if number is None or (spec.low is not None and number < spec.low) or (spec.high is not None and number > spec.high):
        raise _bad(spec, table, value, env_value)
    return number


def _checked_bool(spec: Spec, value: object, table: str, env_value: str | None) -> bool:
    if env_value is None and isinstance(value, bool):
        return value
    if env_value is not None and env_value.strip().lower() in ENV_TRUE | ENV_FALSE:
        return env_value.strip().lower() in ENV_TRUE
    raise _bad(spec, table, value, env_value)


def _checked_text(spec: Spec, value: object, table: str, env_value: str | None) -> str:
    raw = env_value if env_value is not None else value
    if spec.kind == "optional_path" and raw is False:
        return ""
    if not isinstance(raw, str) or (not raw.strip() and spec.default not in ("", None)):
        raise _bad(spec, table, value, env_value)
    if spec.choices:
        if raw.strip().lower() not in spec.choices:
            raise _bad(spec, table, value, env_value)
        return raw.strip().lower()
    return raw


def check(spec: Spec, value: object, *, table: str, env_value: str | None = None) -> Any:
    """``value`` (from ``table``, or the environment's ``env_value``) checked and converted;
    a SettingsError naming the key, the variable, the value and the expected form otherwise."""
    if spec.kind in ("int", "float"):
        return _checked_number(spec, value, table, env_value)
    if spec.kind == "bool":
        return _checked_bool(spec, value, table, env_value)
    if spec.kind == "str_list":
        raw = env_value if env_value is not None else value
        if not isinstance(raw, list) or not all(isinstance(item, str) and item for item in raw):
            raise _bad(spec, table, value, env_value)
        return tuple(raw)
    return _checked_text(spec, value, table, env_value)


def value(specs: Sequence[Spec], key: str, table: Mapping[str, Any], env: Mapping[str, str], *, where: str) -> Any:
    """The checked value of ``key``: its variable when set (non-empty), else the table's, else the default."""
    spec = next(s for s in specs if s.key == key)
    env_value = env.get(spec.env) if spec.env else None
    if env_value:
        return check(spec, table.get(key), table=where, env_value=env_value)
    if key in table:
        return check(spec, table[key], table=where)
    return spec.default


def check_table(
    specs: Sequence[Spec], table: Mapping[str, Any], env: Mapping[str, str], *, where: str
) -> dict[str, Any]:
    """Every declared key of ``table`` (and its variable) checked: {key: value}."""
    return {spec.key: value(specs, spec.key, table, env, where=where) for spec in specs}


#: ``[tool.skippy]``
TOP: Final[tuple[Spec, ...]] = (
    Spec(
        "upstream_url",
        "str",
        "https://github.com/ggml-org/llama.cpp.git",
        "where llama.cpp is fetched from",
        env="LLAMA_UPSTREAM_URL",
    ),
    Spec(
        "pin_file",
        "path",
        "skippy/llama_cpp/upstream.txt",
        "the file holding the pinned upstream commit",
        env="LLAMA_PIN_FILE",
    ),
    Spec("patch_dir", "path", "skippy/llama_cpp/patches", "the patch queue", env="LLAMA_PATCH_DIR"),
    Spec("workdir", "path", ".deps/llama.cpp", "the patched llama.cpp checkout skippy manages", env="LLAMA_WORKDIR"),
    Spec("compat_link", "optional_path", "llama.cpp", "a link to the workdir (false: none)"),
    Spec("build_root", "path", ".deps/llama-build", "where build dirs are made"),
    Spec("cache_dir", "path", ".deps/cache", "downloads, archives, models, locks"),
    Spec("upstream_branch", "str", "master", "the upstream branch --latest follows"),
    Spec("network_attempts", "int", 3, "tries of each clone or fetch", low=1, high=100),
    Spec("network_backoff", "float", 2.0, "seconds before the first retry (doubled each time)", low=0, high=3600),
    Spec("lock_timeout", "float", 900.0, "seconds to wait for another run's lock", low=0, high=86400),
    Spec(
        "tolerated_untracked",
        "str_list",
        ("build/", "build-*/", "*.gguf"),
        "untracked paths in the workdir that are not local work (git pathspec globs)",
    ),
    Spec("pin_mirror", "optional_path", "", "a second file pin-bump writes the pin to"),
)

#: ``[tool.skippy.build]``: the keys of every build (each backend checks its own keys)
BUILD: Final[tuple[Spec, ...]] = (
    Spec("native", "bool", False, "let ggml use -march=native (never on CI)", env="SKIPPY_NATIVE"),
    Spec("jobs", "int", None, "parallel build jobs (default: Ninja's)", env="SKIPPY_BUILD_JOBS", low=1, high=1024),
    Spec(
        "compiler_cache",
        "str",
        "auto",
        "the compiler cache",
        env="SKIPPY_COMPILER_CACHE",
        choices=("auto", "sccache", "ccache", "none"),
    ),
    Spec("cache_storage", "str", "", "the compiler cache's storage (local, or a URL)", env="SKIPPY_CACHE_STORAGE"),
    Spec(
        "dist",
        "str",
        "",
        "an sccache-dist scheduler to send compiles to (its token: SKIPPY_DIST_TOKEN)",
        env="SKIPPY_DIST",
    ),
)

#: ``[tool.skippy.spot_check]`` (:class:`skippy.spot.report.Options` has the same defaults)
SPOT_CHECK: Final[tuple[Spec, ...]] = (
    Spec("load_timeout", "float", 300.0, "seconds for llama-server to load a model", low=1, high=86400),
    Spec("request_timeout", "float", 120.0, "seconds for one completion", low=1, high=86400),
    Spec("grace", "float", 10.0, "seconds between SIGTERM and SIGKILL", low=0, high=600),
    Spec("ctx_size", "int", 1024, "the server's context size", low=64, high=1048576),
    Spec("max_tokens", "int", 5, "tokens generated per prompt", low=1, high=4096),
    Spec("poll_interval", "float", 0.1, "seconds between health polls", low=0.01, high=60),
    Spec("bind_attempts", "int", 3, "ports tried for the server", low=1, high=100),
    Spec(
        "logprob_tolerance",
        "float",
        0.15,
        "top-1 log-probability tolerance vs the CPU reference (nats)",
        low=0,
        high=10,
    ),
    Spec("rpc_logprob_tolerance", "float", 0.5, "the same over RPC", low=0, high=10),
    Spec("device_logprob_tolerance", "float", 0.3, "the same on a GPU backend's device", low=0, high=10),
    Spec(
        "arch_logprob_tolerance",
        "float",
        0.3,
        "the same for the CPU on another architecture than the reference's",
        low=0,
        high=10,
    ),
)

#: ``[tool.skippy.upstream_tests]``: upstream's own tests on the patched tree (``--upstream-tests``)
UPSTREAM_TESTS: Final[tuple[Spec, ...]] = (
    Spec(
        "attribution_budget",
        "float",
        1800.0,
        "seconds the bisection for a broken test may take before it reports how far it got",
        env="SKIPPY_ATTRIBUTION_BUDGET",
        low=0,
        high=86400,
    ),
    Spec(
        "ops_budget",
        "float",
        300.0,
        "seconds for a GPU backend's test-backend-ops subset (the ops it did not reach are named)",
        env="SKIPPY_OPS_BUDGET",
        low=1,
        high=86400,
    ),
)

#: the sub-tables checked here, by name
SUBTABLES: Final[Mapping[str, tuple[Spec, ...]]] = {
    "build": BUILD,
    "spot_check": SPOT_CHECK,
    "upstream_tests": UPSTREAM_TESTS,
}
