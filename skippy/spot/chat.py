"""One llama-server on one model, over HTTP: the argv, readiness, the streamed chat answer,
the log scan and the verdict (pure parts are plain functions)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from skippy.compile.backends import failure_patterns
from skippy.spot.report import ModelResult, Options
from skippy.spot.server import (
    HOST,
    LOG_TAIL,
    Server,
    ServerFailure,
    exited_early,
    http_status,
)

PROMPT: Final = "Say OK"


#: known failure lines: (regex, what it means).  Matched case-sensitively per line: these, then
#: each registered backend's own (``BackendSpec.failure_patterns``)
FAILURE_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(rx), why)
    for rx, why in (
        (r"model-open failure", "the model file could not be opened"),
        (r"error loading model", "llama.cpp could not load the model"),
        (r"failed to load model", "llama.cpp could not load the model"),
        (r"GGML_ASSERT", "a ggml assertion failed"),
        *failure_patterns(),
        (r"ERROR: \w*Sanitizer", "sanitizer report"),
        (r"WARNING: ThreadSanitizer", "sanitizer report"),
        (r"runtime error:", "undefined behaviour (UBSan)"),
        (r"terminate called after throwing", "uncaught C++ exception"),
        (r"\bSegmentation fault\b|\bSIGSEGV\b", "segmentation fault"),
    )
)


#: a port that was taken between our probe and the server's bind
_BIND_FAILURE = re.compile(r"couldn't bind|address already in use", re.IGNORECASE)
#: llama.cpp's argument parser refusing one argument (common/arg.cpp): an unknown one, or a bad value
_REFUSED_ARG = re.compile(r'^error: invalid argument: (?P<unknown>\S+)|^error while handling argument "(?P<bad>[^"]+)"')


def refused_argument(lines: Sequence[str]) -> tuple[str, str] | None:
    """(the argument, the line) when llama-server refused one of its arguments and exited."""
    for line in lines:
        match = _REFUSED_ARG.match(line.strip())
        if match:
            return match["unknown"] or match["bad"], line.strip()
    return None


def plan_server_argv(
    server: Path,
    model: Path,
    port: int,
    options: Options,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-server command line for one model (pure)."""
    return [
        str(server),
        "--model",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--ctx-size",
        str(options.ctx_size),
        "--parallel",
        "1",
        # llama.cpp's own INFO lines (which device each layer went to) show from verbosity 4 on
        "--log-verbosity",
        "4",
        *extra_args,
    ]


def completion_request(options: Options) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": options.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def scan_log(lines: Sequence[str]) -> list[tuple[str, str]]:
    """The (line, meaning) pairs of known failure lines in a server log."""
    hits: list[tuple[str, str]] = []
    for line in lines:
        for pattern, why in FAILURE_PATTERNS:
            if pattern.search(line):
                hits.append((line, why))
                break
    return hits


@dataclass(frozen=True)
class Answer:
    tokens: int
    content: str
    first_token_seconds: float | None
    completion_seconds: float


@dataclass
class _StreamRead:
    """What the chunks of a streamed answer said so far."""

    content: list[str] = field(default_factory=list)
    first: float | None = None
    text_chunks: int = 0
    usage_tokens: int | None = None
    timing_tokens: int | None = None

    def take(self, chunk: dict[str, Any], arrived: float, started: float) -> None:
        error = chunk.get("error")
        if error is not None:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise ServerFailure(f"the server answered with an error: {message}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content") or delta.get("reasoning_content") or ""
            if piece:
                self.content.append(piece)
                self.text_chunks += 1
                if self.first is None:
                    self.first = arrived - started
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        timings = chunk.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
            self.timing_tokens = timings["predicted_n"]

    @property
    def tokens(self) -> int:
        if self.usage_tokens is not None:
            return self.usage_tokens
        return self.timing_tokens if self.timing_tokens is not None else self.text_chunks


def parse_stream(events: Sequence[tuple[float, str]], started: float) -> Answer:
    """Read the server-sent events of a streamed chat completion.

    ``events`` are (arrival time, data payload) pairs.  Tokens come from the
    usage block (``usage.completion_tokens``), else the server's timings,
    else the number of chunks that carried text.
    """
    read = _StreamRead()
    last = started
    for arrived, data in events:
        last = arrived
        if data.strip() == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            read.take(chunk, arrived, started)
    return Answer(read.tokens, "".join(read.content), read.first, last - started)


def judge(result: ModelResult, log: Sequence[str], answer: Answer | None) -> ModelResult:
    """Set the verdict from the HTTP answer and the server log (the log wins)."""
    hits = scan_log(log)
    if hits:
        result.verdict = "fail"
        result.reason = "server log: " + hits[0][1]
        result.log_lines = [line for line, _ in hits][:20]
        return result
    if answer is None:
        return result  # reason already set by whoever failed
    if answer.tokens >= 1 or answer.content:
        result.verdict = "pass"
        result.reason = ""
    else:
        result.verdict = "fail"
        result.reason = "the completion generated no token"
        result.log_lines = list(log[-LOG_TAIL:])
    return result


def wait_ready(server: Server, port: int, options: Options) -> float:
    """Poll /health until 200; returns the seconds since the server started."""
    url = f"http://{HOST}:{port}/health"
    deadline = server.started + options.load_timeout
    while True:
        code = server.poll()
        if code is not None:
            raise exited_early(server, code, "before it was ready")
        try:
            status = http_status(url, timeout=max(options.poll_interval * 10, 1.0))
        except (urllib.error.URLError, OSError, TimeoutError):
            status = 0
        if status == 200:
            return time.monotonic() - server.started
        if time.monotonic() >= deadline:
            what = "still loading (503)" if status == 503 else "not answering"
            raise ServerFailure(f"llama-server not ready after {options.load_timeout:g} s ({what})")
        time.sleep(options.poll_interval)


def ask(port: int, options: Options) -> Answer:
    """One streamed chat completion; the answer with its timings."""
    body = json.dumps(completion_request(options)).encode()
    request = urllib.request.Request(
        f"http://{HOST}:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        method="POST",
    )
    started = time.monotonic()
    events: list[tuple[float, str]] = []
    deadline = started + options.request_timeout
    try:
        with urllib.request.urlopen(request, timeout=options.request_timeout) as response:  # noqa: S310
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if line.startswith("data:"):
                    payload = line.removeprefix("data:").strip()
                    events.append((time.monotonic(), payload))
                    if payload == "[DONE]":
                        break
                if time.monotonic() > deadline:
                    raise ServerFailure(f"the completion did not finish within {options.request_timeout:g} s")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:300]
        raise ServerFailure(f"/v1/chat/completions answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise ServerFailure(f"/v1/chat/completions failed: {exc}") from None
    return parse_stream(events, started)
