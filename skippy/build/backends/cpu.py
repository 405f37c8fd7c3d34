"""The CPU backend: any host with a C/C++ compiler."""

from __future__ import annotations

from typing import Final

from skippy.build.backends.base import BackendSpec, InstallHint

BACKEND: Final = BackendSpec(
    name="cpu",
    title="CPU only (any host)",
    switch=None,
    install=InstallHint(
        debian="apt-get install g++ (cmake and ninja come with `pip install -e .`)",
        arch="pacman -S gcc",
        macos="xcode-select --install",
    ),
)
