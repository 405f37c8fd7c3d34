"""e2e fixtures: the real llama.cpp test-bed (three llama-cpp-python sdists).

Every test under tests/e2e is marked ``e2e``.  The test-bed and the sdists are
cached under the project's ``.deps/cache`` so they survive between runs; the
first build downloads about 220 MB from the package index.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue.testbed import LlamaTestbed, project_testbed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def testbed() -> LlamaTestbed:
    # the package index settings (proxies, PIP_* variables) come from the real environment;
    # git commands inside stay hermetic (skippy.core.git)
    settings = Settings.load(ROOT, dict(os.environ))
    return project_testbed(settings, Console(env=settings.env))
