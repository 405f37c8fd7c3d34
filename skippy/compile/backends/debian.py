"""What the toolchains taken from Debian's archive share: the mirror the system's apt
already uses, a sources line for a suite, and the archive keyring.

The Vulkan headers (:mod:`skippy.compile.backends.vulkan_headers`) and the ROCm root
(:mod:`skippy.compile.backends.rocm_rootfs`) both fetch from the mirror the system's apt
names, never from a host of their own; each says in its own words what to do when
there is none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from skippy.core import proc
from skippy.core.errors import ToolchainMissing

#: the archive keyring Debian's own sources name (Signed-By) when the system has it
DEBIAN_KEYRING: Final = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def debian_mirror(indextargets: str) -> str | None:
    """The Debian mirror the system's apt uses, from ``apt-get indextargets``: the site of a
    Debian ``main`` index that is not the security archive; None when there is none."""
    for block in indextargets.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        debian_main = fields.get("Origin") == "Debian" and fields.get("Component") == "main"
        security = "security" in fields.get("Release", "") or "security" in fields.get("Label", "").lower()
        if debian_main and not security and fields.get("Site"):
            return fields["Site"]
    return None


def system_mirror(env: Mapping[str, str]) -> str | None:
    """:func:`debian_mirror` of what the system's apt says; None when apt names none (or
    cannot be asked: no apt, or it failed)."""
    try:
        listed = proc.run(["apt-get", "indextargets"], env=env, timeout=60, check=False)
    except ToolchainMissing:  # no apt-get on PATH
        return None
    return debian_mirror(listed.stdout) if listed.ok else None


def sources_line(mirror: str, suite: str, keyring: Path | None) -> str:
    """One ``deb`` line for ``suite``'s main component, signed by ``keyring`` when given."""
    signed_by = f"[signed-by={keyring}] " if keyring is not None else ""
    return f"deb {signed_by}{mirror} {suite} main\n"


def present_keyring(keyring: Path | None) -> Path | None:
    """``keyring`` when the file is there (else apt's own trusted keys decide)."""
    return keyring if keyring is not None and keyring.is_file() else None


__all__ = ["DEBIAN_KEYRING", "debian_mirror", "present_keyring", "sources_line", "system_mirror"]
