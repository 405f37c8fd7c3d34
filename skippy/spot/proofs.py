"""One model's proofs, made: llama-server started on the model and asked (the chat answer through
the model's own template, the compute fingerprint, the device the layers went to), the fingerprint
held against the committed CPU reference, and the RPC path (the same model offloaded to a freshly
started RPC server).

The server is always stopped (SIGTERM, then SIGKILL after a grace period), also on Ctrl-C and on
failure; its log is scanned for known failure lines even when the HTTP side looked fine.  The run
over a build's models, and the proofs kept from an earlier run, are :mod:`skippy.spot.spotcheck`'s.
"""

from __future__ import annotations

import platform
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from skippy.core.files import sha256_of, write_text_atomic
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot.chat import _BIND_FAILURE, Answer, ask, judge, plan_server_argv, refused_argument, wait_ready
from skippy.spot.compute import ComputeFailure, device_reason, fingerprint_runs, leak_reason
from skippy.spot.fingerprint import (
    Fingerprint,
    compare,
    read_reference,
    reference_path,
    render_reference,
    tolerance_for,
)
from skippy.spot.models import ChatFacts, ModelRef, chat_facts
from skippy.spot.report import ModelResult, Options
from skippy.spot.server import HOST, LOG_TAIL, ServerFailure, free_port, running_server, wait_for_port


def reference_dir(settings: Settings) -> Path:
    """Where the committed CPU reference fingerprints live: beside the queue."""
    return settings.patch_dir.parent / "reference"


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
            result.log_path = str(server.log_path)  # its own: another run's server may hold log_path
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
        unbound = [x for x in log if _BIND_FAILURE.search(x)] if answer is None else []
        if unbound and attempt + 1 < options.bind_attempts:
            continue  # someone took the port between our probe and the bind: try another
        if unbound:
            return _port_taken(result, argv, unbound, options.bind_attempts)
        refused = refused_argument(log) if answer is None else None
        if refused is not None:
            return _argument_refused(result, argv, log, *refused)
        return _judged(result, log, answer, leak_check=leak_check, device_prefix=device_prefix)
    return result  # pragma: no cover - the loop always returns


def _judged(
    result: ModelResult, log: list[str], answer: Answer | None, *, leak_check: bool, device_prefix: str | None
) -> ModelResult:
    """The verdict from the answer and the log: failure lines, a template leak, the device."""
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


def _port_taken(result: ModelResult, argv: Sequence[str], lines: Sequence[str], attempts: int) -> ModelResult:
    """The server could not bind its port: another process holds it (no fault of the build;
    the port is always the check's own: a --server-arg --port is refused before anything runs)."""
    port = result.port
    result.verdict = "fail"
    result.reason = (
        f"port {port} on {HOST} is in use by another process: {Path(argv[0]).name} could not bind it "
        f"({attempts} attempt(s))"
    )
    result.log_lines = list(lines[-LOG_TAIL:])
    result.next_step = (
        f"find what holds {HOST}:{port} (`ss -ltnp 'sport = :{port}'`), stop it, and rerun nox -s spot-check"
    )
    return result


def _argument_refused(
    result: ModelResult, argv: Sequence[str], log: Sequence[str], argument: str, line: str
) -> ModelResult:
    """llama-server refused one of its arguments and exited: its command line is at fault, not
    the model or the build (the command names a --server-arg of the user's; see skippy.cli.spot)."""
    result.verdict = "fail"
    result.refused_argument = argument
    result.reason = f"{Path(argv[0]).name} refused its argument {argument} and exited before it was ready ({line})"
    result.log_lines = list(log[-LOG_TAIL:])
    return result


def check_resolved(
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
    model_sha256: str | None = None,
) -> ModelResult:
    """One model: chat + fingerprint (+ device), agreement with the reference, then the RPC run
    (``model_sha256``: the model's digest when known, else the file is hashed)."""
    facts = model_chat_facts(model)
    server_args = (*extra_server_args, *facts.server_args())
    result = check_model(
        server_binary,
        model,
        ref.label,
        env=env,
        options=options,
        log_path=log_path,
        extra_server_args=server_args,
        device_prefix=device_prefix,
        leak_check=ref.kind != "tiny",  # random weights answer random tokens
    )
    result.compute.chat_template = facts.describe()
    if not result.ok or not result.runs:
        return result
    sha = model_sha256 or sha256_of(model)
    fp = Fingerprint(model=ref.label, model_sha256=sha, runs=tuple(result.runs), recorded=_recorded(env))
    result.compute.fingerprint = fp
    if write_reference:
        _write_reference(fp, settings, console)
    committed = _agreement(
        result, fp, settings, options, on_device=device_prefix is not None, required=agreement_required, console=console
    )
    if rpc_server is not None and result.ok:
        _check_rpc(
            result,
            ref,
            model,
            server_binary,
            rpc_server,
            env=env,
            options=options,
            log_path=log_path,
            extra_server_args=server_args,
            # the committed CPU reference, else (none for this model and request) this run's own numbers
            reference=committed if committed is not None and committed.key() == fp.key() else fp,
        )
    return result


def _write_reference(fp: Fingerprint, settings: Settings, console: Console) -> None:
    """Record ``fp`` as its model's committed reference (``--write-reference``, CPU builds)."""
    path = reference_path(reference_dir(settings), fp.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, render_reference(fp))
    console.info(f"{fp.model}: reference fingerprint written to {settings.relative(path)}")


def _agreement(
    result: ModelResult,
    fp: Fingerprint,
    settings: Settings,
    options: Options,
    *,
    on_device: bool,
    required: bool,
    console: Console,
) -> Fingerprint | None:
    """``fp`` held against the committed CPU reference: a difference fails the model when agreement
    is ``required``, else is reported; a missing reference is warned of.  The committed reference
    (None: there is none)."""
    committed = read_reference(reference_dir(settings), fp.model)
    # a GPU backend's own device, or the CPU on another architecture than the reference's: their
    # tolerance, and greedy tokens may part at a near tie
    tolerance, near_ties = tolerance_for(
        device=options.device_logprob_tolerance,
        arch=options.arch_logprob_tolerance,
        same=options.logprob_tolerance,
        on_device=on_device,
        reference_machine=committed.recorded.get("machine") if committed is not None else None,
        machine=platform.machine(),
    )
    agreement = compare(fp, committed, tolerance=tolerance, near_ties=near_ties)
    result.compute.agreement = agreement
    if agreement.status == "differs" and required:
        result.verdict, result.reason = "fail", agreement.describe()
    elif agreement.status == "differs":
        console.info(f"{fp.model}: {agreement.describe()} (reported, not failed: the numbers may move on purpose)")
    elif agreement.status == "no-reference":
        console.info(f"{fp.model}: WARNING: {agreement.describe()} (write it: nox -s spot-check -- --write-reference)")
    return committed


def _recorded(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in (("backend", env.get("SKIPPY_BACKEND", "")), ("machine", platform.machine())) if v}


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
    agreement = (
        compare(rpc_fp, reference, tolerance=options.rpc_logprob_tolerance, near_ties=True) if offloaded.ok else None
    )
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
    except (OSError, ValueError, KeyError, IndexError, struct.error):  # what gguf's reader raises on a bad file
        return ChatFacts(architecture=None, has_template=True)
