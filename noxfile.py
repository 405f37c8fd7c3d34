"""nox sessions: a menu.  Each session parses its options and makes one call
into the skippy library; no git or cmake command line is written here."""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True


@nox.session(tags=["check"])
def lint(session: nox.Session) -> None:
    """ruff and mypy (strict) over the package, noxfile, tasks and tests."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session(tags=["check"])
def tests(session: nox.Session) -> None:
    """All test tiers: unit, integration and e2e (pass -m 'not e2e' to skip the slow tier)."""
    session.run("pytest", *session.posargs, env={"PYTHONHASHSEED": "0"})


# --- build sessions: see skippy.build -------------------------------------
# posargs (skippy.build.session_parser): -DNAME=VALUE (the only arguments that
# reach CMake), -jN, --skip-unavailable (or SKIPPY_SKIP_UNAVAILABLE=1),
# --no-spot-check, --json, --verbose; anything else fails before any work.


def _build(session: nox.Session, backend: str) -> None:
    from skippy.build import build_main

    code, skipped = build_main(backend, os.environ, root=ROOT, args=session.posargs)
    if skipped:
        session.skip(skipped)
    if code:
        session.error(f"build-{backend} failed (exit code {code})")


@nox.session(name="build-cpu", tags=["build"])
def build_cpu(session: nox.Session) -> None:
    """Build llama-server and the RPC server for the CPU backend, then spot-check them."""
    _build(session, "cpu")


@nox.session(name="build-metal", tags=["build", "gpu"])
def build_metal(session: nox.Session) -> None:
    """Build and spot-check the Metal backend (macOS with Xcode command line tools)."""
    _build(session, "metal")


@nox.session(name="build-cuda", tags=["build", "gpu"])
def build_cuda(session: nox.Session) -> None:
    """Build and spot-check the CUDA backend (nvcc; architectures given, detected or default)."""
    _build(session, "cuda")


@nox.session(name="build-vulkan", tags=["build", "gpu"])
def build_vulkan(session: nox.Session) -> None:
    """Build and spot-check the Vulkan backend (glslc, Vulkan and SPIR-V headers)."""
    _build(session, "vulkan")


@nox.session(name="build-rocm", tags=["build", "gpu"])
def build_rocm(session: nox.Session) -> None:
    """Build and spot-check the ROCm/HIP backend (hipconfig, hipBLAS, rocBLAS)."""
    _build(session, "rocm")


# --- spot-check session: see skippy.spotcheck -----------------------------


@nox.session(name="spot-check", tags=["spot-check"])
def spot_check(session: nox.Session) -> None:
    """A real llama-server on a real model: --model X (repeatable; default gemma3-270m), --server PATH, --json."""
    from os import environ

    from skippy.spotcheck import main

    code = main(session.posargs, env=environ, root=ROOT)
    if code:
        session.error(f"spot check failed (exit code {code})")


# --- bench: see skippy.bench ----------------------------------------------


@nox.session(tags=["bench"])
def bench(session: nox.Session) -> None:
    """Speed targets beside raw git/cmake on the real llama.cpp test-bed; figures to .bench/bench.json."""
    from skippy.cli import bench_main

    code = bench_main(os.environ, root=ROOT, args=session.posargs)
    if code:
        session.error(f"bench failed (exit code {code})")
