"""``nox -s spot-check`` and ``invoke spot-check``: the spot check's action (run on :mod:`skippy.cli.run`'s path)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from skippy.cli.command import Report
from skippy.cli.options import SpotCheckOptions
from skippy.compile.backends import spec
from skippy.compile.localtree import LOCAL_QUEUE_DIGEST
from skippy.core.errors import ModelCheckFailed, SettingsError, SpotCheckFailed
from skippy.core.paths import is_regular, path_kind
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.queue import workdir as wd
from skippy.spot.binaries import backend_of, default_server, rpc_server_beside
from skippy.spot.provenance import expected_queue_digest
from skippy.spot.report import Ending, Provenance, SpotCheckReport, model_check_failed, model_path, spot_proofs
from skippy.spot.spotcheck import failure_next_step
from skippy.spot.spotcheck import spot_check as run_spot_check


def expected_provenance(settings: Settings, *, workdir_as_is: bool = False) -> Provenance:
    """What the binary must report: the prepared workdir's pin and queue digest (``local``
    for a build of the workdir as it stands, which is accepted only when asked for)."""
    git_dir = wd.git_dir_of(settings.workdir) if settings.workdir.is_dir() else None
    stamp = wd.read_stamp(git_dir) if git_dir is not None else None
    if stamp is None and workdir_as_is:
        return Provenance("unknown", LOCAL_QUEUE_DIGEST)
    if stamp is None:
        raise SpotCheckFailed(
            f"{settings.relative(settings.workdir)} has no prepare stamp: the binary's provenance cannot be checked",
            untouched="everything: no server was started",
            next_step="invoke prepare (then rebuild), or pass --no-provenance to check the binary as it is",
        )
    return Provenance(stamp.upstream_sha, expected_queue_digest(stamp.queue_digest, workdir_as_is=workdir_as_is))


def spot_ending(report: SpotCheckReport, settings: Settings, server: Path) -> Ending:
    """The block a spot check ends with: its proofs and a run line on the model it loaded."""
    proofs = tuple(spot_proofs(report))
    verdict = "every proof made holds" if all(p.verdict != "fail" for p in proofs) else "FAILED"
    found = model_path(report)
    model = settings.relative(Path(found)) if found else "<model.gguf>"
    run = f"run: {settings.relative(server)} --model {model} --port 8080  (then http://127.0.0.1:8080)"
    return Ending(f"spot check of {report.server}: {verdict}", proofs, (run,))


def given_server(text: str, settings: Settings) -> Path:
    """``--server``: an executable regular file (relative to the project's root), checked before anything
    runs (a directory would otherwise reach the process gate as a command that cannot be found)."""
    server = Path(text).expanduser()
    if not server.is_absolute():
        server = settings.root / server
    why = None
    if not is_regular(server):
        kind = path_kind(server)
        why = "does not exist" if kind == "missing" else f"is {kind}, not a llama-server binary"
    elif not os.access(server, os.X_OK):
        why = "is not executable"
    if why is not None:
        raise SettingsError(
            f"--server {text} {why}",
            untouched="everything: no server was started",
            next_step="rerun with --server naming a llama-server binary (build/<backend>-<digest>/bin/llama-server), "
            "or without --server to check the newest build: nox -s spot-check",
        )
    return server


def blame_server_args(report: SpotCheckReport, server_args: Sequence[str], server: Path, settings: Settings) -> None:
    """A model whose llama-server refused one of the user's ``--server-arg`` values: that flag is
    its next step, not the build (the check names the argument; the command knows who gave it)."""
    shown = settings.relative(server)
    # llama.cpp reads --ctx_size as --ctx-size, and names it so
    given = {(a.replace("_", "-") if a.startswith("--") else a): a for a in server_args}
    for result in report.failed:
        argument = given.get(result.refused_argument or "")
        if argument is not None:
            result.next_step = (
                f"rerun without `--server-arg {argument}` or with it corrected: {server.name} does not take it as "
                f"given (`{shown} --help` lists the arguments it takes)"
            )


def spot_failure(
    report: SpotCheckReport, server_args: Sequence[str], server: Path, settings: Settings
) -> ModelCheckFailed:
    """The failure of ``nox -s spot-check``: each model's next step (the user's ``--server-arg`` a
    server refused, or the build), and the block the command ends with."""
    blame_server_args(report, server_args, server, settings)
    return model_check_failed(
        report,
        next_step=failure_next_step(report, f"nox -s build-{backend_of(server, settings)}"),
        ending=spot_ending(report, settings, server),
    )


def spot_check(options: SpotCheckOptions, settings: Settings, console: Console) -> Report:
    """``nox -s spot-check`` / ``invoke spot-check``: the newest build (or --server) on each --model."""
    if options.server:
        server = given_server(options.server, settings)
    else:
        server = default_server(settings, options.backend or None)
        server = server if server.is_absolute() else settings.root / server
    backend = options.backend or backend_of(server, settings)
    s = spec(backend)
    if options.write_reference and backend != "cpu":
        raise SettingsError(
            f"--write-reference records the CPU reference; {settings.relative(server)} is a {backend} build",
            untouched="everything: no server was started, no reference written",
            next_step="nox -s spot-check -- --backend cpu --write-reference",
        )
    if options.no_provenance:
        console.info("WARNING: --no-provenance: the binary is NOT checked against the prepared workdir")
        expect = None
    else:
        expect = expected_provenance(settings, workdir_as_is=options.workdir_as_is)
    report = run_spot_check(
        settings,
        server,
        options.model,
        console=console,
        server_env=s.spot_check_env_for(settings.cache_dir),
        extra_server_args=(*s.spot_check_args, *options.server_arg),
        expect_provenance=expect,
        device_prefix=s.device_prefix,
        rpc_server=None if options.no_rpc else rpc_server_beside(server),
        write_reference=options.write_reference,
        recheck=options.recheck,
        failure=lambda failed: spot_failure(failed, options.server_arg, server, settings),
    )
    return Report(report.as_dict(), ending=spot_ending(report, settings, server))
