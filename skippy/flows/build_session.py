"""A build session: probe the toolchain, prepare the pinned tree, plan, build, spot-check.

What ``nox -s build-<backend>`` (and ``invoke pin-bump``) run: the one place where
the queue (prepare), the build and the spot check meet.  With ``--workdir-as-is``
the workdir is built as it stands instead of prepared (:class:`LocalTree`).  The
options of a session are parsed by the command line from the option table, and the
outcome rendered there (:func:`skippy.cli.build.build_main`).  The spot check follows the change:
it also loads the tiny model of each model family the change touches, and a passed check is
recorded as the next session's baseline (:mod:`skippy.flows.follow`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, Protocol

from skippy.compile.backends import parse_backend, reference_backend, spec
from skippy.compile.backends.base import SERVER_TARGET, Backend
from skippy.compile.builder import KEEP_LOCAL_BUILDS, BuildReport, execute_plan, prune_local_builds
from skippy.compile.localtree import LOCAL_QUEUE_DIGEST, WorkdirState, read_workdir_state
from skippy.compile.plan import PROVENANCE_DEFINES, BuildOptions, BuildPlan, plan_build, requested_defines
from skippy.compile.rootfs import Rootfs, mounted
from skippy.compile.toolchain import Toolchain, check_tree_needs, inspect_tree, probe_toolchain
from skippy.core import proc
from skippy.core.errors import BuildError, CommandError, ModelCheckFailed, ToolchainMissing, UpstreamTestsFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows import follow
from skippy.flows.follow import Following
from skippy.flows.upstream_tests.report import UpstreamTestsReport
from skippy.flows.upstream_tests.run import run_backend_ops, run_upstream_tests
from skippy.flows.upstream_tests.tree import Subject
from skippy.spot.binaries import version_line
from skippy.spot.evidence import artifact_markers_missing
from skippy.spot.report import Ending, Proof, SpotCheckReport, model_check_failed, model_path, spot_proofs


@dataclass(frozen=True)
class SessionArgs:
    """What a build session is asked to do (the command line's typed options, :mod:`skippy.cli.build`)."""

    #: a backend this host cannot build is skipped instead of failing (--skip-unavailable)
    skip_unavailable: bool = False
    spot_check: bool = True
    jobs: int | None = None
    #: the -D arguments, normalized to ``-DNAME[:TYPE]=VALUE``: the only ones that reach CMake
    cmake_args: tuple[str, ...] = ()
    #: build the workdir as it stands (no prepare, a build dir of its own, queue digest "local")
    workdir_as_is: bool = False
    #: then build and run upstream's tests (skippy.flows.upstream_tests)
    upstream_tests: bool = False
    #: the spot check's models (none: its default model)
    models: tuple[str, ...] = ()
    #: make the spot check's proofs again, even those kept for the same binaries, model, reference and settings
    recheck: bool = False


@dataclass(frozen=True)
class LocalTree:
    """The workdir as it stands (``--workdir-as-is``): a local, unregistered tree."""

    workdir: Path
    state: WorkdirState
    #: the upstream the workdir was prepared from (its prepare stamp), or "unknown"
    upstream_sha: str
    queue_digest: str = LOCAL_QUEUE_DIGEST

    @property
    def patched_sha(self) -> str:
        return self.state.head

    def as_dict(self) -> dict[str, object]:
        return {
            "workdir": str(self.workdir),
            "head": self.state.head,
            "state": self.state.key,
            "changed": list(self.state.changed),
            "upstream_sha": self.upstream_sha,
            "queue_digest": self.queue_digest,
        }


def _refuse_conflict_markers(settings: Settings, backend: str) -> None:
    """A tree with conflict markers cannot compile: say which files before configuring anything."""
    from skippy.core.git import Repo
    from skippy.queue.workdir import conflict_markers

    rel = settings.relative(settings.workdir)
    files = sorted(conflict_markers(Repo(settings.workdir, settings.env), "HEAD"))  # the work tree vs HEAD
    if files:
        raise BuildError(
            f"--workdir-as-is: {len(files)} file(s) of {rel} still hold conflict markers: {', '.join(files)}",
            untouched="everything: nothing was configured or built",
            next_step=f"resolve them (edit, then `git -C {rel} add {' '.join(files)}`), then "
            f"`nox -s build-{backend} -- --workdir-as-is` again (in a stopped conflict session, "
            "`invoke prepare --continue` finishes it)",
        )


def local_tree(settings: Settings, console: Console, backend: str | None = None) -> LocalTree:
    """Read the workdir's state, touching nothing (no prepare, read-only git)."""
    from skippy.queue import workdir as wd

    backend = backend or reference_backend()
    workdir = settings.workdir
    if not workdir.is_dir():
        raise BuildError(
            f"--workdir-as-is: the workdir {settings.relative(workdir)} does not exist",
            untouched="everything: nothing was prepared, configured or built",
            next_step="invoke prepare, then edit or commit in the workdir and build it with --workdir-as-is",
        )
    git_dir = wd.git_dir_of(workdir)
    stamp = wd.read_stamp(git_dir) if git_dir else None
    _refuse_conflict_markers(settings, backend)
    state = read_workdir_state(
        workdir, settings.env, skip=lambda path: wd.is_tolerated(path, settings.tolerated_untracked)
    )
    console.info(
        f"building {settings.relative(workdir)} AS IT STANDS (--workdir-as-is): HEAD {state.head[:12]}, "
        f"{len(state.changed)} uncommitted file(s); a local, unregistered tree (queue digest "
        f"{LOCAL_QUEUE_DIGEST!r}); nothing is prepared or touched"
    )
    return LocalTree(workdir=workdir, state=state, upstream_sha=stamp.upstream_sha if stamp else "unknown")


@dataclass(frozen=True)
class SessionOutcome:
    backend: Backend
    #: set when the backend cannot build here and the user asked to skip it
    skipped: str | None = None
    build: BuildReport | None = None
    patched_sha: str | None = None
    #: the spot check's report (None without a spot check)
    spot: object | None = None
    #: set when the workdir was built as it stands (--workdir-as-is)
    local: LocalTree | None = None
    #: upstream's tests on the tree (None unless asked for)
    upstream: UpstreamTestsReport | None = None
    #: what the build itself proved (the artifact gate, the root's gate), before any spot check
    proofs: tuple[Proof, ...] = ()
    #: why the spot check did not run, when it did not
    spot_not_run: str | None = None
    #: the root file system the binaries must run in (None: this host)
    rootfs: Rootfs | None = None
    #: the model families the change touches, checked with their tiny models (None: no spot check
    #: on this host)
    following: Following | None = None


class _Prepared(Protocol):
    @property
    def patched_sha(self) -> str: ...

    @property
    def upstream_sha(self) -> str: ...

    @property
    def queue_digest(self) -> str: ...

    @property
    def workdir(self) -> Path: ...


PrepareFn = Callable[[Settings, Console], _Prepared]


@dataclass(frozen=True)
class SpotCheckRequest:
    """What a build session asks of the spot check for the build it made."""

    server_binary: Path
    #: the backend's spot-check environment and llama-server arguments
    server_env: Mapping[str, str]
    extra_server_args: tuple[str, ...]
    #: (upstream SHA, queue digest) the binary must report; None when the build carries no provenance
    expect: tuple[str, str] | None = None
    #: the device the layers must go to (``Vulkan``, ``CUDA``); None for the CPU
    device_prefix: str | None = None
    #: the RPC server built beside it (the RPC path is checked when given)
    rpc_server: Path | None = None
    #: False: a difference from the CPU reference is reported, not failed (pin-bump's new upstream)
    agreement_required: bool = True
    #: the models to check (none: the spot check's default model)
    models: tuple[str, ...] = field(default=())
    #: make every proof again (none kept from an earlier run)
    recheck: bool = False
    #: the failure of a check where a model failed: the session's next step and ending (the spot
    #: check's own when None)
    failure: Callable[[SpotCheckReport], ModelCheckFailed] | None = None


class SpotCheckFn(Protocol):
    def __call__(self, settings: Settings, request: SpotCheckRequest, console: Console) -> object: ...


def _pinned_prepare(backend: Backend) -> PrepareFn:
    """The session's own prepare of the pinned tree: its refusal of local work names this backend's
    build of the workdir as it stands."""

    def prepare_pinned(settings: Settings, console: Console) -> _Prepared:
        from skippy.queue.prepare import Target, prepare

        return prepare(
            settings, Target.pinned(), console=console, as_is_build=f"nox -s build-{backend} -- --workdir-as-is"
        )

    return prepare_pinned


def _default_spot_check(settings: Settings, request: SpotCheckRequest, console: Console) -> object:
    from skippy.spot.report import Provenance
    from skippy.spot.spotcheck import spot_check

    return spot_check(
        settings,
        server_binary=request.server_binary,
        models=request.models,
        console=console,
        server_env=request.server_env,
        extra_server_args=request.extra_server_args,
        expect_provenance=Provenance(*request.expect) if request.expect else None,
        device_prefix=request.device_prefix,
        rpc_server=request.rpc_server,
        agreement_required=request.agreement_required,
        recheck=request.recheck,
        failure=request.failure,
    )


def _upstream_count(settings: Settings, prepared: _Prepared) -> int | None:
    """How many commits the upstream base has (llama.cpp's build number), or None."""
    from skippy.core.git import Repo
    from skippy.queue import workdir as wd

    git_dir = wd.git_dir_of(prepared.workdir)
    stamp = wd.read_stamp(git_dir) if git_dir else None
    if stamp is None:
        return None
    try:
        return Repo(prepared.workdir, settings.env).commit_count(stamp.base_commit)
    except (CommandError, ValueError):
        return None


def artifact_gate(backend: Backend, plan: BuildPlan, report: BuildReport, console: Console) -> Proof:
    """The binary must contain its backend: a build that fell back to CPU (an ignored CMake
    switch) lacks the backend's registration symbol.  Runs with and without the spot check."""
    server = report.binaries[SERVER_TARGET]
    markers = spec(backend).artifact_markers
    missing = artifact_markers_missing(server, markers)
    if missing:
        switches = ", ".join(f"{d.name}={d.value}" for d in plan.defines if d.name.startswith("GGML_"))
        raise BuildError(
            f"{server.name} does not contain the {backend} backend: {', '.join(missing)} not in the binary",
            untouched=f"the source tree; the build is kept in {plan.build_dir}",
            next_step=f"check CMakeCache.txt in {plan.build_dir} (the switches set were: {switches}) "
            "and the configure log for an ignored or failed backend",
        )
    found = f"{server.name} contains its backend ({', '.join(markers)})"
    console.info(f"{backend}: {found}")
    return Proof("artifact gate", "pass", found)


def rootfs_spot_check(plan: BuildPlan) -> str:
    """Why a build made inside a root file system is not spot-checked on the host."""
    inside = plan.rootfs
    label = f" ({inside.label})" if inside is not None else ""
    return (
        f"the binaries were built inside a root file system{label} and link its libraries "
        f"({spec(plan.backend).root_links}), so they run there, not on this host; the artifact gate (the backend's "
        "symbols, and --version run inside the root) is the proof that was made"
    )


def rootfs_gate(plan: BuildPlan, report: BuildReport, env: Mapping[str, str], console: Console) -> str:
    """A binary built inside a root file system links the root's libraries: ``llama-server
    --version`` must run there (the build dir bound in, as for the build).  Returns its
    backend's start-up line (``BackendSpec.rootfs_gate_line``: for ROCm ``ggml_cuda_init: failed to
    initialize ROCm: ...`` without a GPU)."""
    inside = plan.rootfs
    assert inside is not None
    server = report.binaries[SERVER_TARGET]
    with mounted(inside, (plan.build_dir,), env=env, log=console.warn):
        result = proc.run([*plan.runner, str(server), "--version"], env=env, check=False, timeout=120)
    text = result.stdout + "\n" + result.stderr
    version = version_line(text)
    if not result.ok or version is None:
        raise BuildError(
            f"{server.name} does not run inside {inside.label} (`{server.name} --version` exit code "
            f"{result.returncode})",
            untouched=f"the source tree; the build is kept in {plan.build_dir}",
            next_step=f"run it by hand: {' '.join(plan.runner)} {server} --version"
            + ("" if inside.namespace else " (with /proc, /dev and the build dir mounted in the root)")
            + " and read what it says",
            details=result.tail(),
        )
    mark = spec(plan.backend).rootfs_gate_line
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if mark is None:
        init = lines[0] if lines else "no output"
    else:
        init = next((line for line in lines if mark in line), f"no {mark} line")
    console.info(f"{plan.backend}: {server.name} --version runs inside the root ({version}): {init}")
    return init


def where(
    report: BuildReport, settings: Settings, inside: Rootfs | None = None, model: str | None = None
) -> tuple[str, ...]:
    """Where the binaries are, and one line to run them (also in ``invoke status --json``) on
    ``model`` (the model file the spot check loaded; a placeholder without one); binaries built
    ``inside`` a root file system run only there, and the line says how."""
    server = report.binaries[SERVER_TARGET]
    lines = [f"{name}: {settings.relative(path)}" for name, path in report.binaries.items()]
    given = model or "<model.gguf>"
    if inside is not None and inside.namespace:
        return (
            *lines,
            f"run: inside the root only (they link its libraries): {' '.join(inside.prefix)} {server} "
            f"--model {given} --port 8080 (the model's folder bound in too: --ro-bind DIR DIR before the --)",
        )
    if inside is not None:
        return (
            *lines,
            f"run: inside the root only (they link its libraries): {inside.program} {inside.path} {server} "
            f"--model {given} --port 8080, with /proc, /dev and {report.build_dir} mounted there",
        )
    lines.append(f"run: {settings.relative(server)} --model {given} --port 8080  (then http://127.0.0.1:8080)")
    rpc = next((p for n, p in report.binaries.items() if n != SERVER_TARGET), None)
    if rpc is not None:
        lines.append(
            f"rpc: {settings.relative(rpc)} -H 127.0.0.1 -p 50052  (llama-server --rpc 127.0.0.1:50052 -ngl 99)"
        )
    return tuple(lines)


def _gates(plan: BuildPlan, report: BuildReport, settings: Settings, console: Console, *, local: bool) -> list[Proof]:
    """After a build: the artifact gate (and the root's), older local build dirs pruned."""
    proofs = [artifact_gate(plan.backend, plan, report, console)]
    if plan.rootfs is not None:
        init = rootfs_gate(plan, report, settings.env, console)
        proofs.append(Proof("runs in the root", "pass", f"llama-server --version runs inside the root: {init}"))
    if local:
        removed = prune_local_builds(report.build_dir)
        if removed:
            console.info(
                f"removed {len(removed)} older build dir(s) of the workdir as it stood "
                f"({', '.join(p.name for p in removed)}); the newest {KEEP_LOCAL_BUILDS} are kept"
            )
    return proofs


def _spot_check(
    b: Backend,
    settings: Settings,
    console: Console,
    *,
    args: SessionArgs,
    plan: BuildPlan,
    report: BuildReport,
    prepared: _Prepared,
    proofs: tuple[Proof, ...],
    spot_check_fn: SpotCheckFn,
    numerics_must_match: bool,
    following: Following | None,
) -> tuple[object | None, str | None]:
    """The spot check of the build (its report), or why it did not run; it also checks the
    families the change touches (``following``)."""
    spot = None
    not_run = None if args.spot_check else "--no-spot-check"
    if args.spot_check and plan.rootfs is not None:
        not_run = rootfs_spot_check(plan)
        console.warn(f"spot check not run: {not_run}")
    elif args.spot_check:

        def failure(spot: SpotCheckReport) -> ModelCheckFailed:
            """The failure ends with the same block: what the build proved, what the spot check did not."""
            from skippy.spot.spotcheck import failure_next_step

            failed = SessionOutcome(
                b, build=report, patched_sha=prepared.patched_sha, spot=spot, proofs=proofs, following=following
            )
            next_step = failure_next_step(spot, f"nox -s build-{b}")
            return model_check_failed(spot, next_step=next_step, ending=session_ending(failed, settings))

        request = SpotCheckRequest(
            server_binary=report.binaries[SERVER_TARGET],
            server_env=plan.spot_check_env,
            extra_server_args=tuple(plan.spot_check_args),
            # a binary that does not report this build's provenance is stale: refuse it
            expect=(prepared.upstream_sha, prepared.queue_digest) if plan.define(PROVENANCE_DEFINES[0]) else None,
            device_prefix=spec(b).device_prefix,
            rpc_server=next((path for name, path in report.binaries.items() if name != SERVER_TARGET), None),
            agreement_required=numerics_must_match,
            models=following.models(args.models) if following is not None else args.models,
            recheck=args.recheck,
            failure=failure,
        )
        spot = spot_check_fn(settings, request, console)
    return spot, not_run


def _follow(
    args: SessionArgs, plan: BuildPlan, prepared: _Prepared, settings: Settings, console: Console, *, as_is: bool
) -> Following | None:
    """The model families the change touches (:mod:`skippy.flows.follow`), said before the build;
    None when no spot check runs on this host."""
    if not args.spot_check or plan.rootfs is not None:
        return None
    following = follow.follow_change(
        settings,
        str(plan.backend),
        prepared.workdir,
        patched_sha=prepared.patched_sha,
        upstream_sha=prepared.upstream_sha,
        as_is=as_is,
    )
    follow.announce(following, console)
    return following


def _certify(b: Backend, prepared: _Prepared, spot: SpotCheckReport, settings: Settings, console: Console) -> None:
    """A passed spot check of the prepared tree: the baseline of the next session of this backend."""
    recorded = follow.certify(
        settings,
        str(b),
        prepared.workdir,
        patched_sha=prepared.patched_sha,
        upstream_sha=prepared.upstream_sha,
        queue_digest=prepared.queue_digest,
        spot=spot,
    )
    if recorded is not None:
        where = settings.relative(recorded)
        console.detail(f"the next build-{b} follows its change from this tree (recorded in {where})")


def run_build_session(
    backend: Backend,
    settings: Settings,
    console: Console,
    args: SessionArgs | None = None,
    *,
    prepare_fn: PrepareFn | None = None,
    spot_check_fn: SpotCheckFn = _default_spot_check,
    numerics_must_match: bool = True,
) -> SessionOutcome:
    """Probe the toolchain, prepare the pinned tree (``prepare_fn``, by default the pinned tree
    with refusals naming this backend's build), configure, build, spot check.

    A backend that cannot build here raises ToolchainMissing, unless the user
    asked to skip unavailable backends: then the outcome says ``skipped`` and
    nothing was built (the nox session must show it as skipped, not passed).
    """
    b = parse_backend(backend)
    args = args or SessionArgs()
    skip = args.skip_unavailable
    options = BuildOptions(cmake_args=args.cmake_args, jobs=args.jobs)
    try:
        with console.step(f"probe the {b} toolchain"):
            toolchain = probe_toolchain(b, settings, given=requested_defines(settings, options, b))
    except ToolchainMissing as exc:
        if skip:
            return SessionOutcome(backend=b, skipped=exc.what)
        raise
    for note in toolchain.notes:
        console.info(note)
    local = local_tree(settings, console, str(b)) if args.workdir_as_is else None
    prepared: _Prepared = local if local is not None else (prepare_fn or _pinned_prepare(b))(settings, console)
    tree = inspect_tree(prepared.workdir)
    try:
        check_tree_needs(tree, toolchain)
    except ToolchainMissing as exc:
        if skip:
            return SessionOutcome(backend=b, skipped=exc.what, patched_sha=prepared.patched_sha)
        raise
    plan = plan_build(
        b,
        settings,
        tree=tree,
        toolchain=toolchain,
        patched_sha=prepared.patched_sha,
        options=options,
        upstream_sha=prepared.upstream_sha,
        queue_digest=prepared.queue_digest,
        build_number=_upstream_count(settings, prepared),
        local_state=local.state if local is not None else None,
    )
    for name, source in plan.provenance.items():
        console.detail(f"{name}={plan.define(name)} ({source})")
    following = _follow(args, plan, prepared, settings, console, as_is=local is not None)
    with mounted(plan.rootfs, plan.rootfs_binds, env=settings.env, log=console.warn):
        report = execute_plan(plan, console)
    what = (
        "the workdir as it stands (a local, unregistered tree: queue digest 'local')" if local else "the prepared tree"
    )
    console.info(
        f"{b}: built {', '.join(report.binaries)} of {what} in {report.total_seconds:.1f} s "
        f"({report.compiled} compile steps) in {settings.relative(report.build_dir)}"
    )
    proofs = tuple(_gates(plan, report, settings, console, local=local is not None))
    spot, not_run = _spot_check(
        b,
        settings,
        console,
        args=args,
        plan=plan,
        report=report,
        prepared=prepared,
        proofs=proofs,
        spot_check_fn=spot_check_fn,
        numerics_must_match=numerics_must_match,
        following=following,
    )
    if local is None and isinstance(spot, SpotCheckReport):
        _certify(b, prepared, spot, settings, console)
    upstream = None
    if args.upstream_tests:
        upstream = _upstream_tests(
            b,
            settings,
            console,
            toolchain=toolchain,
            options=options,
            prepared=prepared,
            plan=plan,
            local=local is not None,
        )
    outcome = SessionOutcome(
        backend=b,
        build=report,
        patched_sha=prepared.patched_sha,
        spot=spot,
        local=local,
        proofs=proofs,
        spot_not_run=not_run,
        rootfs=plan.rootfs,
        upstream=upstream,
        following=following,
    )
    if upstream is not None and not upstream.ok:
        raise _upstream_failure(outcome, settings, local=local is not None)
    return outcome


#: the proofs a spot check makes, for the ending of a session that did not run one
SPOT_PROOFS: Final = ("provenance", "chat answer", "fingerprint", "RPC")


def session_ending(outcome: SessionOutcome, settings: Settings) -> Ending:
    """The block a build session ends with: each proof (pass, fail, not run and why), the binaries,
    and a run line that starts the server on the model the spot check loaded."""
    b = outcome.backend
    if outcome.skipped is not None or outcome.build is None:
        return Ending(f"build-{b}: skipped", (), (f"skipped: {outcome.skipped}",))
    spot = outcome.spot if isinstance(outcome.spot, SpotCheckReport) else None
    if spot is not None:
        spot_part = spot_proofs(spot)
    else:
        why = outcome.spot_not_run or "not asked"
        spot_part = [Proof(name, "not run", why) for name in SPOT_PROOFS]
    follow_part = [] if outcome.following is None else follow.proofs(outcome.following, spot, outcome.spot_not_run)
    follow_part = [_kept_family(p, outcome.following, spot) for p in follow_part]
    proofs = (*outcome.proofs, *spot_part, *follow_part, *_upstream_proofs(outcome.upstream))
    mode = " (the workdir as it stands)" if outcome.local is not None else ""
    verdict = "every proof made holds" if all(p.verdict != "fail" for p in proofs) else "FAILED"
    title = f"build-{b}{mode}: {verdict}"
    model = model_path(spot)
    shown = str(settings.relative(Path(model))) if model and outcome.rootfs is None else model
    return Ending(title, proofs, where(outcome.build, settings, outcome.rootfs, shown))


def _kept_family(proof: Proof, following: Following | None, spot: SpotCheckReport | None) -> Proof:
    """A touched family's proof, kept when its tiny model's result was kept from an earlier run."""
    if following is None or spot is None or proof.verdict != "pass":
        return proof
    family = next((f for f in following.families if proof.name == f"family {f.touched.family}"), None)
    if family is None or family.model is None:
        return proof
    tiny = family.model.split(":")[1]  # the result of any tiny:<family>[:quant] model (as follow.proofs reads it)
    result = next((r for r in spot.results if r.model.startswith("tiny:") and r.model.split(":")[1] == tiny), None)
    if result is None or result.kept_from is None:
        return proof
    return replace(proof, kept_from=result.kept_from)


def _upstream_tests(
    backend: Backend,
    settings: Settings,
    console: Console,
    *,
    toolchain: Toolchain,
    options: BuildOptions,
    prepared: _Prepared,
    plan: BuildPlan,
    local: bool,
) -> UpstreamTestsReport | None:
    """Upstream's tests on the tree just built; a test the queue breaks (or, as it stands, any
    failing test) fails the session with the report."""
    if plan.rootfs is not None:
        console.warn("upstream tests not run: the build runs inside a root file system, its tests would too")
        return None
    subject = Subject(
        toolchain=toolchain,
        options=options,
        upstream_sha=prepared.upstream_sha,
        patched_sha=prepared.patched_sha,
        queue_digest=prepared.queue_digest,
        build_number=_upstream_count(settings, prepared),
        plan=plan,
    )
    device = spec(backend).device_prefix
    if device is None:
        report = run_upstream_tests(backend, settings, console, subject, prepared=not local)
    else:
        report = run_backend_ops(backend, settings, console, subject, device=f"{device}0")
    for line in report.render():
        console.info(line)
    return report


def _upstream_proofs(report: UpstreamTestsReport | None) -> tuple[Proof, ...]:
    """Upstream's tests in the ending, when they ran: their counts and baseline, or the ops."""
    if report is None:
        return ()
    detail = report.summary() if report.ops_device is not None else f"{report.summary()}; baseline {report.baseline}"
    return (Proof("upstream tests", "pass" if report.ok else "fail", detail),)


def _upstream_failure(outcome: SessionOutcome, settings: Settings, *, local: bool) -> UpstreamTestsFailed:
    """The session's failure when a test the queue breaks (or, as it stands, any test) fails:
    the report, and the ending block with every proof made."""
    report = outcome.upstream
    assert report is not None
    broken = [t for t in report.tests if t.status in ("broken by the queue", "failed")]
    named = [f"{t.name} ({t.blame.patch if t.blame and t.blame.patch else t.status})" for t in broken]
    named += [f"{o.op} on {report.ops_device}" for o in report.ops if o.failed]
    return UpstreamTestsFailed(
        f"{len(named)} of upstream's tests fail on the {'workdir' if local else 'patched tree'}: {'; '.join(named)}",
        untouched=f"the workdir; the build dir {settings.relative(report.build_dir)} is kept",
        next_step=(
            "fix the patch named above, then `invoke regenerate` and rerun "
            f"`nox -s build-{outcome.backend} -- --upstream-tests`"
        ),
        report=report,
        ending=session_ending(outcome, settings),
    )


class SessionFn(Protocol):
    def __call__(
        self, backend: Backend | str, settings: Settings, console: Console, args: SessionArgs | None = None
    ) -> SessionOutcome: ...
