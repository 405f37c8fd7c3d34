"""A program a build uses, found on the host or inside a root file system: its path and version."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    name: str
    path: str
    version: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "version": self.version}
