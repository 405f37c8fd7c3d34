"""Settings precedence: defaults < [tool.skippy] < the maintainers' environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.core.errors import SettingsError
from skippy.core.settings import DEFAULT_UPSTREAM, Settings, find_root


def write_pyproject(root: Path, table: str) -> None:
    (root / "pyproject.toml").write_text("[project]\nname='x'\n\n[tool.skippy]\n" + table, encoding="utf-8")


def test_defaults(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "")
    s = Settings.load(tmp_path, env={})
    assert s.upstream_url == DEFAULT_UPSTREAM == "https://github.com/ggml-org/llama.cpp.git"
    assert s.workdir == tmp_path.resolve() / ".deps" / "llama.cpp"
    assert s.pin_file == tmp_path.resolve() / "skippy" / "llama_cpp" / "upstream.txt"
    assert s.patch_dir == tmp_path.resolve() / "skippy" / "llama_cpp" / "patches"
    assert s.compat_link == tmp_path.resolve() / "llama.cpp"
    assert not s.on_ci


def test_table_overrides_defaults_and_env_overrides_table(tmp_path: Path) -> None:
    write_pyproject(
        tmp_path,
        'upstream_url = "file:///mirror.git"\nworkdir = "w"\npin_file = "pin.txt"\npatch_dir = "q"\n'
        "compat_link = false\n",
    )
    s = Settings.load(tmp_path, env={})
    assert (s.upstream_url, s.workdir.name, s.pin_file.name, s.patch_dir.name) == (
        "file:///mirror.git",
        "w",
        "pin.txt",
        "q",
    )
    assert s.compat_link is None
    env = {
        "LLAMA_UPSTREAM_URL": "https://mirror.example.invalid/llama.cpp.git",
        "LLAMA_WORKDIR": "/abs/work",
        "LLAMA_PIN_FILE": "other/pin",
        "LLAMA_PATCH_DIR": "other/patches",
    }
    s = Settings.load(tmp_path, env=env)
    assert s.upstream_url == "https://mirror.example.invalid/llama.cpp.git"
    assert s.workdir == Path("/abs/work")
    assert s.pin_file == tmp_path.resolve() / "other" / "pin"
    assert s.patch_dir == tmp_path.resolve() / "other" / "patches"


def test_empty_env_values_do_not_override(tmp_path: Path) -> None:
    write_pyproject(tmp_path, 'workdir = "w"\n')
    assert Settings.load(tmp_path, env={"LLAMA_WORKDIR": ""}).workdir.name == "w"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    write_pyproject(tmp_path, 'work_dir = "typo"\n')
    with pytest.raises(SettingsError, match="unknown key"):
        Settings.load(tmp_path, env={})


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.skippy\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"pyproject\.toml: not valid TOML"):
        Settings.load(tmp_path, env={})


def test_ci_detection(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "")
    assert Settings.load(tmp_path, env={"CI": "true"}).on_ci
    assert Settings.load(tmp_path, env={"GITHUB_ACTIONS": "true"}).on_github


def test_find_root_walks_up(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert find_root(nested) == tmp_path.resolve()
    with pytest.raises(SettingsError):
        find_root(Path("/"))


def test_subtables_refuse_non_tables_and_unknown_keys(tmp_path: Path) -> None:
    from skippy.compile.request import build_table_keys
    from skippy.maintain.parity import ParityConfig
    from skippy.spot.report import Options

    write_pyproject(tmp_path, "[tool.skippy.build]\njobs = 2\n")
    assert Settings.load(tmp_path, env={}).subtable("build", build_table_keys(), example="jobs = 2") == {"jobs": 2}
    write_pyproject(tmp_path, "[tool.skippy.build]\njobs = 2\ncuda_arch = '86'\n")
    with pytest.raises(SettingsError, match=r"\[tool.skippy.build\]: unknown key\(s\) cuda_arch") as info:
        Settings.load(tmp_path, env={}).subtable("build", build_table_keys(), example="jobs = 2")
    assert "cuda_architectures" in (info.value.next_step or "")
    write_pyproject(tmp_path, 'parity = "src/*.cpp"\n')
    with pytest.raises(SettingsError, match=r"\[tool.skippy.parity\] must be a table, got str"):
        ParityConfig.from_settings(Settings.load(tmp_path, env={}))
    write_pyproject(tmp_path, "[tool.skippy.spot_check]\nload_timout = 60\n")
    with pytest.raises(SettingsError, match="unknown key\\(s\\) load_timout"):
        Options.from_settings(Settings.load(tmp_path, env={}))
