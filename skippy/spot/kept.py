"""A proof already made is not made again: the spot check's verdicts kept beside the build.

A model's spot check (its chat answer, fingerprint, device and RPC proofs) depends on the
binaries it ran (llama-server, the RPC server, any shared library beside them), the model file,
the committed reference fingerprint of that model, and the settings that change what is
checked (backend, the server's environment and arguments, ``[tool.skippy.spot_check]``, the
RPC path, whether agreement is required, the machine, the checker's own code).  A passed
result is kept in the build dir's proof record (:data:`PROOFS_NAME`, beside the build stamp)
under the digest of all of those; the next check with the same digest shows it as kept, with
the time it was made, and starts no server.  Any of them changing makes the proof again;
``--recheck`` makes it again regardless; a failed proof is never kept (and a recheck that
fails drops the one kept before it).

File digests are cached in the record by size, mtime, ctime and inode, so a large model is
hashed once, not on every run; the packaged default model's digest is the one it is
published with (its stamp is checked on fetch).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.core.files import sha256_of, write_text_atomic

#: the proof record's file name, in the build dir beside the build stamp
PROOFS_NAME: Final = "skippy-proofs.json"
#: the record's format; another format is read as no record (every proof is made again)
SCHEMA: Final = 1
#: the modules whose code makes the proofs: another version of them makes another proof
CHECKER_MODULES: Final = ("spotcheck", "proofs", "chat", "compute", "evidence", "fingerprint", "server", "kept")


def now() -> str:
    """The time a proof is made, as the record keeps it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def proof_key(parts: Mapping[str, object]) -> str:
    """The digest of everything a proof depends on (canonical JSON of ``parts``)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    """What says a file is unchanged without reading it: a write moves mtime and ctime; a
    copy or a move over it changes the inode or ctime."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


@functools.cache
def checker_digest() -> str:
    """The digest of the checker's own modules' code (read once per process)."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in CHECKER_MODULES:
        source = here / f"{name}.py"
        digest.update(name.encode() + b"\0" + (source.read_bytes() if source.is_file() else b"") + b"\0")
    return digest.hexdigest()


@dataclass
class ProofRecord:
    """The kept proofs of one build dir and the digests of the files they ran (None ``path``:
    a binary outside any build dir, where nothing is kept and every digest is made afresh)."""

    path: Path | None
    #: key -> {"when", "what", "server", "result"}
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: file path -> {"identity": [size, mtime_ns, ctime_ns, inode], "sha256"}
    digests: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the files whose digests this run used (the others are dropped on save)
    used: set[str] = field(default_factory=set)
    #: what this run changed: a proof kept or dropped, a digest made
    kept_changed: bool = False
    digests_changed: bool = False

    @classmethod
    def load(cls, path: Path | None) -> ProofRecord:
        """The record at ``path``; a missing, unreadable or other-format one is empty."""
        if path is None:
            return cls(None)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(path)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            return cls(path)
        entries = data.get("proofs")
        digests = data.get("digests")
        return cls(
            path,
            entries=dict(entries) if isinstance(entries, dict) else {},
            digests=dict(digests) if isinstance(digests, dict) else {},
        )

    def digest(self, file: Path) -> str:
        """``file``'s sha256, read from the record while the file's identity is unchanged."""
        name = str(file.resolve())
        self.used.add(name)
        identity = _identity(file.stat())
        cached = self.digests.get(name)
        if isinstance(cached, dict) and cached.get("identity") == identity and isinstance(cached.get("sha256"), str):
            return str(cached["sha256"])
        sha = sha256_of(file)
        self.digests[name] = {"identity": identity, "sha256": sha}
        self.digests_changed = True
        return sha

    def kept(self, key: str) -> dict[str, Any] | None:
        """The kept result under ``key`` and when it was made ({"when", "result"}), or None."""
        if self.path is None:
            return None
        entry = self.entries.get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("result"), dict) or "when" not in entry:
            return None
        return entry

    def keep(self, key: str, *, what: str, server: str, result: Mapping[str, Any], when: str) -> None:
        """Keep a passed proof (the caller never hands a failed one)."""
        self.entries[key] = {"what": what, "server": server, "when": when, "result": dict(result)}
        self.kept_changed = True

    def drop(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self.kept_changed = True

    def save(self, server: str) -> None:
        """Write the record, when this run changed it: the proofs of the binary ``server`` (digest)
        only, the digests this run used (a run that kept nothing and had nothing kept writes
        nothing).  Raises OSError when the build dir cannot be written."""
        if self.path is None or not (self.kept_changed or (self.digests_changed and self.entries)):
            return
        proofs = {k: v for k, v in self.entries.items() if isinstance(v, dict) and v.get("server") == server}
        digests = {k: v for k, v in self.digests.items() if k in self.used}
        data = {"schema": SCHEMA, "proofs": proofs, "digests": digests}
        write_text_atomic(self.path, json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
