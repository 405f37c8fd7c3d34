"""The model-load spot check: a real llama-server answering a real model.

The check of one build over its models: the binary's ``--version`` read first (a stale binary is
refused before anything starts), a GPU backend's device listed (none listed: the check is not
run), then for each model its proofs, kept from the build dir's proof record when they were made
for the same binaries, model, reference and settings (:mod:`skippy.spot.kept`), else made now
(:mod:`skippy.spot.proofs`: the server started on the model at a free port on 127.0.0.1, polled
until ready, asked for a 5-token chat answer and the fingerprint, and always stopped), and the
verdict with the next step that fits each failure's cause.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from skippy.compile.backends import spec as backend_spec
from skippy.compile.backends.base import SERVER_TARGET
from skippy.core.errors import ModelCheckFailed, SkippyError, SpotCheckFailed
from skippy.core.files import sha256_of
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
from skippy.spot.fingerprint import reference_path
from skippy.spot.kept import PROOFS_NAME, ProofRecord, checker_digest, proof_key
from skippy.spot.models import BUILTIN, ModelRef, model_refs, resolve_model
from skippy.spot.proofs import check_resolved, reference_dir
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

    Per model (:func:`skippy.spot.proofs.check_resolved`): a chat answer through the model's own
    template (no template tokens), a compute fingerprint compared with the committed CPU reference,
    the layers on the backend's device (``device_prefix``), and, with ``rpc_server``, the same model
    offloaded to a freshly started RPC server (layers on the RPC device, same numbers).
    ``write_reference`` records this run's fingerprints as the reference (CPU builds);
    ``agreement_required=False`` reports a difference from it without failing (pin-bump's own build
    of a new upstream, whose numbers may move on purpose).  For a GPU backend, its device must be
    listed first (:func:`_device_listed`).  Proofs already made are kept (:func:`_model`);
    ``recheck`` (and ``write_reference``) makes them again.

    Raises :class:`ModelCheckFailed` (a :class:`SpotCheckFailed`, with the report attached as
    ``.report``) when any model fails, made by ``failure`` when the caller knows its next step and
    ending (default: rebuild with ``nox -s build-<backend>``), and :class:`SpotCheckFailed` when the
    binary's provenance is not the expected one."""
    server_binary = Path(server_binary)
    backend = backend_of(server_binary, settings)
    options = Options.from_settings(settings, backend_spec(backend).spot_check_timeouts)
    env = {**settings.env, **(server_env or {})}
    refs: list[ModelRef] = model_refs(list(models), cwd=settings.root)
    report = _read_binary(settings, server_binary, env, console, backend=backend, expected=expect_provenance)
    if device_prefix is not None and not _device_listed(report, server_binary, env, console, device_prefix):
        return report
    run = _Run.made(
        settings,
        server_binary,
        console,
        backend=backend,
        options=options,
        env=env,
        server_env=server_env or {},
        extra_server_args=tuple(extra_server_args),
        device_prefix=device_prefix,
        rpc_server=rpc_server,
        write_reference=write_reference,
        agreement_required=agreement_required,
        recheck=recheck,
    )
    for ref in refs:
        report.results.append(_model(run, ref))
    _verdict(run, report, failure=failure, build_cmd=f"nox -s build-{backend}")
    return report


def _read_binary(
    settings: Settings,
    server_binary: Path,
    env: Mapping[str, str],
    console: Console,
    *,
    backend: str,
    expected: Provenance | None,
) -> SpotCheckReport:
    """The report begun with the binary's ``--version`` (read again on every run: milliseconds);
    a binary whose provenance is not ``expected`` is stale: refused before any server starts."""
    version_text = read_version(server_binary, env, console)
    report = SpotCheckReport(
        server=settings.relative(server_binary),
        version=version_line(version_text),
        provenance=parse_provenance(version_text),
        expected=expected,
    )
    if expected is not None:
        why = provenance_mismatch(expected, report.provenance)
        if why is not None:
            raise SpotCheckFailed(
                f"stale llama-server {settings.relative(server_binary)}: {why}",
                untouched="everything: the server was not started",
                next_step=stale_next_step(
                    expected.queue_digest,
                    report.provenance.queue_digest if report.provenance else None,
                    backend,
                ),
                details=version_text,
            )
    return report


def _device_listed(
    report: SpotCheckReport, server_binary: Path, env: Mapping[str, str], console: Console, device_prefix: str
) -> bool:
    """Whether ``llama-server --list-devices`` lists one of the GPU backend's devices.  Where none
    is listed (no GPU on this machine) no model is checked and the report's ``not_run`` says why
    (the build's artifact gate is then the proof that was made)."""
    listing = list_devices(server_binary, env, console)
    report.devices = listing.devices
    report.not_run = no_device_reason(listing, device_prefix)
    if report.not_run is not None:
        console.warn(f"spot check not run: {report.not_run}")
        console.summary(report.markdown())
        return False
    console.info(f"devices: {', '.join(report.devices)}")
    return True


def _verdict(
    run: _Run,
    report: SpotCheckReport,
    *,
    failure: Callable[[SpotCheckReport], ModelCheckFailed] | None,
    build_cmd: str,
) -> None:
    """Keep the proofs made, show the report, and raise when a model failed."""
    _save(run.record, run.binaries[SERVER_TARGET], run.settings, run.console)
    run.console.summary(report.markdown())
    if not report.ok:
        raise failure(report) if failure else model_check_failed(report, next_step=failure_next_step(report, build_cmd))


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
    #: the build dir's kept proofs; the digests of the binaries the check runs
    record: ProofRecord
    binaries: Mapping[str, str]
    #: the settings every model's proof depends on, besides the binaries
    checked: Mapping[str, object]
    recheck: bool
    #: the log file names given so far
    used: set[str] = field(default_factory=set)

    @property
    def depends(self) -> dict[str, object]:
        """What every model's proof depends on: the binaries and the settings."""
        return {"binaries": self.binaries, "settings": self.checked}

    @classmethod
    def made(
        cls,
        settings: Settings,
        server_binary: Path,
        console: Console,
        *,
        backend: str,
        options: Options,
        env: Mapping[str, str],
        server_env: Mapping[str, str],
        extra_server_args: tuple[str, ...],
        device_prefix: str | None,
        rpc_server: Path | None,
        write_reference: bool,
        agreement_required: bool,
        recheck: bool,
    ) -> _Run:
        """The run of ``server_binary``'s check, with its build dir's proof record."""
        build_dir = build_dir_of(server_binary, settings)
        record = ProofRecord.load(build_dir / PROOFS_NAME if build_dir is not None else None)
        checked = {
            "backend": backend,
            "machine": platform.machine(),
            "server_env": dict(server_env),
            "server_args": list(extra_server_args),
            "device": device_prefix,
            "rpc": rpc_server is not None,
            "agreement_required": agreement_required,
            "options": asdict(options),
            "checker": checker_digest(),
        }
        return cls(
            settings=settings,
            server_binary=server_binary,
            env=env,
            options=options,
            logs=log_dir(settings, server_binary),
            extra_server_args=extra_server_args,
            device_prefix=device_prefix,
            rpc_server=rpc_server,
            write_reference=write_reference,
            agreement_required=agreement_required,
            console=console,
            record=record,
            binaries=_binary_digests(record, server_binary, rpc_server),
            checked=checked,
            recheck=recheck,
        )


def _model(run: _Run, ref: ModelRef) -> ModelResult:
    """One model's result: kept from the record when its proof was made for the same binaries,
    model, reference and settings (shown with the time it was made; no server is started for it),
    else checked now (and kept when it passed)."""
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
        result = check_resolved(
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


def describe(result: ModelResult, settings: Settings) -> str:
    if result.ok:
        return (
            f"{result.model}: ok: loaded in {_fmt(result.load_seconds)} s, first token "
            f"{_fmt(result.first_token_seconds)} s, {result.tokens} token(s) in "
            f"{_fmt(result.completion_seconds)} s: {result.content!r}"
        )
    log = f" (log: {settings.relative(Path(result.log_path))})" if result.log_path else ""
    return f"{result.model}: FAIL: {result.reason}{log}"
