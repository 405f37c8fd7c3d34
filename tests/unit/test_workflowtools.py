"""A program the workflow tests run that is missing here: outside CI the test skips naming the
command that installs it (`.ci/setup tools` for act and the linters, which `pip install -e
'.[test]'` does not install); on CI it fails, as every skip there does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import workflowtools
from tests.e2e import needs


@pytest.fixture
def nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workflowtools, "BIN", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(needs, "ENV_AT_START", {})


@pytest.mark.usefixtures("nothing_installed")
@pytest.mark.parametrize("name", ["act", "jactionlint", "shellcheck"])
def test_a_missing_setup_tool_skips_with_the_command_that_installs_it(name: str) -> None:
    with pytest.raises(pytest.skip.Exception) as info:
        workflowtools.tool(name)
    assert str(info.value.msg) == f"{name} is not installed here: `.ci/setup tools` installs it into .venv"


@pytest.mark.usefixtures("nothing_installed")
def test_a_missing_test_dependency_names_the_python_setup() -> None:
    with pytest.raises(pytest.skip.Exception) as info:
        workflowtools.tool("zizmor")
    assert "`.ci/setup python`" in str(info.value.msg)


@pytest.mark.usefixtures("nothing_installed")
def test_on_ci_a_missing_tool_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(needs, "ENV_AT_START", {"CI": "true"})
    with pytest.raises(pytest.fail.Exception) as info:
        workflowtools.tool("act")
    assert "CI must not skip" in str(info.value.msg) and "`.ci/setup tools`" in str(info.value.msg)


def test_an_installed_tool_is_found_in_the_venv_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = tmp_path / "act"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setattr(workflowtools, "BIN", tmp_path)
    assert workflowtools.tool("act") == str(program)
