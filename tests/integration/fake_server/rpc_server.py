"""A stand-in for ggml-rpc-server: listens on -H/-p and accepts connections until stopped."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=50052)
    args = parser.parse_args()
    state = os.environ.get("FAKE_RPC_STATE")
    if state:
        Path(state).mkdir(parents=True, exist_ok=True)
        (Path(state) / "rpc.pid").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with socket.create_server((args.host, args.port)) as server:
        print(f"Starting RPC server on {args.host}:{args.port}", file=sys.stderr, flush=True)
        server.settimeout(0.2)
        while True:
            try:
                conn, _ = server.accept()
                conn.close()
            except TimeoutError:
                time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
