"""Hostile settings (issue "Hostile input, round 3", items 1, 2, 7, 8): every setting is
checked by type and range when the settings are made, with the key, the variable, the
value and the expected form; a workdir skippy must never replace is refused there."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from skippy.compile.plan import _native, _table_jobs
from skippy.core import specs
from skippy.core.errors import SettingsError
from skippy.core.settings import Settings
from skippy.spot.report import Options


def load(tmp_path: Path, table: dict[str, Any] | None = None, **env: str) -> Settings:
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    return Settings.from_table(root, table or {}, {"HOME": str(tmp_path / "home"), **env})


def refused(tmp_path: Path, table: dict[str, Any] | None = None, **env: str) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        load(tmp_path, table, **env)
    assert info.value.exit_code == 2
    assert info.value.untouched == "everything: nothing was read or written" or "nothing was locked" in (
        info.value.untouched or ""
    )
    return info.value


# --- item 7: tolerated_untracked -----------------------------------------------------------


def test_a_string_for_tolerated_untracked_is_refused_not_split_per_character(tmp_path: Path) -> None:
    error = refused(tmp_path, {"tolerated_untracked": "*.gguf"})
    assert error.what == (
        "pyproject.toml [tool.skippy] tolerated_untracked = '*.gguf': expected a list of strings, "
        'e.g. ["build/", "*.gguf"]'
    )
    assert error.next_step == (
        'write tolerated_untracked = ["build/", "build-*/", "*.gguf"] under [tool.skippy] in pyproject.toml '
        "(or remove the key for the default)"
    )
    assert "tolerated_untracked = [1]" in refused(tmp_path, {"tolerated_untracked": [1]}).what
    assert load(tmp_path, {"tolerated_untracked": ["*.gguf"]}).tolerated_untracked == ("*.gguf",)


# --- item 8: numbers, booleans and choices, from the table and the environment ---------------


@pytest.mark.parametrize(
    ("table", "env", "message"),
    [
        (
            {"network_backoff": -5},
            {},
            "pyproject.toml [tool.skippy] network_backoff = -5: expected a finite number from 0 to 3600",
        ),
        (
            {"network_attempts": 0},
            {},
            "pyproject.toml [tool.skippy] network_attempts = 0: expected a whole number from 1 to 100",
        ),
        (
            {"lock_timeout": "soon"},
            {},
            "pyproject.toml [tool.skippy] lock_timeout = 'soon': expected a finite number from 0 to 86400",
        ),
        (
            {"build": {"jobs": "many"}},
            {},
            "pyproject.toml [tool.skippy.build] jobs = 'many': expected a whole number from 1 to 1024",
        ),
        (
            {"build": {"jobs": -3}},
            {},
            "pyproject.toml [tool.skippy.build] jobs = -3: expected a whole number from 1 to 1024",
        ),
        (
            {},
            {"SKIPPY_BUILD_JOBS": "abc"},
            "SKIPPY_BUILD_JOBS='abc' (it sets [tool.skippy.build] jobs): expected a whole number from 1 to 1024",
        ),
        (
            {"build": {"native": "yes please"}},
            {},
            "pyproject.toml [tool.skippy.build] native = 'yes please': expected true or false "
            "(from the environment: 1/0, true/false, yes/no)",
        ),
        (
            {},
            {"SKIPPY_NATIVE": "on please"},
            "SKIPPY_NATIVE='on please' (it sets [tool.skippy.build] native): expected true or false "
            "(from the environment: 1/0, true/false, yes/no)",
        ),
        (
            {"build": {"compiler_cache": "distcc"}},
            {},
            "pyproject.toml [tool.skippy.build] compiler_cache = 'distcc': expected one of auto, sccache, ccache, none",
        ),
        (
            {"spot_check": {"ctx_size": -1}},
            {},
            "pyproject.toml [tool.skippy.spot_check] ctx_size = -1: expected a whole number from 64 to 1048576",
        ),
        (
            {"spot_check": {"logprob_tolerance": "inf"}},
            {},
            "pyproject.toml [tool.skippy.spot_check] logprob_tolerance = 'inf': expected a finite number from 0 to 10",
        ),
        (
            {"spot_check": {"logprob_tolerance": float("inf")}},
            {},
            "pyproject.toml [tool.skippy.spot_check] logprob_tolerance = inf: expected a finite number from 0 to 10",
        ),
        (
            {"spot_check": {"max_tokens": 0}},
            {},
            "pyproject.toml [tool.skippy.spot_check] max_tokens = 0: expected a whole number from 1 to 4096",
        ),
        (
            {"spot_check": {"bind_attempts": True}},
            {},
            "pyproject.toml [tool.skippy.spot_check] bind_attempts = True: expected a whole number from 1 to 100",
        ),
        (
            {"upstream_url": ""},
            {},
            "pyproject.toml [tool.skippy] upstream_url = '': expected a non-empty string",
        ),
    ],
)
def test_a_value_of_the_wrong_type_or_out_of_range_is_refused_when_loading(
    tmp_path: Path, table: dict[str, Any], env: dict[str, str], message: str
) -> None:
    error = refused(tmp_path, table, **env)
    assert error.what == message
    if env:
        (var,) = env
        assert error.next_step == f"unset {var} (or set it to a valid value), then re-run"
    else:
        assert error.next_step is not None and "under [tool.skippy" in error.next_step


def test_booleans_from_the_environment_and_jobs_are_read_as_declared(tmp_path: Path) -> None:
    for word, expected in (("1", True), ("YES", True), ("true", True), ("0", False), ("no", False)):
        assert _native(load(tmp_path, SKIPPY_NATIVE=word)) is expected
    assert _native(load(tmp_path, {"build": {"native": True}})) is True
    assert _native(load(tmp_path)) is False
    assert _table_jobs(load(tmp_path, SKIPPY_BUILD_JOBS="2")) == 2
    assert _table_jobs(load(tmp_path, {"build": {"jobs": 3}})) == 3
    assert _table_jobs(load(tmp_path)) is None
    options = Options.from_settings(load(tmp_path, {"spot_check": {"ctx_size": 2048, "load_timeout": 60}}))
    assert (options.ctx_size, options.load_timeout) == (2048, 60.0)


def test_the_defaults_did_not_change(tmp_path: Path) -> None:
    s = load(tmp_path)
    root = tmp_path / "proj"
    assert (s.upstream_url, s.upstream_branch) == ("https://github.com/ggml-org/llama.cpp.git", "master")
    assert (s.network_attempts, s.network_backoff, s.lock_timeout) == (3, 2.0, 900.0)
    assert s.tolerated_untracked == ("build/", "build-*/", "*.gguf")
    assert (s.workdir, s.build_root, s.cache_dir) == (
        root / ".deps/llama.cpp",
        root / ".deps/llama-build",
        root / ".deps/cache",
    )
    assert s.compat_link == root / "llama.cpp" and s.pin_mirror is None
    # the spot check's declared defaults are its Options' defaults
    assert {spec.key: spec.default for spec in specs.SPOT_CHECK} == dataclasses.asdict(Options())
    assert {spec.key for spec in specs.BUILD} <= {"native", "jobs", "compiler_cache", "cache_storage", "dist"}


# --- items 1 and 2: a workdir skippy must never replace -------------------------------------


@pytest.mark.parametrize(
    ("workdir", "why"),
    [
        ("{root}", "it is the project root ({root})"),
        ("{root}/..", "it contains the project root ({root})"),
        ("/", "it is the file system root (/)"),
        ("{home}", "it is your home directory ($HOME) ({home})"),
        ("{root}/queue", "it contains the patch dir ({root}/queue/patches)"),
        ("{root}/queue/patches", "it is the patch dir ({root}/queue/patches)"),
        ("{root}/pin", "it contains the pin file ({root}/pin/upstream.txt)"),
    ],
)
def test_a_workdir_that_holds_what_skippy_must_keep_is_refused(tmp_path: Path, workdir: str, why: str) -> None:
    root = (tmp_path / "proj").resolve()
    home = (tmp_path / "home").resolve()
    home.mkdir()
    table = {"patch_dir": "queue/patches", "pin_file": "pin/upstream.txt"}
    value = workdir.format(root=root, home=home)
    error = refused(tmp_path, table, LLAMA_WORKDIR=value)
    reason = why.format(root=root, home=home)
    assert error.what == (
        f"LLAMA_WORKDIR={value}: refused as the workdir: {reason}, "
        "and skippy replaces the workdir's whole tree with llama.cpp"
    )
    assert error.untouched == "everything: nothing was locked, read or written"
    assert error.next_step == (
        f"unset LLAMA_WORKDIR, or give it a directory of its own: LLAMA_WORKDIR={root}/.deps/llama.cpp invoke status"
    )
    assert "--force" not in error.render()
    # the same from pyproject.toml
    error = refused(tmp_path, {**table, "workdir": value})
    assert error.what.startswith(f"[tool.skippy] workdir = {Path(value)}: refused as the workdir: {reason}")
    assert error.next_step == (
        f'set workdir = ".deps/llama.cpp" (a directory of its own) under [tool.skippy] in {root}/pyproject.toml'
    )


def test_a_workdir_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    error = refused(tmp_path, LLAMA_WORKDIR="/dev/null")
    assert error.what == "LLAMA_WORKDIR=/dev/null: refused as the workdir: it is a character device, not a directory"
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert "it is a regular file, not a directory" in refused(tmp_path, LLAMA_WORKDIR=str(tmp_path / "file")).what


def test_a_workdir_of_its_own_is_accepted(tmp_path: Path) -> None:
    assert load(tmp_path, LLAMA_WORKDIR=str(tmp_path / "elsewhere")).workdir == tmp_path / "elsewhere"
    assert load(tmp_path).workdir == tmp_path / "proj" / ".deps" / "llama.cpp"
