"""skippy's sessions.  `nox` alone runs lint and tests; `nox -s build-<backend>` builds
the prepared llama.cpp tree for one backend and spot-checks it (`nox -s build-cpu -- --help`
lists its options).  The patch-queue commands are invoke tasks: `invoke --list`."""

# A menu: each session parses its options and makes one call into the skippy library;
# no git or cmake command line is written here (nox -l prints the docstring above).

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
# the sessions call the skippy beside this file, whichever checkout an installed one came from
sys.path.insert(0, str(ROOT))

from skippy.cli.noxlog import fail, quiet_uv_probe  # noqa: E402 - importable from ROOT only after the line above

# every session runs in the project's own environment; nox still probes for uv: drop its log line
nox.options.default_venv_backend = "none"
quiet_uv_probe()
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


#: the shell scripts of the setup, checked by ShellCheck like the workflows' `run:` steps
CI_SCRIPTS = (".ci/run", ".ci/setup", ".ci/as-root")


@nox.session(tags=["check"])
def lint(session: nox.Session) -> None:
    """ruff, mypy (strict), import layers, workflows (jactionlint, ShellCheck, zizmor, schemas), setup scripts.

    jactionlint runs ShellCheck on every `run:` script; zizmor runs pedantic; the workflows and
    Dependabot's file are checked against GitHub's schemas; the setup scripts by ShellCheck."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("lint-imports")
    workflows = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    # jactionlint only notes a missing shellcheck and carries on: without it no run: script is checked
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join([bin_dir, os.environ.get("PATH", os.defpath)])
    if shutil.which("shellcheck", path=path) is None or shutil.which("jactionlint", path=path) is None:
        session.error("jactionlint and shellcheck are not installed: run `.ci/setup tools`")
    env = {"PATH": path}
    session.run("jactionlint", "--no-online", "--no-color", *workflows, env=env)
    session.run("shellcheck", *CI_SCRIPTS, env=env)
    session.run(
        "zizmor", "--offline", "--persona=pedantic", "--config", ".github/zizmor.yml", "--no-progress", ".github"
    )
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("check-jsonschema", "--builtin-schema", "vendor.dependabot", ".github/dependabot.yml")


@nox.session(tags=["check"])
def tests(session: nox.Session) -> None:
    """All test tiers: unit and integration on every core, then e2e.

    The fast tiers run in one process per core; the e2e tier in one (its builds take every core).
    Arguments go to both runs (-- -m 'not e2e' skips the slow tier); -n N, --numprocesses N or
    -p no:xdist run exactly the arguments given, in one pytest (tests/tiers.py)."""
    from tests.tiers import pytest_runs

    for run in pytest_runs(session.posargs, ROOT):
        session.run("pytest", *run.args, env={"PYTHONHASHSEED": "0"}, success_codes=list(run.ok_codes))


@nox.session(tags=["docs"])
def docs(session: nox.Session) -> None:
    """The reference site: the generated tables checked, then built strictly (MkDocs) into .deps/site."""
    session.run(sys.executable, "-m", "tooling.docs", "--check")
    session.run(sys.executable, "-m", "mkdocs", "build", "--strict", *session.posargs)


# --- build sessions and the spot check: their options are the option table's
# (skippy/cli/options.py; `nox -s build-cpu -- --help`), the same as `invoke build`'s and
# `invoke spot-check`'s; anything else fails before any work.


def _run(session: nox.Session, name: str, backend: str | None = None) -> None:
    from skippy.cli.entries import nox_main

    ran = nox_main(name, session.posargs, os.environ, root=ROOT, backend=backend)
    if ran.skipped:
        session.skip(ran.skipped)
    if ran.code:
        fail(session, ran.code)  # run alone: skippy's exit code, not nox's 1


def _register_build_session(backend: str, title: str, gpu: bool) -> None:
    def session_fn(session: nox.Session) -> None:
        _run(session, "build", backend)

    session_fn.__doc__ = f"Build and spot-check: {title}."
    session_fn.__name__ = f"build_{backend}"
    nox.session(name=f"build-{backend}", tags=["build", "gpu"] if gpu else ["build"])(session_fn)


def _register_build_sessions() -> None:
    """One build-<backend> session per registered backend (skippy.compile.backends)."""
    from skippy.compile.backends import registry

    for name, spec in registry().items():
        _register_build_session(name, spec.title, spec.gpu)


_register_build_sessions()


@nox.session(name="spot-check", tags=["spot-check"])
def spot_check(session: nox.Session) -> None:
    """A real llama-server on a real model (chat, fingerprint, RPC): `nox -s spot-check -- --help`."""
    _run(session, "spot_check")


# --- bench: see benchmarks/bench.py ----------------------------------------------


@nox.session(tags=["bench"])
def bench(session: nox.Session) -> None:
    """Speed targets beside raw git/cmake on the real llama.cpp test-bed; figures to .bench/bench.json."""
    from benchmarks.bench import main

    code = main(os.environ, root=ROOT, args=session.posargs)
    if code:
        session.error(f"bench failed (exit code {code})")


@nox.session(name="dist-cluster", tags=["dist"])
def dist_cluster(session: nox.Session) -> None:
    """An sccache-dist scheduler and N build servers (root, bwrap), fresh tokens; Ctrl-C stops them."""
    from skippy.compile.distcluster import run

    code = run(session.posargs, os.environ, root=ROOT)
    if code:
        session.error(f"dist-cluster failed (exit code {code})")
