"""How a build ends, shown from real runs: ``--record-build`` records two ``nox -s build-cpu`` runs
(proofs made, then kept) into docs/figures/build-cpu.json, and the ``build-ending`` blocks show each
run's ending with the ending's own code (:meth:`skippy.spot.report.Ending.show`)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from skippy.core.ui import Console
from skippy.spot.report import Ending, shown_time
from tooling.docs.blocks import COMMAND, DocsError

#: the committed record of real ``nox -s build-cpu`` runs: each one's ``--json`` report and ending
BUILD_JSON: Final = "docs/figures/build-cpu.json"
#: the command that records them again (it builds the CPU backend: quick in a warm build dir)
RECORD: Final = f"{COMMAND} --record-build"
#: the runs recorded, in order, with the session's arguments: the proofs made, then the same
#: binaries again (the spot check's proofs kept)
BUILD_RUNS: Final[Mapping[str, tuple[str, ...]]] = {"fresh": ("--recheck",), "kept": ()}

#: one run of the session: its arguments -> (exit code, its ``--json`` report, its ending or None)
SessionRun = Callable[[Sequence[str]], tuple[int, Mapping[str, Any], Ending | None]]


def build_cpu_runner(root: Path, env: Mapping[str, str]) -> SessionRun:
    """``nox -s build-cpu -- ARGS`` as the nox session runs it (:func:`skippy.cli.entries.nox_main`),
    the ending the session showed kept beside its report."""
    from skippy.cli.build import build
    from skippy.cli.command import Report
    from skippy.cli.entries import nox_main
    from skippy.core.settings import Settings

    def one(args: Sequence[str]) -> tuple[int, Mapping[str, Any], Ending | None]:
        endings: list[Ending | None] = []

        def action(options: Any, settings: Settings, console: Console) -> Report:
            report = build(options, settings, console)
            endings.append(report.ending)
            return report

        ran = nox_main("build", args, env, root=root, backend="cpu", action=action)
        return ran.code, ran.report, endings[-1] if endings else None

    return one


def _relative(value: Any, root: Path, home: str | None) -> Any:
    """``value`` with the project's paths relative to it (as the ending shows them), the home folder ``~``."""
    if isinstance(value, str):
        text = value.replace(f"{root}/", "").replace(str(root), ".")
        return text.replace(f"{home}/", "~/") if home else text
    if isinstance(value, Mapping):
        return {k: _relative(v, root, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, root, home) for v in value]
    return value


def record_build(root: Path, run: SessionRun, *, now: str, home: str | None = None) -> dict[str, Any]:
    """The recording of :data:`BUILD_RUNS`, paths relative; DocsError when a run failed or the
    second one kept no proof (nothing is written then)."""
    runs: dict[str, Any] = {}
    for name, args in BUILD_RUNS.items():
        shown = " ".join(("nox -s build-cpu", *(("--", *args) if args else ())))
        code, report, ending = run(args)
        if code != 0 or ending is None or not report.get("ok") or not ending.ok:
            raise DocsError(
                f"`{shown}` failed (exit code {code}); {BUILD_JSON} was left as it was: make the build pass, "
                f"then run `{RECORD}` again"
            )
        kept = [p.name for p in ending.proofs if p.kept_from is not None]
        if (name == "kept") != bool(kept):
            said = "kept no proof" if not kept else f"kept {', '.join(kept)}"
            raise DocsError(f"`{shown}` {said}; {BUILD_JSON} was left as it was: run `{RECORD}` again")
        runs[name] = {"command": shown, "report": report, "ending": ending.as_dict()}
    recording = {"schema": 1, "recorded_by": RECORD, "recorded_at": now, "runs": runs}
    relative: dict[str, Any] = _relative(recording, root, home)
    return relative


def record(root: Path, run: SessionRun, *, now: str, home: str | None = None) -> None:
    """``--record-build``: the runs recorded into :data:`BUILD_JSON` (the blocks are made again after)."""
    recording = record_build(root, run, now=now, home=home)
    (root / BUILD_JSON).write_text(json.dumps(recording, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"recorded {BUILD_JSON}", file=sys.stderr)


def recording(root: Path) -> Mapping[str, Any]:
    """The committed recording; DocsError (with the command that records it) when it cannot be read."""
    path = root / BUILD_JSON
    try:
        found: Mapping[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DocsError(f"{BUILD_JSON}: cannot read the recorded build ({exc}); record it: `{RECORD}`") from exc
    return found


def render_build_ending(recorded_runs: Mapping[str, Any], run: str) -> str:
    """One recorded run's ending as the session showed it (:meth:`Ending.show`, without colour),
    then which run it was and when."""
    recorded = recorded_runs["runs"][run]
    stream = io.StringIO()
    Ending.from_dict(recorded["ending"]).show(Console(env={}, stream=stream))
    when = shown_time(str(recorded_runs["recorded_at"]))
    return (
        f"```text\n{stream.getvalue().rstrip()}\n```\n\n"
        f"(`{recorded['command']}`, recorded {when} by `{recorded_runs['recorded_by']}`)"
    )
