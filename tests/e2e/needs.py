"""What an e2e test does when something it needs cannot be had (no network, say).

Locally it skips, saying what is missing.  On CI (``CI`` set to true, 1 or yes,
as :attr:`skippy.settings.Settings.on_ci` reads it) it fails: a CI run that
could not run its e2e tests must not go green.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
