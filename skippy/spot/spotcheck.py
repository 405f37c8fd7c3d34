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

import platform
import re
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from skippy.compile.backends import spec as backend_spec
from skippy.compile.backends.base import SERVER_TARGET
from skippy.core.errors import ModelCheckFailed, SkippyError, SpotCheckFailed
from skippy.core.files import sha256_of, write_text_atomic
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.spot import kept
from skippy.spot.binaries import (
    backend_of,
    build_dir_of,
    list_devices,
    no_device_reason,
    parse_provenance,
    provenance_mismatch,
    read_version,
    version_line,
)
from skippy.spot.chat import _BIND_FAILURE, Answer, ask, judge, plan_server_argv, refused_argument, wait_ready
from skippy.spot.compute import (
    ComputeFailure,
    device_reason,
    fingerprint_runs,
    leak_reason,
)
from skippy.spot.fingerprint import (
    Fingerprint,
    compare,
    read_reference,
    reference_path,
    render_reference,
    tolerance_for,
)
from skippy.spot.kept import PROOFS_NAME, ProofRecord, checker_digest, proof_key
from skippy.spot.models import BUILTIN, ChatFacts, ModelRef, chat_facts, model_refs, resolve_model
from skippy.spot.provenance import stale_next_step
from skippy.spot.report import (
    ModelResult,
    Options,
    Provenance,
    SpotCheckReport,
    _fmt,
    model_check_failed,
    shown_time,
)
from skippy.spot.server import (
    HOST,
    LOG_TAIL,
    ServerFailure,
    free_port,
    running_server,
    wait_for_port,
)

# --- pure parts -------------------------------------------------------------


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


def failure_next_step(report: SpotCheckReport, build_cmd: str) -> str:
    """The next step of a failed spot check, fitting each failure's cause: a failure with a way
    out of its own (a port taken, a model not found) gives that; the rest point at the build."""
    steps: list[str] = []
    for result in report.failed:
        if result.next_step and result.next_step not in steps:
            steps.append(f"{result.model}: {result.next_step}" if len(report.failed) > 1 else result.next_step)
    if any(not r.next_step for r in report.failed):
        steps.append(f"read the log(s) above, fix the patch, rebuild ({build_cmd}) and rerun nox -s spot-check")
    return "; ".join(steps)


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
    recheck: bool = False,
    failure: Callable[[SpotCheckReport], ModelCheckFailed] | None = None,
) -> SpotCheckReport:
    """Spot-check ``server_binary`` on each model (the default model when none is given).

    Per model: a chat answer through the model's own template (no template tokens), a
    compute fingerprint compared with the committed CPU reference, the layers on the
    backend's device (``device_prefix``), and, with ``rpc_server``, the same model
    offloaded to a freshly started RPC server (layers on the RPC device, same numbers).
    ``write_reference`` records this run's fingerprints as the reference (CPU builds);
    ``agreement_required=False`` reports a difference from it without failing (pin-bump's
    own build of a new upstream, whose numbers may move on purpose).  For a GPU backend
    (``device_prefix``), ``llama-server --list-devices`` must list one of its devices first;
    where none is listed (no GPU on this machine) no model is checked and the report's
    ``not_run`` says why (the build's artifact gate is then the proof that was made).

    A model's proofs already made for the same binaries, model, reference and settings are kept
    from the build dir's proof record, with the time they were made, and no server is started
    for it (:mod:`skippy.spot.kept`); ``recheck`` (and ``write_reference``) makes them again.
    The binary's provenance is read again on every run (``--version``: milliseconds).

    Raises :class:`ModelCheckFailed` (a :class:`SpotCheckFailed`, with the
    report attached as ``.report``) when any model fails, made by ``failure`` when the caller
    knows its next step and ending (default: rebuild with ``nox -s build-<backend>``), and
    :class:`SpotCheckFailed` when the binary's provenance is not the expected one.
    """
    server_binary = Path(server_binary)
    backend = backend_of(server_binary, settings)
    options = Options.from_settings(settings, backend_spec(backend).spot_check_timeouts)
    env = {**settings.env, **(server_env or {})}
    build_cmd = f"nox -s build-{backend}"
    refs: list[ModelRef] = model_refs(list(models), cwd=settings.root)
    version_text = read_version(server_binary, env, console)
    report = SpotCheckReport(
        server=settings.relative(server_binary),
        version=version_line(version_text),
        provenance=parse_provenance(version_text),
        expected=expect_provenance,
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
                    backend,
                ),
                details=version_text,
            )
    if device_prefix is not None:
        listing = list_devices(server_binary, env, console)
        report.devices = listing.devices
        report.not_run = no_device_reason(listing, device_prefix)
        if report.not_run is not None:
            console.warn(f"spot check not run: {report.not_run}")
            console.summary(report.markdown())
            return report
        console.info(f"devices: {', '.join(report.devices)}")
    build_dir = build_dir_of(server_binary, settings)
    record = ProofRecord.load(build_dir / PROOFS_NAME if build_dir is not None else None)
    binaries = _binary_digests(record, server_binary, rpc_server)
    run = _Run(
        settings=settings,
        server_binary=server_binary,
        env=env,
        options=options,
        logs=log_dir(settings, server_binary),
        extra_server_args=tuple(extra_server_args),
        device_prefix=device_prefix,
        rpc_server=rpc_server,
        write_reference=write_reference,
        agreement_required=agreement_required,
        console=console,
        record=record,
        depends={
            "binaries": binaries,
            "settings": {
                "backend": backend,
                "machine": platform.machine(),
                "server_env": dict(server_env or {}),
                "server_args": list(extra_server_args),
                "device": device_prefix,
                "rpc": rpc_server is not None,
                "agreement_required": agreement_required,
                "options": asdict(options),
                "checker": checker_digest(),
            },
        },
        recheck=recheck,
    )
    for ref in refs:
        report.results.append(_model(run, ref))
    _save(record, binaries[SERVER_TARGET], settings, console)
    console.summary(report.markdown())
    if not report.ok:
        raise failure(report) if failure else model_check_failed(report, next_step=failure_next_step(report, build_cmd))
    return report


@dataclass(frozen=True)
class _Run:
    """What every model of one spot check is checked with."""

    settings: Settings
    server_binary: Path
    env: Mapping[str, str]
    options: Options
    logs: Path
    extra_server_args: tuple[str, ...]
    device_prefix: str | None
    rpc_server: Path | None
    write_reference: bool
    agreement_required: bool
    console: Console
    #: the build dir's kept proofs, and what every model's proof depends on (binaries, settings)
    record: ProofRecord
    depends: Mapping[str, object]
    recheck: bool
    #: the log file names given so far
    used: set[str] = field(default_factory=set)


def _model(run: _Run, ref: ModelRef) -> ModelResult:
    """One model's result: kept from the record when its proof was made for the same binaries,
    model, reference and settings, else checked now (and kept when it passed)."""
    console = run.console
    try:
        resolved = resolve_model(ref, run.settings, console)
    except SkippyError as exc:
        result = ModelResult(model=ref.label, path=None, reason=exc.what, next_step=exc.next_step)
        if exc.next_step:
            result.reason += f" (next: {exc.next_step})"
        console.info(f"{ref.label}: FAIL: {result.reason}")
        return result
    model_sha256 = _model_digest(run.record, ref, resolved.path)
    key = proof_key({**run.depends, "model": ref.label, "model_sha256": model_sha256, **_reference(run.settings, ref)})
    entry = None if run.recheck or run.write_reference else run.record.kept(key)
    if entry is not None:
        result = ModelResult.from_dict(entry["result"])
        result.kept_from = str(entry["when"])
        console.info(
            f"{ref.label}: kept from {shown_time(result.kept_from)}: passed then for the same binaries, model, "
            "reference and settings (--recheck makes it again)"
        )
        return result
    with console.step(f"spot check {ref.label}"):
        result = _check_resolved(
            ref,
            resolved.path,
            run.server_binary,
            settings=run.settings,
            env=run.env,
            options=run.options,
            log_path=run.logs / _log_name(ref, run.used),
            extra_server_args=run.extra_server_args,
            device_prefix=run.device_prefix,
            rpc_server=run.rpc_server,
            write_reference=run.write_reference,
            agreement_required=run.agreement_required,
            console=console,
            model_sha256=model_sha256,
        )
        console.info(describe(result, run.settings))
    if result.ok and not run.write_reference:
        server = run.record.digest(run.server_binary)
        run.record.keep(key, what=ref.label, server=server, result=result.as_dict(), when=kept.now())
    else:
        run.record.drop(key)  # a failed proof is never kept, nor the one a failed recheck made before
    return result


def _binary_digests(record: ProofRecord, server: Path, rpc_server: Path | None) -> dict[str, str]:
    """The digests of what the check runs: llama-server, the RPC server, the shared libraries
    beside llama-server (a build with shared libraries loads them from there)."""
    found = {SERVER_TARGET: record.digest(server)}
    if rpc_server is not None:
        found[rpc_server.name] = record.digest(rpc_server)
    for lib in sorted(server.parent.glob("*.so*")):
        if lib.is_file():
            found[lib.name] = record.digest(lib)
    return found


def _model_digest(record: ProofRecord, ref: ModelRef, path: Path) -> str:
    """The model file's sha256: the published one of the packaged model (its stamp was checked
    when it was fetched), else the record's cached digest (hashed once per file version)."""
    if ref.kind == "builtin" and ref.name in BUILTIN:
        return BUILTIN[ref.name].sha256
    return record.digest(path)


def _reference(settings: Settings, ref: ModelRef) -> dict[str, str | None]:
    """The committed reference fingerprint of ``ref`` (its file's digest; None: there is none)."""
    path = reference_path(reference_dir(settings), ref.label)
    return {"reference_sha256": sha256_of(path) if path.is_file() else None}


def _save(record: ProofRecord, server: str, settings: Settings, console: Console) -> None:
    """Write the proof record; a build dir that cannot be written keeps nothing (said, not failed)."""
    try:
        record.save(server)
    except OSError as exc:
        where = settings.relative(record.path) if record.path is not None else "the proof record"
        console.warn(f"the proofs made were not kept ({where}: {exc.strerror or exc}); the next run makes them again")


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
    model_sha256: str | None = None,
) -> ModelResult:
    """One model: chat + fingerprint (+ device), agreement with the reference, then the RPC run
    (``model_sha256``: the model's digest when known, else the file is hashed)."""
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
    sha = model_sha256 or sha256_of(model)
    fp = Fingerprint(model=ref.label, model_sha256=sha, runs=tuple(result.runs), recorded=_recorded(env))
    result.compute.fingerprint = fp
    refs_dir = reference_dir(settings)
    if write_reference:
        path = reference_path(refs_dir, fp.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, render_reference(fp))
        console.info(f"{ref.label}: reference fingerprint written to {settings.relative(path)}")
    # a GPU backend's own device, or the CPU on another architecture than the reference's: their
    # tolerance, and greedy tokens may part at a near tie
    committed = read_reference(refs_dir, fp.model)
    tolerance, near_ties = tolerance_for(
        device=options.device_logprob_tolerance,
        arch=options.arch_logprob_tolerance,
        same=options.logprob_tolerance,
        on_device=device_prefix is not None,
        reference_machine=committed.recorded.get("machine") if committed is not None else None,
        machine=platform.machine(),
    )
    agreement = compare(fp, committed, tolerance=tolerance, near_ties=near_ties)
    result.compute.agreement = agreement
    if agreement.status == "differs" and agreement_required:
        result.verdict, result.reason = "fail", agreement.describe()
    elif agreement.status == "differs":
        console.info(f"{ref.label}: {agreement.describe()} (reported, not failed: the numbers may move on purpose)")
    elif agreement.status == "no-reference":
        console.info(f"{ref.label}: WARNING: {agreement.describe()} (write it: nox -s spot-check -- --write-reference)")
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
            extra_server_args=(*extra_server_args, *facts.server_args()),
            # the committed CPU reference, else (none for this model and request) this run's own numbers
            reference=committed if committed is not None and committed.key() == fp.key() else fp,
        )
    return result


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
