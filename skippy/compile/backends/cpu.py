"""The CPU backend: any host with a C/C++ compiler."""

from __future__ import annotations

from typing import Final

from skippy.compile.backends.base import BackendSpec, CiJob, InstallHint

BACKEND: Final = BackendSpec(
    name="cpu",
    title="CPU only (any host)",
    switch=None,
    install=InstallHint(
        debian="apt-get install g++ (cmake and ninja come with `pip install -e .`)",
        arch="pacman -S gcc",
        macos="xcode-select --install",
    ),
    reference=True,
    label="CPU",
    ci=(
        CiJob("ubuntu, build + spot check"),
        CiJob(
            "ubuntu, build only + upstream's tests",
            key_suffix="tests",
            posargs=("--upstream-tests", "--no-spot-check"),
            notes=(
                "upstream's own tests on the patched tree: ctest -L main and the queue's own tests; a",
                "failure is checked on the unpatched pin and traced to the first patch that causes it",
            ),
        ),
        CiJob(
            "ubuntu arm64, build + spot check",
            runs_on="ubuntu-24.04-arm",
            key_suffix="arm64",
            notes=(
                "the CPU backend on another architecture (NEON kernels instead of AVX2): the spot check",
                "holds the fingerprint to the committed x86_64 reference within the stated",
                "arch_logprob_tolerance (skippy.spot.fingerprint), as a GPU device is held to its own",
            ),
        ),
    ),
)
