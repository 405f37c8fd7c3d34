"""The model-load spot check: a real llama-server answering a real model.

For each model: start the server on 127.0.0.1 at a free port, poll ``/health``
(503 while loading) until it is ready, ask ``/v1/chat/completions`` for a
5-token answer to "Say OK" at temperature 0 (streamed, so the first token is
timed), and require at least one generated token.  The server log goes to a
file and is scanned for known failure lines even when the HTTP side looked
fine.  The server is always stopped (SIGTERM, then SIGKILL after a grace
period), also on Ctrl-C and on failure.

Pure parts (argv planning, log scanning, provenance parsing, the verdict) are
plain functions; :func:`spot_check` runs them.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from skippy.build.backends import RPC_TARGETS, SERVER_TARGET
from skippy.build.backends import names as backend_names
from skippy.check.compute import (
    ComputeFailure,
    ComputeResult,
    agreement_with_reference,
    device_reason,
    file_sha256,
    fingerprint_runs,
    leak_reason,
)
from skippy.check.fingerprint import (
    DEFAULT_RPC_TOLERANCE,
    DEFAULT_TOLERANCE,
    Fingerprint,
    Run,
    compare,
    read_reference,
    reference_path,
    render_reference,
)
from skippy.check.models import ChatFacts, ModelRef, chat_facts, model_refs, resolve_model
from skippy.check.provenance import stale_next_step
from skippy.check.server import (
    HOST,
    LOG_TAIL,
    Server,
    ServerFailure,
    describe_exit,
    free_port,
    http_status,
    running_server,
    wait_for_port,
)
from skippy.core import proc
from skippy.core.errors import SettingsError, SkippyError, SpotCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console

PROMPT: Final = "Say OK"

#: known failure lines: (regex, what it means).  Matched case-sensitively per line.
FAILURE_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(rx), why)
    for rx, why in (
        (r"metal_library_init: error", "Metal shader library failed to build"),
        (r"model-open failure", "the model file could not be opened"),
        (r"error loading model", "llama.cpp could not load the model"),
        (r"failed to load model", "llama.cpp could not load the model"),
        (r"GGML_ASSERT", "a ggml assertion failed"),
        (r"\bCUDA error\b", "CUDA error"),
        (r"ggml_cuda\w*: .*\berror\b", "CUDA error"),
        (r"\bHIP error\b|\bROCm error\b", "HIP/ROCm error"),
        (r"\bVK_ERROR_\w+", "Vulkan error"),
        (r"ggml_vulkan: .*\b(?:[Ee]rror|failed)\b", "Vulkan error"),
        (r"ERROR: \w*Sanitizer", "sanitizer report"),
        (r"WARNING: ThreadSanitizer", "sanitizer report"),
        (r"runtime error:", "undefined behaviour (UBSan)"),
        (r"terminate called after throwing", "uncaught C++ exception"),
        (r"\bSegmentation fault\b|\bSIGSEGV\b", "segmentation fault"),
    )
)

#: a port that was taken between our probe and the server's bind
_BIND_FAILURE = re.compile(r"couldn't bind|address already in use", re.IGNORECASE)
_PROVENANCE_RE = re.compile(r"skippy:\s*upstream=(?P<upstream>\S+)\s+queue=(?P<queue>\S+)")
_VERSION_RE = re.compile(r"^version: .*$", re.MULTILINE)


@dataclass(frozen=True)
class Provenance:
    """What a skippy-built llama-server says it was built from."""

    upstream_sha: str
    queue_digest: str


@dataclass(frozen=True)
class Options:
    """Timeouts and sizes; ``[tool.skippy.spot_check]`` overrides the defaults."""

    load_timeout: float = 300.0
    request_timeout: float = 120.0
    grace: float = 10.0
    ctx_size: int = 1024
    max_tokens: int = 5
    poll_interval: float = 0.1
    bind_attempts: int = 3
    #: how far a top-1 log-probability may be from the CPU reference's (nats)
    logprob_tolerance: float = DEFAULT_TOLERANCE
    #: the same over RPC (its numbers vary from run to run; the greedy tokens must still be identical)
    rpc_logprob_tolerance: float = DEFAULT_RPC_TOLERANCE

    @classmethod
    def from_settings(cls, settings: Settings) -> Options:
        table = settings.subtable("spot_check", cls.__dataclass_fields__, example="load_timeout = 600")
        defaults = cls()
        values: dict[str, Any] = {}
        for key, value in table.items():
            kind = type(getattr(defaults, key))
            try:
                values[key] = kind(value)
            except (TypeError, ValueError):
                raise SettingsError(
                    f"pyproject.toml [tool.skippy.spot_check] {key} must be a {kind.__name__}, got {value!r}",
                    untouched="everything",
                    next_step=f"set {key} = {getattr(defaults, key)!r} (the default) or another {kind.__name__}",
                ) from None
        return cls(**values)


Verdict = Literal["pass", "fail"]


@dataclass
class ModelResult:
    model: str
    path: str | None
    verdict: Verdict = "fail"
    reason: str = ""
    load_seconds: float | None = None
    first_token_seconds: float | None = None
    completion_seconds: float | None = None
    tokens: int = 0
    content: str = ""
    port: int | None = None
    exit_code: int | None = None
    log_path: str | None = None
    #: the log lines that decided a failure (or the log tail)
    log_lines: list[str] = field(default_factory=list)
    #: the chat template used, the fingerprint and its agreement, the device and RPC proofs
    compute: ComputeResult = field(default_factory=ComputeResult)
    #: the greedy runs of the fingerprint prompts (in ``compute.fingerprint`` once keyed by the model)
    runs: list[Run] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"


@dataclass
class SpotCheckReport:
    server: str
    version: str | None = None
    provenance: Provenance | None = None
    results: list[ModelResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def failed(self) -> list[ModelResult]:
        return [r for r in self.results if not r.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "version": self.version,
            "provenance": asdict(self.provenance) if self.provenance else None,
            "ok": self.ok,
            "results": [
                {**{k: v for k, v in asdict(r).items() if k not in ("runs", "compute")}, "compute": r.compute.as_dict()}
                for r in self.results
            ],
        }

    def markdown(self) -> str:
        lines = [
            "### Spot check: " + ("passed" if self.ok else "FAILED"),
            "",
            f"`{self.server}`" + (f" ({self.version})" if self.version else ""),
            "",
            "| model | verdict | load s | first token s | completion s | tokens | reason |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in self.results:
            lines.append(
                f"| `{r.model}` | {r.verdict} | {_fmt(r.load_seconds)} | {_fmt(r.first_token_seconds)} "
                f"| {_fmt(r.completion_seconds)} | {r.tokens} | {r.reason.replace('|', '/')} |"
            )
        for r in self.failed:
            if r.log_lines:
                lines += ["", f"<details><summary>{r.model}: log</summary>", "", "```"]
                lines += r.log_lines
                lines += ["```", "", "</details>"]
        return "\n".join(lines)


class ModelCheckFailed(SpotCheckFailed):
    """A spot check ran and at least one model failed; the report is attached."""

    def __init__(self, report: SpotCheckReport, *, next_step: str) -> None:
        failed = report.failed
        names = ", ".join(r.model for r in failed)
        details = "\n".join(
            f"{r.model}: {r.reason}" + "".join(f"\n  | {line}" for line in r.log_lines[-12:]) for r in failed
        )
        super().__init__(
            f"spot check failed for {len(failed)} of {len(report.results)} model(s): {names}",
            untouched="the build and the model cache; the server was stopped",
            next_step=next_step,
            details=details,
        )
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "report": self.report.as_dict()}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- pure parts -------------------------------------------------------------


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


def parse_provenance(text: str) -> Provenance | None:
    """``skippy: upstream=<sha> queue=<digest>`` from ``llama-server --version`` output."""
    match = _PROVENANCE_RE.search(text)
    if match is None:
        return None
    return Provenance(match["upstream"], match["queue"])


def version_line(text: str) -> str | None:
    match = _VERSION_RE.search(text)
    return match.group(0).removeprefix("version: ").strip() if match else None


def provenance_mismatch(expected: Provenance, reported: Provenance | None) -> str | None:
    """Why ``reported`` is not ``expected`` (None when it is)."""
    if reported is None:
        return (
            "the binary reports no provenance (no `skippy: upstream=... queue=...` line in --version): "
            "it was built before provenance was added, or not by skippy"
        )
    diffs = []
    if reported.upstream_sha != expected.upstream_sha:
        diffs.append(f"upstream is {reported.upstream_sha}, expected {expected.upstream_sha}")
    if reported.queue_digest != expected.queue_digest:
        diffs.append(f"queue digest is {reported.queue_digest}, expected {expected.queue_digest}")
    return "; ".join(diffs) or None


def build_dir_of(server: Path, settings: Settings) -> Path | None:
    """The build directory (``<build_root>/<backend>-<digest>``) a server binary is in, if any."""
    try:
        rel = server.resolve().relative_to(settings.build_root.resolve())
    except ValueError:
        return None
    return settings.build_root / rel.parts[0] if len(rel.parts) > 1 else None


def backend_of(server: Path, settings: Settings) -> str:
    """The backend a server binary was built for (``<build_root>/<backend>-<digest>/bin/...``)."""
    build_dir = build_dir_of(server, settings)
    if build_dir is None:
        return "cpu"
    name = build_dir.name
    for backend in backend_names():
        if name == backend or name.startswith(backend + "-"):
            return backend
    return "cpu"


@dataclass(frozen=True)
class Answer:
    tokens: int
    content: str
    first_token_seconds: float | None
    completion_seconds: float


def parse_stream(events: Sequence[tuple[float, str]], started: float) -> Answer:
    """Read the server-sent events of a streamed chat completion.

    ``events`` are (arrival time, data payload) pairs.  Tokens come from the
    usage block (``usage.completion_tokens``), else the server's timings,
    else the number of chunks that carried text.
    """
    content: list[str] = []
    first: float | None = None
    text_chunks = 0
    usage_tokens: int | None = None
    timing_tokens: int | None = None
    last = started
    for arrived, data in events:
        last = arrived
        if data.strip() == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        error = chunk.get("error")
        if error is not None:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise ServerFailure(f"the server answered with an error: {message}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content") or delta.get("reasoning_content") or ""
            if piece:
                content.append(piece)
                text_chunks += 1
                if first is None:
                    first = arrived - started
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            usage_tokens = usage["completion_tokens"]
        timings = chunk.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
            timing_tokens = timings["predicted_n"]
    tokens = usage_tokens if usage_tokens is not None else timing_tokens
    if tokens is None:
        tokens = text_chunks
    return Answer(tokens, "".join(content), first, last - started)


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
            raise ServerFailure(f"llama-server {describe_exit(code)} before it was ready")
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


# --- the check ----------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "model"


def _log_name(ref: ModelRef, used: set[str]) -> str:
    base = _slug(Path(ref.name).name if ref.kind == "path" else ref.label)
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}-{n}"
    used.add(name)
    return name + ".log"


def log_dir(settings: Settings, server: Path) -> Path:
    """Logs go beside the build (``<build dir>/spot-check/``), else under build_root."""
    build_dir = build_dir_of(server, settings)
    return (build_dir if build_dir is not None else settings.build_root) / "spot-check"


def check_model(
    server_binary: Path,
    model: Path,
    label: str,
    *,
    env: Mapping[str, str],
    options: Options,
    log_path: Path,
    extra_server_args: Sequence[str] = (),
    fingerprint: bool = True,
    device_prefix: str | None = None,
    leak_check: bool = True,
) -> ModelResult:
    """Start the server on ``model``, ask it once (and the fingerprint prompts), stop it, and judge.

    ``device_prefix``: the layers must have gone to a device of that name (``Vulkan``, ``RPC``).
    ``leak_check``: the answer must hold no chat-template token (off for random-weight models).
    """
    result = ModelResult(model=label, path=str(model), log_path=str(log_path))
    for attempt in range(options.bind_attempts):
        port = free_port()
        result.port = port
        argv = plan_server_argv(server_binary, model, port, options, extra_server_args)
        answer: Answer | None = None
        with running_server(argv, env=env, log_path=log_path, grace=options.grace) as server:
            try:
                result.load_seconds = wait_ready(server, port, options)
                answer = ask(port, options)
                result.tokens = answer.tokens
                result.content = answer.content
                result.first_token_seconds = answer.first_token_seconds
                result.completion_seconds = answer.completion_seconds
                if fingerprint:
                    result.runs = fingerprint_runs(HOST, port, options.request_timeout)
            except ServerFailure as exc:
                result.reason = exc.reason
            except ComputeFailure as exc:
                answer, result.reason = None, f"fingerprint: {exc.reason}"
        result.exit_code = server.exit_code
        log = server.log_lines()
        if answer is None and attempt + 1 < options.bind_attempts and any(_BIND_FAILURE.search(x) for x in log):
            continue  # someone took the port between our probe and the bind: try another
        if answer is None:
            result.log_lines = log[-LOG_TAIL:]
        judge(result, log, answer)
        if result.ok and leak_check and (why := leak_reason(result.content)):
            result.verdict, result.reason = "fail", why
        if result.ok and device_prefix:
            why, shown = device_reason(log, device_prefix)
            result.compute.device = shown
            if why:
                result.verdict, result.reason = "fail", why
                result.log_lines = [line for line in log if "load_tensors" in line][-LOG_TAIL:]
        return result
    return result  # pragma: no cover - the loop always returns


def read_version(server_binary: Path, env: Mapping[str, str], console: Console) -> str:
    """``llama-server --version`` output (it prints to stderr and exits 0)."""
    if proc.which(str(server_binary), env) is None:
        raise SpotCheckFailed(
            f"server binary {server_binary} is missing or not executable",
            untouched="everything: no server was started",
            next_step="nox -s build-cpu, or pass --server PATH",
        )
    result = proc.run(
        [server_binary, "--version"],
        env=env,
        check=False,
        timeout=60,
        echo=console.command,
        what="llama-server --version",
    )
    return (result.stdout + "\n" + result.stderr).strip()


def spot_check(
    settings: Settings,
    server_binary: Path,
    models: Sequence[str] = (),
    *,
    console: Console,
    server_env: Mapping[str, str] | None = None,
    extra_server_args: Sequence[str] = (),
    expect_provenance: Provenance | None = None,
    device_prefix: str | None = None,
    rpc_server: Path | None = None,
    write_reference: bool = False,
    agreement_required: bool = True,
) -> SpotCheckReport:
    """Spot-check ``server_binary`` on each model (the default model when none is given).

    Per model: a chat answer through the model's own template (no template tokens), a
    compute fingerprint compared with the committed CPU reference, the layers on the
    backend's device (``device_prefix``), and, with ``rpc_server``, the same model
    offloaded to a freshly started RPC server (layers on the RPC device, same numbers).
    ``write_reference`` records this run's fingerprints as the reference (CPU builds);
    ``agreement_required=False`` reports a difference from it without failing (pin-bump's
    own build of a new upstream, whose numbers may move on purpose).

    Raises :class:`ModelCheckFailed` (a :class:`SpotCheckFailed`, with the
    report attached as ``.report``) when any model fails, and
    :class:`SpotCheckFailed` when the binary's provenance is not the expected one.
    """
    options = Options.from_settings(settings)
    env = {**settings.env, **(server_env or {})}
    server_binary = Path(server_binary)
    build_cmd = f"nox -s build-{backend_of(server_binary, settings)}"
    refs: list[ModelRef] = model_refs(list(models), cwd=settings.root)
    version_text = read_version(server_binary, env, console)
    report = SpotCheckReport(
        server=settings.relative(server_binary),
        version=version_line(version_text),
        provenance=parse_provenance(version_text),
    )
    if expect_provenance is not None:
        why = provenance_mismatch(expect_provenance, report.provenance)
        if why is not None:
            raise SpotCheckFailed(
                f"stale llama-server {settings.relative(server_binary)}: {why}",
                untouched="everything: the server was not started",
                next_step=stale_next_step(
                    expect_provenance.queue_digest,
                    report.provenance.queue_digest if report.provenance else None,
                    backend_of(server_binary, settings),
                ),
                details=version_text,
            )
    logs = log_dir(settings, server_binary)
    used: set[str] = set()
    for ref in refs:
        with console.step(f"spot check {ref.label}"):
            try:
                resolved = resolve_model(ref, settings, console)
            except SkippyError as exc:
                result = ModelResult(model=ref.label, path=None, reason=exc.what)
                if exc.next_step:
                    result.reason += f" (next: {exc.next_step})"
                report.results.append(result)
                console.info(f"{ref.label}: FAIL: {result.reason}")
                continue
            result = _check_resolved(
                ref,
                resolved.path,
                server_binary,
                settings=settings,
                env=env,
                options=options,
                log_path=logs / _log_name(ref, used),
                extra_server_args=extra_server_args,
                device_prefix=device_prefix,
                rpc_server=rpc_server,
                write_reference=write_reference,
                agreement_required=agreement_required,
                console=console,
            )
            report.results.append(result)
            console.info(describe(result, settings))
    console.summary(report.markdown())
    if not report.ok:
        raise ModelCheckFailed(
            report,
            next_step=f"read the log(s) above, fix the patch, rebuild ({build_cmd}) and rerun nox -s spot-check",
        )
    return report


def reference_dir(settings: Settings) -> Path:
    """Where the committed CPU reference fingerprints live: beside the queue."""
    return settings.patch_dir.parent / "reference"


def _check_resolved(
    ref: ModelRef,
    model: Path,
    server_binary: Path,
    *,
    settings: Settings,
    env: Mapping[str, str],
    options: Options,
    log_path: Path,
    extra_server_args: Sequence[str],
    device_prefix: str | None,
    rpc_server: Path | None,
    write_reference: bool,
    console: Console,
    agreement_required: bool = True,
) -> ModelResult:
    """One model: chat + fingerprint (+ device), agreement with the reference, then the RPC run."""
    facts = model_chat_facts(model)
    result = check_model(
        server_binary,
        model,
        ref.label,
        env=env,
        options=options,
        log_path=log_path,
        extra_server_args=(*extra_server_args, *facts.server_args()),
        device_prefix=device_prefix,
        leak_check=ref.kind != "tiny",  # random weights answer random tokens
    )
    result.compute.chat_template = facts.describe()
    if not result.ok or not result.runs:
        return result
    fp = Fingerprint(model=ref.label, model_sha256=file_sha256(model), runs=tuple(result.runs), recorded=_recorded(env))
    result.compute.fingerprint = fp
    refs_dir = reference_dir(settings)
    if write_reference:
        path = reference_path(refs_dir, fp.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_reference(fp), encoding="utf-8")
        console.info(f"{ref.label}: reference fingerprint written to {settings.relative(path)}")
    agreement = agreement_with_reference(fp, refs_dir, options.logprob_tolerance)
    result.compute.agreement = agreement
    if agreement.status == "differs" and agreement_required:
        result.verdict, result.reason = "fail", agreement.describe()
    elif agreement.status == "differs":
        console.info(f"{ref.label}: {agreement.describe()} (reported, not failed: the numbers may move on purpose)")
    elif agreement.status == "no-reference":
        console.info(f"{ref.label}: WARNING: {agreement.describe()} (write it: nox -s spot-check -- --write-reference)")
    if rpc_server is not None and result.ok:
        committed = read_reference(refs_dir, fp.model)
        _check_rpc(
            result,
            ref,
            model,
            server_binary,
            rpc_server,
            env=env,
            options=options,
            log_path=log_path,
            extra_server_args=(*extra_server_args, *facts.server_args()),
            # the RPC server computes on the CPU: the committed CPU reference, else this run's own numbers
            reference=committed if committed is not None and committed.key() == fp.key() else fp,
        )
    return result


def _recorded(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in (("backend", env.get("SKIPPY_BACKEND", "")),) if v}


def _check_rpc(
    result: ModelResult,
    ref: ModelRef,
    model: Path,
    server_binary: Path,
    rpc_server: Path,
    *,
    env: Mapping[str, str],
    options: Options,
    log_path: Path,
    extra_server_args: Sequence[str],
    reference: Fingerprint,
) -> None:
    """The RPC path: an RPC server on loopback, llama-server offloading every layer to it."""
    port = free_port()
    rpc_log = log_path.with_name(log_path.stem + "-rpc-server.log")
    started = time.monotonic()
    with running_server(
        [str(rpc_server), "-H", HOST, "-p", str(port)], env=env, log_path=rpc_log, grace=options.grace
    ) as rpc:
        try:
            wait_for_port(rpc, port, options.load_timeout)
        except ServerFailure as exc:
            result.verdict, result.reason = "fail", f"RPC server: {exc.reason}"
            result.log_lines = rpc.tail()
            return
        offloaded = check_model(
            server_binary,
            model,
            f"{ref.label} over RPC",
            env=env,
            options=options,
            log_path=log_path.with_name(log_path.stem + "-rpc.log"),
            extra_server_args=(*extra_server_args, "--rpc", f"{HOST}:{port}", "-ngl", "99"),
            device_prefix="RPC",
            leak_check=ref.kind != "tiny",
        )
    rpc_fp = Fingerprint(model=reference.model, model_sha256=reference.model_sha256, runs=tuple(offloaded.runs))
    agreement = compare(rpc_fp, reference, tolerance=options.rpc_logprob_tolerance) if offloaded.ok else None
    result.compute.rpc = {
        "ok": offloaded.ok and agreement is not None and agreement.ok,
        "device": offloaded.compute.device,
        "agreement": agreement.as_dict() if agreement else None,
        "reason": offloaded.reason,
        "seconds": round(time.monotonic() - started, 2),
        "log": offloaded.log_path,
    }
    if not offloaded.ok:
        result.verdict, result.reason = "fail", f"over RPC: {offloaded.reason}"
        result.log_lines = offloaded.log_lines
    elif agreement is not None and not agreement.ok:
        result.verdict, result.reason = (
            "fail",
            "over RPC: " + agreement.describe(),
        )


def model_chat_facts(model: Path) -> ChatFacts:
    """The GGUF's chat facts; a file gguf cannot read gets none (the load itself will say why)."""
    try:
        return chat_facts(model)
    except Exception:
        return ChatFacts(architecture=None, has_template=True)


def describe(result: ModelResult, settings: Settings) -> str:
    if result.ok:
        return (
            f"{result.model}: ok: loaded in {_fmt(result.load_seconds)} s, first token "
            f"{_fmt(result.first_token_seconds)} s, {result.tokens} token(s) in "
            f"{_fmt(result.completion_seconds)} s: {result.content!r}"
        )
    log = f" (log: {settings.relative(Path(result.log_path))})" if result.log_path else ""
    return f"{result.model}: FAIL: {result.reason}{log}"


# --- entry point --------------------------------------------------------------


def default_server(settings: Settings, backend: str | None = None) -> Path:
    """The newest llama-server of ``backend`` under build_root; without one, the newest CPU
    build, else the newest of any backend.

    Builds live in ``<build_root>/<backend>-<digest>/bin/`` (see :mod:`skippy.build.builder`).
    """

    def newest(pattern: str) -> Path | None:
        found = sorted(settings.build_root.glob(pattern), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    patterns = [f"{backend or 'cpu'}-*/bin/{SERVER_TARGET}", f"{backend or 'cpu'}/bin/{SERVER_TARGET}"]
    if backend is None:
        patterns.append(f"*/bin/{SERVER_TARGET}")
    for pattern in patterns:
        found = newest(pattern)
        if found is not None:
            return found
    raise SpotCheckFailed(
        f"no {backend + ' ' if backend else ''}{SERVER_TARGET} build under {settings.relative(settings.build_root)}",
        untouched="everything: nothing was started",
        next_step=f"nox -s build-{backend or 'cpu'} (or pass --server PATH)",
    )


def rpc_server_beside(server: Path) -> Path | None:
    """The RPC server built beside ``server`` (``ggml-rpc-server``, or ``rpc-server`` on older trees)."""
    return next((server.parent / name for name in RPC_TARGETS if (server.parent / name).is_file()), None)
