"""The e2e tier's skip-or-fail rule: skip locally, fail on CI, never green without running."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.core.settings import Settings
from tests.e2e.needs import cannot_run, on_ci

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_on_ci_it_fails(value: str) -> None:
    with pytest.raises(pytest.fail.Exception) as info:
        cannot_run("no network for the sdists", env={"CI": value})
    assert str(info.value) == f"cannot run on CI (CI={value}), and CI must not skip: no network for the sdists"


@pytest.mark.parametrize("env", [{}, {"CI": ""}, {"CI": "false"}, {"CI": "0"}])
def test_elsewhere_it_skips(env: dict[str, str]) -> None:
    with pytest.raises(pytest.skip.Exception) as info:
        cannot_run("no network for the sdists", env=env)
    assert str(info.value) == "no network for the sdists"


def test_ci_is_read_as_settings_read_it(tmp_path: Path) -> None:
    for value in ("true", "1", "yes", "false", "", "no"):
        settings = Settings.from_table(tmp_path, {}, {"CI": value})
        assert on_ci({"CI": value}) is settings.on_ci


def test_the_ci_variable_is_read_before_the_hermetic_seal_removes_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CI=true in pytest's own environment, an e2e-style test that cannot run fails, even
    though every test runs with CI removed from os.environ (tests/conftest.py)."""
    pytester.makepyfile(
        test_needs="""
            import os
            import pytest
            from tests.e2e.needs import cannot_run

            @pytest.fixture(autouse=True)
            def seal(monkeypatch):
                monkeypatch.delenv("CI", raising=False)

            def test_needs_the_network():
                assert "CI" not in os.environ
                cannot_run("no network")
        """
    )
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot run on CI (CI=true), and CI must not skip: no network*"])
    monkeypatch.setenv("CI", "false")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1)


def test_on_ci_any_skip_in_the_tier_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The conftest hook catches skips that did not go through cannot_run."""
    pytester.makeconftest("from tests.e2e.needs import pytest_runtest_makereport as pytest_runtest_makereport\n")
    pytester.makepyfile(
        test_tier="""
            import pytest

            @pytest.mark.skipif(True, reason="no GPU")
            def test_marked():
                pass

            def test_inline():
                pytest.skip("not cached")

            def test_runs():
                pass
        """
    )
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    # a skipif is decided during setup: that one is reported as an error, which fails the run too
    result.assert_outcomes(failed=1, errors=1, passed=1)
    result.stdout.fnmatch_lines(["*skipped on CI (CI=true), and CI must not skip: no GPU*"])
    result.stdout.fnmatch_lines(["*skipped on CI (CI=true), and CI must not skip: not cached"])
    monkeypatch.setenv("CI", "false")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(skipped=2, passed=1)


def test_every_tier_fails_a_skip_on_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook is the root conftest's (all tiers), not only the e2e tier's."""
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport as pytest_runtest_makereport\n")
    pytester.makepyfile(test_integration_tier="import pytest\n\ndef test_no_ccache():\n    pytest.skip('no ccache')\n")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*skipped on CI (CI=true), and CI must not skip: no ccache*"])
