"""The stand-in llama-server (``llama_server.py``) and a helper to install it as an executable."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("llama_server.py")
RPC_SCRIPT = Path(__file__).with_name("rpc_server.py")


def install(dest_dir: Path) -> Path:
    """Write an executable ``llama-server`` into ``dest_dir`` that runs the stand-in."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    exe = dest_dir / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + SCRIPT.read_text(encoding="utf-8"), encoding="utf-8")
    exe.chmod(0o755)
    return exe


def install_rpc(dest_dir: Path) -> Path:
    """Write an executable ``ggml-rpc-server`` into ``dest_dir`` that runs the RPC stand-in."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    exe = dest_dir / "ggml-rpc-server"
    exe.write_text(f"#!{sys.executable}\n" + RPC_SCRIPT.read_text(encoding="utf-8"), encoding="utf-8")
    exe.chmod(0o755)
    return exe
