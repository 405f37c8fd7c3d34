"""``nox -s spot-check``: parse its options, run the spot check, render the report."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skippy.check.spotcheck import default_server, spot_check
from skippy.cli.app import guarded, load
from skippy.core.ui import Console, OptionParser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OptionParser("nox -s spot-check --", description="A real llama-server on a real model.")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="gemma3-270m (default), tiny:<family>, a .gguf path, or Org/Repo[@rev][:quant]; repeatable",
    )
    parser.add_argument("--server", type=Path, help="llama-server to check (default: the CPU build)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra llama-server argument; repeatable")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse(argv)


def main(argv: Sequence[str], *, env: Mapping[str, str], root: Path | None = None) -> int:
    """``nox -s spot-check -- [--model X ...] [--server PATH] [--json]``: returns the exit code."""
    # a bad option is a SkippyError too: with --json it still gets its JSON report
    console = Console(env=env, verbose="--verbose" in argv or "-v" in argv)

    def action() -> dict[str, Any]:
        args = parse_args(argv)
        settings = load(root, env)
        server = args.server if args.server is not None else default_server(settings)
        if not server.is_absolute():
            server = settings.root / server
        report = spot_check(
            settings,
            server,
            args.model,
            console=console,
            extra_server_args=args.server_arg,
        )
        return report.as_dict()

    return guarded(action, console=console, as_json="--json" in argv)
