"""A stand-in for llama-server: the same command line and HTTP endpoints, stdlib only.

Behaviour is chosen with environment variables (the spot check passes
``server_env`` through):

FAKE_LLAMA_MODE     ready (default) | slow | crashing | truncated | log-lost | error-in-log |
                    hanging | empty | error-answer | stall
FAKE_LLAMA_LOAD     seconds /health answers 503 before it is ready (default 0.2;
                    slow: 1.5)
FAKE_LLAMA_STATE    a directory: the server writes argv.json, pid, child.pid there
FAKE_LLAMA_CHILD    "1": start a child process that must die with the server
FAKE_LLAMA_PROVENANCE  "upstream=<sha> queue=<digest>" for --version
FAKE_LLAMA_NUMERICS "shifted": /completion answers other tokens (numerics changed)
FAKE_LLAMA_DEVICE   a device name (``Vulkan0``): with ``-ngl`` the load log offloads to it
FAKE_LLAMA_LISTED   the devices ``--list-devices`` prints, comma-separated (default: FAKE_LLAMA_DEVICE)
FAKE_LLAMA_LIST_FAILS  "1": ``--list-devices`` fails like a binary missing its driver library

Modes: *crashing* exits 3 while loading; *truncated* logs llama.cpp's error for a truncated
model and exits 1 at once; *log-lost* exits 1 at once having logged only the start of the
load (as llama-server does when its logger thread loses the last lines); *error-in-log*
answers fine but logs a GGML_ASSERT line; *hanging* never becomes ready and ignores SIGTERM; *empty*
answers with no token; *error-answer* streams an error chunk; *stall* accepts
the completion but never answers; *leak* answers with a chat-template token.
``/completion`` answers a deterministic greedy run (token ids from the prompt);
``--rpc HOST:PORT`` logs the layers offloaded to ``RPC0[HOST:PORT]``.  An argument it does not
know ends the run as llama.cpp's parser does (``error: invalid argument: X``, exit code 1).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODE = os.environ.get("FAKE_LLAMA_MODE", "ready")
STATE = Path(os.environ["FAKE_LLAMA_STATE"]) if os.environ.get("FAKE_LLAMA_STATE") else None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    ready_at = 0.0
    model = ""

    def log_message(self, format: str, *args: Any) -> None:
        log("srv  log_server_r: " + format % args)

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            if time.monotonic() < self.ready_at:
                self._json(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
            else:
                self._json(200, {"status": "ok"})
        elif self.path == "/props":
            self._json(200, {"model_path": self.model, "build_info": "b1-fake"})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/completion":
            self._json(200, completion(str(request.get("prompt", "")), int(request.get("n_predict", 16))))
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
            return
        if MODE == "stall":
            time.sleep(3600)
        words = (
            []
            if MODE == "empty"
            else ["O", "K", "<|im" if MODE == "leak" else "!"][: int(request.get("max_tokens", 5))]
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def event(body: dict[str, Any] | str) -> None:
            payload = body if isinstance(body, str) else json.dumps(body)
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()

        event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
        if MODE == "error-answer":
            event({"error": {"code": 500, "message": "The model produced output that does not match"}})
            return
        for word in words:
            time.sleep(0.01)
            event({"choices": [{"index": 0, "delta": {"content": word}}]})
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        event(
            {
                "choices": [],
                "usage": {"completion_tokens": len(words), "prompt_tokens": 4, "total_tokens": 4 + len(words)},
                "timings": {"predicted_n": len(words)},
            }
        )
        if MODE == "error-in-log":
            log("/src/ggml/src/ggml-cpu/ops.cpp:42: GGML_ASSERT(ne0 % 32 == 0) failed")
        event("[DONE]")


def completion(prompt: str, n: int) -> dict[str, Any]:
    """A deterministic greedy answer: token ids from the prompt's bytes (shifted when numerics changed)."""
    shift = 7 if os.environ.get("FAKE_LLAMA_NUMERICS") == "shifted" else 0
    probs: list[dict[str, Any]] = []
    for i in range(n):
        tok = (sum(prompt.encode()) * (i + 3) + (shift if i >= 2 else 0)) % 1000
        probs.append({"id": tok, "token": f" t{tok}", "bytes": [], "logprob": -0.1 * (i % 4), "top_logprobs": []})
    return {"content": "".join(str(p["token"]) for p in probs), "completion_probabilities": probs}


def offload_log(rpc: str | None, ngl: str | None) -> None:
    device = f"RPC0[{rpc}]" if rpc else os.environ.get("FAKE_LLAMA_DEVICE") if ngl else None
    log(f"load_tensors: offloaded {5 if device else 0}/5 layers to GPU")
    log("load_tensors:   CPU_Mapped model buffer size =     1.00 MiB")
    if device:
        log(f"load_tensors: {device} model buffer size =     2.00 MiB")


def version() -> int:
    log("version: 1 (fake)")
    log("built with python for testing")
    if os.environ.get("FAKE_LLAMA_PROVENANCE"):
        log("skippy: " + os.environ["FAKE_LLAMA_PROVENANCE"])
    return 0


def record_start() -> None:
    """argv and pid for the test; with FAKE_LLAMA_CHILD=1 a child process that must die with us."""
    if STATE is not None:
        STATE.mkdir(parents=True, exist_ok=True)
        (STATE / "argv.json").write_text(json.dumps(sys.argv[1:]))
        (STATE / "pid").write_text(str(os.getpid()))
    if os.environ.get("FAKE_LLAMA_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        if STATE is not None:
            (STATE / "child.pid").write_text(str(child.pid))


def list_devices() -> int:
    """``--list-devices``: FAKE_LLAMA_LISTED (or FAKE_LLAMA_DEVICE), or a failure like a missing driver."""
    if os.environ.get("FAKE_LLAMA_LIST_FAILS") == "1":
        log("llama-server: error while loading shared libraries: libcuda.so.1: cannot open shared object file")
        return 127
    listed = os.environ.get("FAKE_LLAMA_LISTED", os.environ.get("FAKE_LLAMA_DEVICE", ""))
    names = [name for name in listed.split(",") if name]
    print("Available devices:")
    for name in names or ["(none)"]:
        print(f"  {name}: fake device (1024 MiB, 1000 MiB free)" if names else f"  {name}")
    return 0


def parse_args() -> argparse.Namespace | None:
    """The arguments; None when one is unknown (logged, and the run ends, as llama.cpp's parser does)."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--list-devices", action="store_true")
    parser.add_argument("-m", "--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--rpc")
    parser.add_argument("-ngl", "--n-gpu-layers")
    for name in ("--ctx-size", "--parallel", "--log-verbosity", "--chat-template", "--threads"):
        parser.add_argument(name)
    args, rest = parser.parse_known_args()
    if rest:
        # llama.cpp's argument parser (common/arg.cpp): the first argument it does not know ends the run
        arg = rest[0].replace("_", "-") if rest[0].startswith("--") else rest[0]
        log(f"error: invalid argument: {arg}")
        return None
    return args


#: the modes whose load fails: (seconds into the load, the lines logged, the exit code)
LOAD_FAILS: dict[str, tuple[float, tuple[str, ...], int]] = {
    "crashing": (0.2, ("llama_model_loader: unexpected end of tensor data",), 3),
    "truncated": (
        0.0,
        ("llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within the file bounds",),
        1,
    ),
    "log-lost": (0.0, ("llama_model_loader: - kv   0:  general.architecture str = llama",), 1),
}


def main() -> int:
    args = parse_args()
    if args is None:
        return 1
    if args.version:
        return version()
    if args.list_devices:
        return list_devices()
    record_start()
    if MODE == "hanging":
        signal.signal(signal.SIGTERM, lambda *_: log("ignoring SIGTERM"))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"srv    load_model: loading model '{args.model}'")
    if MODE in LOAD_FAILS:
        after, lines, code = LOAD_FAILS[MODE]
        time.sleep(after)
        for line in lines:
            log(line)
        return code
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    """Load (the offload log, FAKE_LLAMA_LOAD seconds of 503), listen and answer until stopped."""
    offload_log(args.rpc, args.n_gpu_layers)
    load = float(os.environ.get("FAKE_LLAMA_LOAD", "1.5" if MODE == "slow" else "0.2"))
    Handler.ready_at = float("inf") if MODE == "hanging" else time.monotonic() + load
    Handler.model = args.model or ""
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as exc:
        log(f"srv  llama_server: couldn't bind HTTP server socket, hostname: {args.host}, port: {args.port}: {exc}")
        return 1
    httpd.daemon_threads = True
    log(f"srv  llama_server: listening on http://{args.host}:{args.port}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        while True:
            time.sleep(0.1)
            if time.monotonic() >= Handler.ready_at and MODE != "hanging":
                log("srv  llama_server: model loaded")
                Handler.ready_at = 0.0
                while True:
                    time.sleep(3600)
    finally:
        httpd.server_close()


if __name__ == "__main__":
    sys.exit(main())
