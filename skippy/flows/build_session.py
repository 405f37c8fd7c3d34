"""A build session: probe the toolchain, prepare the pinned tree, plan, build, spot-check.

What ``nox -s build-<backend>`` (and ``invoke pin-bump``) run: the one place where
the queue (prepare), the build and the spot check meet.  With ``--workdir-as-is``
the workdir is built as it stands instead of prepared (:class:`LocalTree`).  The
command line turns its options into one :class:`SessionRequest` (the build's
:class:`~skippy.compile.request.BuildRequest` and the session's own flags), and
renders the outcome (:func:`skippy.cli.build.build`).  The spot check follows the change:
it also loads the tiny model of each model family the change touches, and a passed check is
recorded as the next session's baseline (:mod:`skippy.flows.follow`).  The few functions a
session calls that tests replace are its :class:`Collaborators`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, Protocol

from skippy.compile.backends import reference_backend
from skippy.compile.backends.base import SERVER_TARGET, Backend
from skippy.compile.builder import BuildReport, execute_plan
from skippy.compile.localtree import LOCAL_QUEUE_DIGEST, WorkdirState, read_workdir_state
from skippy.compile.plan import PROVENANCE_DEFINES, BuildPlan, plan_build
from skippy.compile.request import BuildRequest
from skippy.compile.rootfs import Rootfs, mounted
from skippy.compile.toolchain import Toolchain, TreeInfo, check_tree_needs, inspect_tree, probe_toolchain
from skippy.core.errors import BuildError, CommandError, ModelCheckFailed, ToolchainMissing, UpstreamTestsFailed
from skippy.core.settings import Settings
from skippy.core.ui import Console
from skippy.flows import follow
from skippy.flows.follow import Following
from skippy.flows.gates import gates, rootfs_spot_check
from skippy.flows.upstream_tests.report import UpstreamTestsReport
from skippy.flows.upstream_tests.run import run_backend_ops, run_upstream_tests
from skippy.flows.upstream_tests.tree import Subject
from skippy.spot.report import Ending, Proof, SpotCheckReport, model_check_failed, model_path, spot_proofs


@dataclass(frozen=True)
class SessionRequest:
    """What a build session is asked to do: the build, and the session's own flags (from the
    command line's typed options, :mod:`skippy.cli.build`, made once)."""

    #: the backend (its registry entry), the -D values, the jobs
    build: BuildRequest
    #: a backend this host cannot build is skipped instead of failing (--skip-unavailable)
    skip_unavailable: bool = False
    spot_check: bool = True
    #: build the workdir as it stands (no prepare, a build dir of its own, queue digest "local")
    workdir_as_is: bool = False
    #: then build and run upstream's tests (skippy.flows.upstream_tests)
    upstream_tests: bool = False
    #: the spot check's models (none: its default model)
    models: tuple[str, ...] = ()
    #: make the spot check's proofs again, even those kept for the same binaries, model, reference and settings
    recheck: bool = False
    #: False: a difference from the CPU reference is reported, not failed (pin-bump's new upstream)
    numerics_must_match: bool = True

    @property
    def backend(self) -> Backend:
        return self.build.backend


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


#: the tree a session builds: (settings, console, the backend, whose --workdir-as-is build a refusal names)
PrepareFn = Callable[[Settings, Console, Backend], _Prepared]


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


def prepare_pinned(settings: Settings, console: Console, backend: Backend) -> _Prepared:
    """The session's own prepare of the pinned tree: its refusal of local work names this backend's
    build of the workdir as it stands."""
    from skippy.queue.prepare import Target, prepare

    return prepare(settings, Target.pinned(), console=console, as_is_build=f"nox -s build-{backend} -- --workdir-as-is")


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


@dataclass(frozen=True)
class Collaborators:
    """The functions a build session calls that tests replace (the real ones by default)."""

    #: the tree to build, unless it is the workdir as it stands
    prepare: PrepareFn = prepare_pinned
    #: the spot check of the binaries built
    spot_check: SpotCheckFn = _default_spot_check


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


@dataclass(frozen=True)
class _Built:
    """A session's build, as the steps after it read it."""

    toolchain: Toolchain
    prepared: _Prepared
    #: the workdir as it stands (--workdir-as-is), None for the prepared tree
    local: LocalTree | None
    plan: BuildPlan
    report: BuildReport
    #: what the build itself proved (the artifact gate, the root's gate)
    proofs: tuple[Proof, ...]
    following: Following | None
    #: how many commits the upstream base has (llama.cpp's build number), when known
    build_number: int | None


def _spot_check(
    request: SessionRequest, built: _Built, settings: Settings, console: Console, spot_check: SpotCheckFn
) -> tuple[object | None, str | None]:
    """The spot check of the build (its report), or why it did not run; it also checks the
    families the change touches (``following``)."""
    b, plan, report, prepared, following = request.backend, built.plan, built.report, built.prepared, built.following
    if not request.spot_check:
        return None, "--no-spot-check"
    if plan.rootfs is not None:
        not_run = rootfs_spot_check(plan)
        console.warn(f"spot check not run: {not_run}")
        return None, not_run

    def failure(spot: SpotCheckReport) -> ModelCheckFailed:
        """The failure ends with the same block: what the build proved, what the spot check did not."""
        from skippy.spot.spotcheck import failure_next_step

        failed = SessionOutcome(
            b, build=report, patched_sha=prepared.patched_sha, spot=spot, proofs=built.proofs, following=following
        )
        next_step = failure_next_step(spot, f"nox -s build-{b}")
        return model_check_failed(spot, next_step=next_step, ending=session_ending(failed, settings))

    asked = SpotCheckRequest(
        server_binary=report.binaries[SERVER_TARGET],
        server_env=plan.spot_check_env,
        extra_server_args=tuple(plan.spot_check_args),
        # a binary that does not report this build's provenance is stale: refuse it
        expect=(prepared.upstream_sha, prepared.queue_digest) if plan.define(PROVENANCE_DEFINES[0]) else None,
        device_prefix=request.build.spec.device_prefix,
        rpc_server=next((path for name, path in report.binaries.items() if name != SERVER_TARGET), None),
        agreement_required=request.numerics_must_match,
        models=following.models(request.models) if following is not None else request.models,
        recheck=request.recheck,
        failure=failure,
    )
    return spot_check(settings, asked, console), None


def _follow(
    request: SessionRequest, plan: BuildPlan, prepared: _Prepared, settings: Settings, console: Console
) -> Following | None:
    """The model families the change touches (:mod:`skippy.flows.follow`), said before the build;
    None when no spot check runs on this host."""
    if not request.spot_check or plan.rootfs is not None:
        return None
    following = follow.follow_change(
        settings,
        str(plan.backend),
        prepared.workdir,
        patched_sha=prepared.patched_sha,
        upstream_sha=prepared.upstream_sha,
        as_is=isinstance(prepared, LocalTree),
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


def _probe(request: SessionRequest, settings: Settings, console: Console) -> Toolchain:
    """The tools of the backend's build on this host (ToolchainMissing when it cannot build here)."""
    with console.step(f"probe the {request.backend} toolchain"):
        toolchain = probe_toolchain(request.build.spec, settings, given=request.build.defines)
    for note in toolchain.notes:
        console.info(note)
    return toolchain


def _tree(
    request: SessionRequest, settings: Settings, console: Console, prepare: PrepareFn
) -> tuple[LocalTree | None, _Prepared]:
    """The tree to build: the workdir as it stands (``--workdir-as-is``), or the one ``prepare`` makes."""
    if request.workdir_as_is:
        local = local_tree(settings, console, request.backend)
        return local, local
    return None, prepare(settings, console, request.backend)


def _build(
    request: SessionRequest,
    settings: Settings,
    console: Console,
    *,
    toolchain: Toolchain,
    tree: TreeInfo,
    prepared: _Prepared,
    local: LocalTree | None,
) -> _Built:
    """Plan the build of ``tree``, say the families it touches, build it, and run the gates."""
    build_number = _upstream_count(settings, prepared)
    plan = plan_build(
        request.build,
        settings,
        tree=tree,
        toolchain=toolchain,
        patched_sha=prepared.patched_sha,
        upstream_sha=prepared.upstream_sha,
        queue_digest=prepared.queue_digest,
        build_number=build_number,
        local_state=local.state if local is not None else None,
    )
    for name, source in plan.provenance.items():
        console.detail(f"{name}={plan.define(name)} ({source})")
    following = _follow(request, plan, prepared, settings, console)
    with mounted(plan.rootfs, plan.rootfs_binds, env=settings.env, log=console.warn):
        report = execute_plan(plan, console)
    what = (
        "the workdir as it stands (a local, unregistered tree: queue digest 'local')" if local else "the prepared tree"
    )
    console.info(
        f"{plan.backend}: built {', '.join(report.binaries)} of {what} in {report.total_seconds:.1f} s "
        f"({report.compiled} compile steps) in {settings.relative(report.build_dir)}"
    )
    proofs = tuple(gates(plan, report, settings, console, local=local is not None))
    return _Built(toolchain, prepared, local, plan, report, proofs, following, build_number)


def _checked(
    request: SessionRequest, built: _Built, settings: Settings, console: Console, spot_check: SpotCheckFn
) -> SessionOutcome:
    """After the build: the spot check (a passed one of the prepared tree is the next baseline),
    then upstream's tests when asked for; a test the queue breaks fails the session."""
    spot, not_run = _spot_check(request, built, settings, console, spot_check)
    if built.local is None and isinstance(spot, SpotCheckReport):
        _certify(request.backend, built.prepared, spot, settings, console)
    upstream = _upstream_tests(request, built, settings, console) if request.upstream_tests else None
    outcome = SessionOutcome(
        backend=request.backend,
        build=built.report,
        patched_sha=built.prepared.patched_sha,
        spot=spot,
        local=built.local,
        proofs=built.proofs,
        spot_not_run=not_run,
        rootfs=built.plan.rootfs,
        upstream=upstream,
        following=built.following,
    )
    if upstream is not None and not upstream.ok:
        raise _upstream_failure(outcome, settings, local=built.local is not None)
    return outcome


#: the real functions a build session calls
REAL_COLLABORATORS: Final = Collaborators()


def run_build_session(
    request: SessionRequest, settings: Settings, console: Console, collaborators: Collaborators = REAL_COLLABORATORS
) -> SessionOutcome:
    """Probe the toolchain, prepare the pinned tree (``collaborators.prepare``, by default the
    pinned tree with refusals naming this backend's build), configure, build, spot check.

    A backend that cannot build here raises ToolchainMissing, unless the user
    asked to skip unavailable backends: then the outcome says ``skipped`` and
    nothing was built (the nox session must show it as skipped, not passed).
    """
    b = request.backend
    try:
        toolchain = _probe(request, settings, console)
    except ToolchainMissing as exc:
        if request.skip_unavailable:
            return SessionOutcome(backend=b, skipped=exc.what)
        raise
    local, prepared = _tree(request, settings, console, collaborators.prepare)
    tree = inspect_tree(prepared.workdir)
    try:
        check_tree_needs(tree, toolchain)
    except ToolchainMissing as exc:
        if request.skip_unavailable:
            return SessionOutcome(backend=b, skipped=exc.what, patched_sha=prepared.patched_sha)
        raise
    built = _build(request, settings, console, toolchain=toolchain, tree=tree, prepared=prepared, local=local)
    return _checked(request, built, settings, console, collaborators.spot_check)


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
    request: SessionRequest, built: _Built, settings: Settings, console: Console
) -> UpstreamTestsReport | None:
    """Upstream's tests on the tree just built; a test the queue breaks (or, as it stands, any
    failing test) fails the session with the report."""
    plan, prepared, local = built.plan, built.prepared, built.local
    if plan.rootfs is not None:
        console.warn("upstream tests not run: the build runs inside a root file system, its tests would too")
        return None
    subject = Subject(
        toolchain=built.toolchain,
        request=request.build,
        upstream_sha=prepared.upstream_sha,
        patched_sha=prepared.patched_sha,
        queue_digest=prepared.queue_digest,
        build_number=built.build_number,
        plan=plan,
        local_state=local.state if local is not None else None,
    )
    device = request.build.spec.device_prefix
    if device is None:
        report = run_upstream_tests(request.backend, settings, console, subject, prepared=local is None)
    else:
        report = run_backend_ops(request.backend, settings, console, subject, device=f"{device}0")
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
    def __call__(self, request: SessionRequest, settings: Settings, console: Console) -> SessionOutcome: ...
