"""``nox -s spot-check``: parse its options, run the spot check, render the report."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skippy.build.backends import names, spec
from skippy.build.localtree import LOCAL_QUEUE_DIGEST
from skippy.check.binaries import backend_of, default_server, rpc_server_beside
from skippy.check.provenance import expected_queue_digest
from skippy.check.report import Provenance
from skippy.check.spotcheck import spot_check
from skippy.cli.app import guarded, load
from skippy.cli.options import WORKDIR_AS_IS
from skippy.core.errors import SettingsError, SpotCheckFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console, OptionParser
from skippy.queue import workdir as wd


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OptionParser("nox -s spot-check --", description="A real llama-server on a real model.")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="gemma3-270m (default), tiny:<family>, a .gguf path, or Org/Repo[@rev][:quant]; repeatable",
    )
    parser.add_argument("--server", type=Path, help="llama-server to check (default: the newest build of --backend)")
    parser.add_argument("--backend", choices=names(), help="check this backend's newest build (default: cpu)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra llama-server argument; repeatable")
    parser.add_argument(
        "--no-provenance",
        action="store_true",
        help="do not require the binary to report the workdir's pin and queue digest (said loudly)",
    )
    parser.add_argument(
        WORKDIR_AS_IS.flag,
        action="store_true",
        help="expect a binary built from the workdir as it stands (queue digest local); refused otherwise",
    )
    parser.add_argument(
        "--write-reference",
        action="store_true",
        help="record this CPU build's fingerprints as the committed reference (beside the queue)",
    )
    parser.add_argument("--no-rpc", action="store_true", help="skip the RPC path (the RPC server beside the binary)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse(argv)


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


def main(argv: Sequence[str], *, env: Mapping[str, str], root: Path | None = None) -> int:
    """``nox -s spot-check -- [--model X ...] [--server PATH | --backend NAME] [--json]``: the exit code."""
    # a bad option is a SkippyError too: with --json it still gets its JSON report
    console = Console(env=env, verbose="--verbose" in argv or "-v" in argv)

    def action() -> dict[str, Any]:
        args = parse_args(argv)
        settings = load(root, env, console)
        server = args.server if args.server is not None else default_server(settings, args.backend)
        if not server.is_absolute():
            server = settings.root / server
        backend = args.backend or backend_of(server, settings)
        if args.write_reference and backend != "cpu":
            raise SettingsError(
                f"--write-reference records the CPU reference; {settings.relative(server)} is a {backend} build",
                untouched="everything: no server was started, no reference written",
                next_step="nox -s spot-check -- --backend cpu --write-reference",
            )
        if args.no_provenance:
            console.info("WARNING: --no-provenance: the binary is NOT checked against the prepared workdir")
            expect = None
        else:
            expect = expected_provenance(settings, workdir_as_is=args.workdir_as_is)
        report = spot_check(
            settings,
            server,
            args.model,
            console=console,
            server_env=spec(backend).spot_check_env_for(settings.cache_dir),
            extra_server_args=(*spec(backend).spot_check_args, *args.server_arg),
            expect_provenance=expect,
            device_prefix=spec(backend).device_prefix,
            rpc_server=None if args.no_rpc else rpc_server_beside(server),
            write_reference=args.write_reference,
        )
        return report.as_dict()

    return guarded(action, console=console, as_json="--json" in argv)
