"""Plan a CMake + Ninja build of one backend, without running anything.

:func:`plan_build` is pure: from the backend's registry entry, the settings, what
the tree declares (:class:`~skippy.compile.toolchain.TreeInfo`) and the tools found
(:class:`~skippy.compile.toolchain.Toolchain`) it computes the configure and build
command lines, the targets and binaries, the compiler launchers, the values
CMakeCache.txt must hold afterwards, the spot-check environment and the stamp
that says when configuring can be skipped.  :mod:`skippy.compile.builder` runs it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from skippy.compile.backends import switches
from skippy.compile.backends.base import COMMON_DEFINES, RPC_TARGETS, TREE_OPTIONAL_DEFINES, Backend, BackendSpec
from skippy.compile.cache import (
    CacheStorage,
    basedirs_env,
    launcher_env,
    local_fallback_env,
    local_storage,
    rootfs_launcher_env,
    select_storage,
)
from skippy.compile.dist import DistCluster, DistSetup, client_config, config_path, dist_env, select_dist
from skippy.compile.localtree import MODE_LOCAL, WorkdirState, local_dir_name
from skippy.compile.request import BuildRequest, build_table
from skippy.compile.rootfs import Rootfs
from skippy.compile.sharedcache import github_event, host_cpu_tag, native_namespace, read_only, read_only_reason
from skippy.compile.tool import Tool
from skippy.compile.toolchain import Toolchain, TreeInfo
from skippy.compile.uncached import UNCACHED_LANGUAGES, LauncherScript, uncached_launcher
from skippy.core import specs
from skippy.core.errors import BuildError
from skippy.core.settings import Settings

GENERATOR: Final = "Ninja"
STAMP_NAME: Final = "skippy-build-stamp.json"
#: upstream's tests' switch, ON in a build dir of upstream's tests alone: the trees beside the workdir (baseline,
#: attribution), and a binaries' dir that has them off (``--upstream-tests`` builds them in the binaries' dir where
#: it can)
TESTS_SWITCH: Final = "LLAMA_BUILD_TESTS"
#: that define as the configure arguments (and the stamp) of such a dir hold it
TESTS_DEFINE: Final = f"-D{TESTS_SWITCH}=ON"
STAMP_SCHEMA: Final = 1


@dataclass(frozen=True)
class Define:
    name: str
    value: str
    #: a tool or directory path: kept out of the build-dir digest, not asserted in the cache
    path: bool = False

    @property
    def arg(self) -> str:
        return f"-D{self.name}={self.value}"


@dataclass(frozen=True)
class BuildPlan:
    #: the backend's registry entry, as the request resolved it (never looked up again by name)
    spec: BackendSpec = field(repr=False)
    source_dir: Path
    build_dir: Path
    digest: str
    defines: tuple[Define, ...]
    configure_argv: tuple[str, ...]
    build_argv: tuple[str, ...]
    targets: tuple[str, ...]
    #: False when the tree did not name its RPC target: it is looked up after configure
    rpc_target_known: bool
    binaries: Mapping[str, Path]
    #: values CMakeCache.txt must hold after configure
    expectations: Mapping[str, str]
    #: variables added to the environment of cmake/ninja/launcher (on top of settings.env;
    #: a remote cache storage's may hold credentials: kept out of repr)
    env_overrides: Mapping[str, str] = field(repr=False)
    env: Mapping[str, str] = field(repr=False)
    launcher: Tool | None = None
    spot_check_env: Mapping[str, str] = field(default_factory=dict)
    spot_check_args: tuple[str, ...] = ()
    stamp: Mapping[str, Any] = field(default_factory=dict)
    #: where each choice came from, e.g. {"CMAKE_CUDA_ARCHITECTURES": "detected (nvidia-smi)"}
    provenance: Mapping[str, str] = field(default_factory=dict)
    #: where the compiler cache keeps objects (None without a launcher)
    cache_storage: CacheStorage | None = None
    #: the whole environment of a build with the local cache, when the remote cannot be reached
    cache_fallback_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: the backend's toolkit when it has a choice of them (``cuda wheels 13.0.88 <pins>``,
    #: ``vulkan headers debian 1.4.309``): in the build report; it also names the build dir
    toolkit: str | None = None
    #: the sccache-dist cluster the compiles are sent to, when one is set (``dist``)
    dist: DistSetup | None = field(default=None, repr=False)
    #: the compiler launcher that keeps sources embedding files out of the cache (written before
    #: configure; :mod:`skippy.compile.uncached`), None when the tree has none
    launcher_script: LauncherScript | None = field(default=None, repr=False)
    #: why the configured compile cluster is not used by this build (a root's, ccache's)
    dist_unused: str | None = None
    #: set when configure and build run inside a root file system (their argv start with
    #: ``runner``; :func:`skippy.compile.rootfs.mounted` binds the work folders in around them
    #: for chroot, a namespace runner's binds are in ``runner`` itself)
    rootfs: Rootfs | None = None

    @property
    def stamp_path(self) -> Path:
        return self.build_dir / STAMP_NAME

    @property
    def cache_server_envs(self) -> tuple[Mapping[str, str], ...]:
        """The environments of the sccache servers this build may use: its own, then the local
        fallback of a remote storage and the local compiles of a cluster that cannot be used."""
        fallbacks = (self.cache_fallback_env, self.dist.fallback_env if self.dist is not None else {})
        return (self.env, *(env for env in fallbacks if env))

    @property
    def backend(self) -> Backend:
        return self.spec.name

    @property
    def runner(self) -> tuple[str, ...]:
        """What the configure and build argv start with before cmake/ninja (empty on the host)."""
        return self.rootfs.prefix if self.rootfs is not None else ()

    @property
    def launcher_argv(self) -> tuple[str, ...]:
        """What runs the compiler cache's own commands (``--zero-stats``, ``--stop-server``):
        inside the root, through :attr:`runner`, when the build runs there; empty without one."""
        return (*self.runner, self.launcher.path) if self.launcher is not None else ()

    @property
    def rootfs_binds(self) -> tuple[Path, ...]:
        """The host folders a build inside a root binds at their own paths: the source tree,
        the build dir, and the compiler cache's directory and server socket folder."""
        if self.rootfs is None:
            return (self.source_dir, self.build_dir)
        return rootfs_binds(self.source_dir, self.build_dir, self.launcher, self.env_overrides)

    def host_path(self, path: str) -> Path:
        """Where a tool path CMake recorded is on this host (inside the root when there is one)."""
        return self.rootfs.host_path(path) if self.rootfs is not None else Path(path)

    def define(self, name: str) -> str | None:
        for d in self.defines:
            if d.name == name:
                return d.value
        return None


def _digest(payload: Mapping[str, Any]) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


#: cache variables of the queue's provenance patch (upstream commit, queue digest)
PROVENANCE_DEFINES: tuple[str, str] = ("SKIPPY_UPSTREAM_SHA", "SKIPPY_QUEUE_DIGEST")


@dataclass
class _Values:
    """The -D values of a plan as they are decided, and where each choice came from."""

    values: dict[str, Define] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)

    def put(self, name: str, value: str, *, path: bool = False, source: str | None = None) -> None:
        self.values[name] = Define(name, value, path=path)
        if source:
            self.provenance[name] = source

    def give(self, given: Mapping[str, str]) -> None:
        """The user's -D values win over everything else."""
        path_like = {name for name, d in self.values.items() if d.path}
        for name, value in given.items():
            self.put(name, value, path=name in path_like or name.endswith(("_DIR", "_COMPILER", "_LAUNCHER")))
            self.provenance.setdefault(name, "given")
            if self.provenance[name].startswith(("default", "detected")):
                self.provenance[name] = "given"

    def sorted(self) -> tuple[Define, ...]:
        return tuple(sorted(self.values.values(), key=lambda d: d.name))


def _registry_values(s: BackendSpec, settings: Settings, tree: TreeInfo, toolchain: Toolchain, out: _Values) -> None:
    for name, value in COMMON_DEFINES.items():
        out.put(name, value)
    for name, value in TREE_OPTIONAL_DEFINES.items():
        if name in tree.options:
            out.put(name, value)
    for name, value in {**switches(s.name, toolchain.system), **s.extra_defines}.items():
        out.put(name, value)
    if settings.on_ci or not _native(settings):
        # portable code: the same binaries (and compiler cache) locally and on CI, and no
        # -march=native paths a VM cannot run (AMX tiles fault in llama-server on some hosts)
        out.put("GGML_NATIVE", "OFF", source="CI" if settings.on_ci else "default (opt in with native = true)")
    out.put("CMAKE_MAKE_PROGRAM", toolchain.ninja.path, path=True)


def _provenance_values(
    tree: TreeInfo, upstream_sha: str | None, queue_digest: str | None, build_number: int | None, out: _Values
) -> None:
    if upstream_sha and tree.build_info_overridable:
        # the tree would ask git for HEAD: every new patched commit would change libllama's
        # compile definitions and recompile all of it. Name the upstream commit instead (the
        # queue is named by the provenance below); kept out of the build-dir digest.
        out.put("LLAMA_BUILD_COMMIT", upstream_sha[:12], path=True, source="upstream commit")
        out.put("LLAMA_BUILD_NUMBER", str(build_number or 0), path=True, source="upstream commit count")
    if upstream_sha and queue_digest and set(PROVENANCE_DEFINES) <= tree.options:
        out.put(PROVENANCE_DEFINES[0], upstream_sha, path=True, source="queue provenance")
        out.put(PROVENANCE_DEFINES[1], queue_digest, path=True, source="queue provenance")


@dataclass
class _LauncherSetup:
    """The compiler cache's part of a plan: its storage and environment."""

    env_overrides: dict[str, str]
    storage: CacheStorage | None = None
    fallback_env: dict[str, str] = field(default_factory=dict)
    dist: DistSetup | None = None
    script: LauncherScript | None = None
    #: why a configured cluster is not used by this build (warned once when it starts)
    dist_unused: str | None = None


def _launcher_setup(
    s: BackendSpec,
    settings: Settings,
    tree: TreeInfo,
    toolchain: Toolchain,
    backend_env: Mapping[str, str],
    *,
    out: _Values,
) -> _LauncherSetup:
    setup = _LauncherSetup(env_overrides=dict(backend_env))
    launcher = toolchain.launcher
    if launcher is None:
        return setup
    # the sources whose embedded files no cache sees go around it, through a script of their own
    setup.script = uncached_launcher(settings.build_root, launcher.path, tree.uncached_sources)
    command, source = launcher.path, launcher.name
    if setup.script is not None:
        command, source = str(setup.script.path), f"{launcher.name}, {len(setup.script.sources)} source(s) uncached"
    wanted = (lang for lang in s.languages if lang in tree.languages or lang in ("C", "CXX"))
    for lang in (lang for lang in wanted if lang not in UNCACHED_LANGUAGES):
        out.put(f"CMAKE_{lang}_COMPILER_LAUNCHER", command, path=True, source=source)
    cluster = select_dist(build_table(settings).get("dist"), settings.env)
    if toolchain.rootfs is not None:
        # inside a root: a server of the root's own, with the local directory (bound in); a
        # namespace runner's server sees only the folders bound when it started: they name it
        setup.storage = local_storage("inside the root: local directory only")
        tagged = toolchain.rootfs.with_binds((tree.source_dir, settings.build_root))
        setup.env_overrides.update(rootfs_launcher_env(settings.cache_dir, tagged.server_tag))
        setup.dist_unused = _unused(cluster, "the build runs inside a root file system, whose compiler it cannot send")
        return setup
    storage = _shared_storage(settings)
    setup.storage = storage
    if launcher.name != "sccache":
        setup.dist_unused = _unused(cluster, f"{launcher.name} does not send compiles to sccache-dist")
        cluster = None
    tag = cluster.tag() if cluster is not None else ""
    setup.env_overrides.update(launcher_env(launcher.name, settings.cache_dir, storage, dist_tag=tag))
    if storage.remote and launcher.name == "sccache":
        # a remote that cannot be reached: the same build with the local directory
        local = launcher_env(launcher.name, settings.cache_dir)
        setup.fallback_env = {**local_fallback_env(settings.env), **backend_env, **local}
    if cluster is not None:
        conf = config_path(settings.cache_dir, cluster)
        setup.env_overrides.update(dist_env(settings.cache_dir, cluster))
        # a cluster that cannot be used: the same build (and storage) compiled here
        here = {**settings.env, **backend_env, **launcher_env(launcher.name, settings.cache_dir, storage)}
        text = client_config(cluster, conf.parent / "toolchains")
        setup.dist = DistSetup(cluster=cluster, config=conf, config_text=text, fallback_env=here)
    return setup


def _unused(cluster: DistCluster | None, why: str) -> str | None:
    """Why a configured cluster is left out of this build (None when none is configured)."""
    return f"{cluster.description} ({cluster.source}) is not used: {why}" if cluster is not None else None


def _shared_storage(settings: Settings) -> CacheStorage:
    """The storage, made safe to share: a ``-march=native`` build's objects in a namespace of
    this host's CPU (or the remote refused), a pull-request job's reads only (GitHub Actions)."""
    storage = select_storage(build_table(settings).get("cache_storage"), settings.env)
    if not storage.remote:
        return storage
    if _native(settings) and not settings.on_ci:
        storage = native_namespace(storage, host_cpu_tag(settings.env), settings.env)
    return read_only(storage, read_only_reason(settings.env, github_event(settings.env)))


def workdir_key(settings: Settings, source_dir: Path) -> str | None:
    """A short hash of the tree's resolved path, so two workdirs under one build root never share
    (and reconfigure in turn) a build dir; None for the project's default workdir, whose build
    dirs keep the names they always had."""
    default = next(spec.default for spec in specs.TOP if spec.key == "workdir")
    resolved = source_dir.resolve()
    if resolved == (settings.root / str(default)).resolve():
        return None
    return hashlib.sha256(str(resolved).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _dir_digest(s: BackendSpec, defines: Sequence[Define], toolchain: Toolchain, workdir: str | None) -> str:
    """The build dir's name: the flags (not the tool paths) and, but for the default one, the workdir."""
    identity: dict[str, Any] = {
        "backend": s.name,
        "generator": GENERATOR,
        "defines": [[d.name, d.value] for d in defines if not d.path],
        "path_defines": [d.name for d in defines if d.path],
        # configure takes no arguments but the defines: kept, empty, so that every build dir keeps its name
        "extra": [],
    }
    if workdir is not None:
        identity["workdir"] = workdir
    if toolchain.facts.get("toolkit"):
        # a backend toolkit's kind and version (e.g. CUDA from wheels): another toolkit, another dir
        identity["toolkit"] = toolchain.facts["toolkit"]
    return _digest(identity)


def _checked_build_root(settings: Settings, source_dir: Path) -> Path:
    build_root = settings.build_root
    if _inside(build_root, source_dir):
        raise BuildError(
            f"build_root {build_root} is inside the source tree {source_dir}",
            untouched="everything: nothing was configured or built",
            next_step="set [tool.skippy] build_root to a directory outside the llama.cpp tree",
        )
    return build_root


@dataclass(frozen=True)
class _Subject:
    """What a plan is made of besides its request and the settings: the tree, its tools, what it is."""

    tree: TreeInfo
    toolchain: Toolchain
    patched_sha: str
    upstream_sha: str | None
    queue_digest: str | None
    build_number: int | None
    local_state: WorkdirState | None


def _commands(
    subject: _Subject,
    build_dir: Path,
    defines: Sequence[Define],
    *,
    jobs: int | None,
    targets: Sequence[str],
    inside: Rootfs | None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The configure and build command lines (run ``inside`` a root file system when there is one)."""
    toolchain = subject.toolchain
    configure_argv = (
        toolchain.cmake.path,
        "-S",
        str(subject.tree.source_dir),
        "-B",
        str(build_dir),
        "-G",
        GENERATOR,
        *(d.arg for d in defines),
    )
    build_argv = (toolchain.ninja.path, "-C", str(build_dir), *(("-j", str(jobs)) if jobs else ()), *targets)
    if inside is not None:
        return inside.wrap(configure_argv), inside.wrap(build_argv)
    return configure_argv, build_argv


def _decide_values(request: BuildRequest, settings: Settings, subject: _Subject) -> tuple[_Values, _LauncherSetup]:
    """The -D values (the registry's, the provenance, the backend's choices, the compiler cache's,
    then the request's over them all) and the compiler cache's setup."""
    s, tree, toolchain = request.spec, subject.tree, subject.toolchain
    values = _Values()
    _registry_values(s, settings, tree, toolchain, values)
    _provenance_values(tree, subject.upstream_sha, subject.queue_digest, subject.build_number, values)
    facts = toolchain.plan_facts(request.defines, tree.source_dir)
    for choice in s.choices(facts):
        values.put(choice.name, choice.value, path=choice.path, source=choice.source)
    setup = _launcher_setup(s, settings, tree, toolchain, dict(s.env_overrides(facts)), out=values)
    values.give(request.defines)
    return values, setup


def _build_dir(s: BackendSpec, settings: Settings, subject: _Subject, defines: Sequence[Define]) -> tuple[str, Path]:
    """The build dir's digest and path: named by the backend and the digest, or (the workdir as it
    stands) by the workdir's state too."""
    source_dir = subject.tree.source_dir
    digest = _dir_digest(s, defines, subject.toolchain, workdir_key(settings, source_dir))
    local = subject.local_state
    name = f"{s.name}-{digest}" if local is None else local_dir_name(s.name, digest, local)
    return digest, _checked_build_root(settings, source_dir) / name


def _targets(request: BuildRequest, tree: TreeInfo) -> tuple[str, ...]:
    """The targets asked for, else the backend's own (the RPC server as the tree names it)."""
    if request.targets is not None:
        return request.targets
    rpc_target = tree.rpc_target or RPC_TARGETS[0]
    return tuple(rpc_target if t in RPC_TARGETS else t for t in request.spec.default_targets)


def _stamp(s: BackendSpec, subject: _Subject, defines: Sequence[Define]) -> dict[str, Any]:
    """What the build dir's stamp records: configure is skipped while it matches."""
    stamp: dict[str, Any] = {
        "schema": STAMP_SCHEMA,
        "backend": s.name,
        "patched_sha": subject.patched_sha,
        "generator": GENERATOR,
        "source_dir": str(subject.tree.source_dir),
        "configure_args": [d.arg for d in defines],
        "tools": subject.toolchain.tool_versions(),
    }
    if subject.local_state is not None:
        # only local builds carry a mode: the stamps of prepared builds stay as they were
        stamp.update({"mode": MODE_LOCAL, "workdir_state": subject.local_state.key})
    return stamp


def _share_basedirs(toolchain: Toolchain, settings: Settings, source_dir: Path, setup: _LauncherSetup) -> None:
    """The compiler cache's base directories (the source tree, the build root), in its environments:
    the same objects for the same sources wherever the tree and the build dirs are."""
    if toolchain.launcher is None:
        return
    shared = basedirs_env(toolchain.launcher.name, settings.env, (source_dir, settings.build_root))
    setup.env_overrides.update(shared)
    if setup.fallback_env:
        setup.fallback_env.update(shared)


def _rootfs_of(toolchain: Toolchain, source_dir: Path, build_root: Path, setup: _LauncherSetup) -> Rootfs | None:
    """The root file system configure and build run in (None: this host), with the compiler
    cache's variables and, for a namespace runner, its binds."""
    inside = _rootfs_with_cache(toolchain.rootfs, setup.env_overrides)
    if inside is not None and inside.namespace:
        # binds in the command line: the source tree, the build root, the cache and its socket
        inside = inside.with_binds(rootfs_binds(source_dir, build_root, toolchain.launcher, setup.env_overrides))
    return inside


def plan_build(
    request: BuildRequest,
    settings: Settings,
    *,
    tree: TreeInfo,
    toolchain: Toolchain,
    patched_sha: str,
    upstream_sha: str | None = None,
    queue_digest: str | None = None,
    build_number: int | None = None,
    local_state: WorkdirState | None = None,
) -> BuildPlan:
    """Everything the build ``request`` asks for will do, computed without running anything.

    ``upstream_sha``/``queue_digest`` are passed to trees whose queue reports build
    provenance (they declare ``SKIPPY_UPSTREAM_SHA``/``SKIPPY_QUEUE_DIGEST``); they are
    kept out of the build-dir digest, so a queue change reuses the dir (and its objects).
    ``local_state`` (``--workdir-as-is``) puts the build in a dir of its own, named by
    the workdir's state (:func:`skippy.compile.localtree.local_dir_name`), and records
    that mode in its stamp.
    """
    s = request.spec
    subject = _Subject(tree, toolchain, patched_sha, upstream_sha, queue_digest, build_number, local_state)
    values, setup = _decide_values(request, settings, subject)
    defines = values.sorted()
    digest, build_dir = _build_dir(s, settings, subject, defines)
    _share_basedirs(toolchain, settings, tree.source_dir, setup)
    targets = _targets(request, tree)
    jobs = request.jobs if request.jobs is not None else _table_jobs(settings)
    inside = _rootfs_of(toolchain, tree.source_dir, settings.build_root, setup)
    configure_argv, build_argv = _commands(subject, build_dir, defines, jobs=jobs, targets=targets, inside=inside)
    spot_env = {k: v.replace("{cache_dir}", str(settings.cache_dir)) for k, v in s.spot_check_env.items()}
    return BuildPlan(
        spec=s,
        source_dir=tree.source_dir,
        build_dir=build_dir,
        digest=digest,
        defines=defines,
        configure_argv=configure_argv,
        build_argv=build_argv,
        targets=targets,
        # targets asked for are known; else the tree's RPC target is, or it is looked up after configure
        rpc_target_known=tree.rpc_target is not None or request.targets is not None,
        binaries=MappingProxyType({t: build_dir / "bin" / t for t in targets}),
        expectations=MappingProxyType({d.name: d.value for d in defines if not d.path}),
        env_overrides=MappingProxyType(setup.env_overrides),
        env=MappingProxyType({**settings.env, **setup.env_overrides}),
        launcher=toolchain.launcher,
        spot_check_env=MappingProxyType(spot_env),
        spot_check_args=s.spot_check_args,
        stamp=MappingProxyType(_stamp(s, subject, defines)),
        provenance=MappingProxyType(values.provenance),
        cache_storage=setup.storage,
        cache_fallback_env=MappingProxyType(setup.fallback_env),
        dist=setup.dist,
        launcher_script=setup.script,
        dist_unused=setup.dist_unused,
        toolkit=toolchain.facts.get("toolkit"),
        rootfs=inside,
    )


def rootfs_binds(
    source_dir: Path, build: Path, launcher: Tool | None, overrides: Mapping[str, str]
) -> tuple[Path, ...]:
    """The host folders a build inside a root needs at their own paths: the source tree,
    ``build`` (the build dir, or the folder of build dirs), and the compiler cache's
    directory and server socket folder."""
    folders = [source_dir, build]
    if launcher is not None:
        if "SCCACHE_DIR" in overrides:
            folders.append(Path(overrides["SCCACHE_DIR"]))
        if "SCCACHE_SERVER_UDS" in overrides:
            folders.append(Path(overrides["SCCACHE_SERVER_UDS"]).parent)
    return tuple(folders)


#: the compiler cache's variables a build inside a root passes in (``env -i`` drops the rest)
_ROOT_CACHE_VARS: Final = ("SCCACHE_DIR", "SCCACHE_SERVER_UDS", "SCCACHE_SERVER_PORT", "SCCACHE_BASEDIRS")


def _rootfs_with_cache(root: Rootfs | None, overrides: Mapping[str, str]) -> Rootfs | None:
    """``root`` whose commands get the compiler cache's variables (its local directory, its
    server's socket, the base directories: the same paths inside and out)."""
    if root is None:
        return None
    passed = {name: overrides[name] for name in _ROOT_CACHE_VARS if name in overrides}
    return root.with_env(passed) if passed else root


def _native(settings: Settings) -> bool:
    """``SKIPPY_NATIVE=1`` or ``[tool.skippy.build] native = true``: let ggml use -march=native."""
    return bool(specs.value(specs.BUILD, "native", build_table(settings), settings.env, where=_WHERE))


def _table_jobs(settings: Settings) -> int | None:
    """``SKIPPY_BUILD_JOBS`` or ``[tool.skippy.build] jobs`` (checked: a whole number from 1)."""
    jobs = specs.value(specs.BUILD, "jobs", build_table(settings), settings.env, where=_WHERE)
    return int(jobs) if jobs is not None else None


_WHERE: Final = "[tool.skippy.build]"


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True
