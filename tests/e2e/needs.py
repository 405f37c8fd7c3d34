"""What an e2e test does when something it needs cannot be had (no network, say).

Locally it skips, saying what is missing.  On CI (``CI`` set to true, 1 or yes,
as :attr:`skippy.core.settings.Settings.on_ci` reads it) it fails: a CI run that
could not run its e2e tests must not go green.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping
from typing import Final, NoReturn

import pytest

#: the environment pytest started in, read before any test's hermetic seal removes CI
ENV_AT_START: Final[Mapping[str, str]] = dict(os.environ)


def on_ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(reason: str, *, env: Mapping[str, str] = ENV_AT_START) -> NoReturn:
    """Skip with ``reason``; on CI, fail with it instead."""
    if on_ci(env):
        pytest.fail(f"cannot run on CI (CI={env.get('CI')}), and CI must not skip: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    """The safety net, as a conftest hook: on CI, any skip of a test it covers is a failure
    (a ``skipif``, an ``importorskip``, a ``pytest.skip`` that bypassed :func:`cannot_run`)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and on_ci(ENV_AT_START) and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped on CI (CI={ENV_AT_START.get('CI')}), and CI must not skip: {reason}"
