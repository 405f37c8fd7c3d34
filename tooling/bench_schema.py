"""The bench report as the figures table reads it: one frozen dataclass per section of the JSON
``nox -s bench`` writes (docs/figures/bench.json), parsed once.

A key the table reads is a field here, named as in the JSON: a renamed key is a type error in the
renderer (:mod:`tooling.docs.bench`) and, in an old report, one :class:`~tooling.typed_json.ShapeError`
naming the key's path (``builds.cold_build.raw_s: missing``), not a KeyError deep in a renderer.  Keys
the table does not read are left out; numbers are kept as the JSON has them (``15`` stays ``15``, not
``15.0``), so the table shows them as before.  A section measured but skipped is :class:`Skipped`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from tooling.typed_json import read

#: seconds as the bench writes them: a number, or null where nothing was measured (shown "?")
Seconds: TypeAlias = float | None


@dataclass(frozen=True)
class Skipped:
    """A section (or part of one) the bench did not measure, and why: an object with ``skipped``."""

    TAG: ClassVar[str] = "skipped"

    skipped: str


@dataclass(frozen=True)
class Median:
    median_s: Seconds


@dataclass(frozen=True)
class Timed:
    """Repeated runs of one command, where the table shows the median to a tenth."""

    median_s: float


# --- prepare, the minimal touch, builds, shared objects ------------------------------------------


@dataclass(frozen=True)
class ColdPrepare:
    ratio: float
    skippy: Median
    raw_git: Median
    target_ratio: float
    met: bool | None = None


@dataclass(frozen=True)
class NoopPrepare:
    median_s: Seconds
    files_with_changed_mtime: int
    target_s: Seconds
    met: bool | None = None


@dataclass(frozen=True)
class PrepareUpstream:
    files: int | None = None
    version: str | None = None


@dataclass(frozen=True)
class PrepareQueue:
    patches: int


@dataclass(frozen=True)
class Prepare:
    cold_prepare: ColdPrepare
    noop_prepare: NoopPrepare
    upstream: PrepareUpstream
    queue: PrepareQueue


@dataclass(frozen=True)
class OnePatchChanged:
    compile_steps_skippy_reprepare: int
    compile_steps_by_hand: int
    compile_steps_reset_reapply: int
    skippy_equals_minimum: bool


@dataclass(frozen=True)
class NothingChanged:
    after_skippy_noop: int


@dataclass(frozen=True)
class MinimalTouch:
    one_patch_changed: OnePatchChanged
    nothing_changed: NothingChanged


@dataclass(frozen=True)
class ColdBuild:
    skippy_s: Seconds
    raw_s: Seconds
    overhead_pct: float
    overhead_outside_cmake_ninja_s: Seconds
    target_pct: float
    met: bool | None = None


@dataclass(frozen=True)
class UpToDate:
    median_s: Seconds
    target_s: Seconds
    met: bool | None = None


@dataclass(frozen=True)
class CompilerCache:
    warm_fresh_dir_s: Seconds
    cold_s: Seconds
    ratio: float
    target_ratio: float
    warm_hits: int | None = None
    warm_misses: int | None = None
    met: bool | None = None


@dataclass(frozen=True)
class Builds:
    cold_build: ColdBuild
    up_to_date_nox_build_cpu: UpToDate
    compiler_cache: CompilerCache


@dataclass(frozen=True)
class SharedLines:
    shared: int
    cpu_lines: int
    only_backend_use: int


@dataclass(frozen=True)
class SharedObjects:
    patched: SharedLines
    unpatched: SharedLines
    met: bool | None = None


# --- the proofs: spot check, remote cache, CUDA, upstream's tests, ROCm ---------------------------


@dataclass(frozen=True)
class SpotCheck:
    median_s: Seconds
    raw_start_and_one_chat_median_s: Seconds
    target_s: Seconds
    met: bool | None = None


@dataclass(frozen=True)
class RemoteCache:
    new_machine_s: Seconds
    new_machine_hits: int
    new_machine_misses: int
    cold_s: Seconds
    ratio: float
    target_ratio: float
    met: bool | None = None


@dataclass(frozen=True)
class Cuda:
    cold_s: Seconds
    cold_compile_steps: int
    fresh_dir_s: Seconds
    fresh_dir_hits: int
    fresh_dir_misses: int
    artifact_gate_missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fatbinary:
    size: Seconds
    balance: Seconds


@dataclass(frozen=True)
class CudaEstimate:
    cores: int
    sccache_wall_s: Seconds
    sccache_hit_over_raw: float
    raw_wall_s: Seconds
    target_s: Seconds
    ccache_depend_wall_s: Seconds = None
    fatbinary_sum_s: Fatbinary | None = None


@dataclass(frozen=True)
class CudaProfile:
    cu_objects: int
    estimate: CudaEstimate


@dataclass(frozen=True)
class UpstreamBuild:
    build_s: Seconds


@dataclass(frozen=True)
class UpstreamFromCache:
    build_s: Seconds
    hits: int
    misses: int


@dataclass(frozen=True)
class Ctest:
    wall_s: Seconds


@dataclass(frozen=True)
class Attribution:
    baseline_s: Seconds
    attribution_s: Seconds
    probes: int


@dataclass(frozen=True)
class UpstreamTests:
    fresh_dir_from_cache: UpstreamFromCache
    ctest: Ctest
    attribution: Attribution
    cold_no_cache: UpstreamBuild | None = None


@dataclass(frozen=True)
class Rocm:
    configure_s: Seconds
    build_s: Seconds
    compile_steps: int
    artifact_gate: str
    up_to_date_session_s: Seconds
    up_to_date_compile_steps: int
    #: the fresh dir's figures, or what happened instead (``fresh_dir``)
    fresh_dir_s: Seconds = None
    fresh_dir_hits: int | None = None
    fresh_dir_misses: int | None = None
    fresh_dir: str | None = None


# --- pin moves, the C++ parsers, the generator, the queue at scale, the cluster -----------------


@dataclass(frozen=True)
class MoveSkippy:
    compile_steps: int
    wall_s: Seconds


@dataclass(frozen=True)
class MoveRaw:
    compile_steps: int
    rebuild_s: Seconds


@dataclass(frozen=True)
class Move:
    skippy: MoveSkippy
    raw_fixed_commit: MoveRaw


@dataclass(frozen=True)
class UnpatchedLines:
    carrying_commit: int
    compile_lines: int


@dataclass(frozen=True)
class CommitLines:
    skippy: int
    compile_lines: int
    unpatched_upstream: UnpatchedLines


@dataclass(frozen=True)
class PinMove:
    commit_on_compile_lines: CommitLines
    moves: Mapping[str, Move]
    target_readme_only_steps: int
    target_extra_steps: int
    met: bool | None = None


@dataclass(frozen=True)
class ParserFound:
    builders: int
    anchors: int
    files_with_errors: int
    parse_s: Seconds


@dataclass(frozen=True)
class Rewrite:
    idempotent: bool
    second_pass_changed: tuple[str, ...]
    families_placed: int
    hooks: int
    refused: Mapping[str, str]
    sharing_another_builder: Mapping[str, str]


@dataclass(frozen=True)
class GraphParse:
    files: int
    tree_sitter: ParserFound
    libclang: ParserFound | Skipped
    rewrite: Rewrite


@dataclass(frozen=True)
class TreeSitterScan:
    files_parsed: int
    parse_s: Seconds
    files_with_errors: int
    scan_s: Seconds


@dataclass(frozen=True)
class OldScan:
    scan_s: Seconds


@dataclass(frozen=True)
class ParityCounts:
    switches: int
    cases: int
    tables: int
    entries: int


@dataclass(frozen=True)
class Disagreeing:
    file: str


@dataclass(frozen=True)
class Agreement:
    cppscan: ParityCounts
    agree: bool
    default_files: int
    disagreeing: tuple[Disagreeing, ...]


@dataclass(frozen=True)
class Parse:
    files: int
    bytes: int
    tree_sitter: TreeSitterScan
    old: OldScan | Skipped
    agreement: Agreement | Skipped


@dataclass(frozen=True)
class Generated:
    seconds: Seconds
    shards: int
    families_covered: int
    families_with_builders: int
    archs_covered: int
    archs_mapped: int
    second_pass: str
    rerun_same_bytes: bool
    check_clean: bool
    check_seconds: Seconds


@dataclass(frozen=True)
class RefusedFamily:
    file: str


@dataclass(frozen=True)
class Refusal:
    met: bool
    lane_untouched: bool
    families: Mapping[str, RefusedFamily]


@dataclass(frozen=True)
class GeneratedApply:
    patches: int
    ratio: float
    skippy_cold_prepare: Timed
    raw_clone_checkout_am: Timed
    raw_am_only: Timed
    same_tree_as_raw: bool
    hooks_in_tree: int
    hooks_added: int
    second_pass_on_applied_tree_changed: tuple[str, ...]
    shards_off: tuple[str, ...]


@dataclass(frozen=True)
class BuildSide:
    seconds: Seconds
    compiled: int
    cache_hits: int | None = None
    cache_misses: int | None = None


@dataclass(frozen=True)
class GeneratedBuild:
    target: str
    skippy: BuildSide
    raw: BuildSide


@dataclass(frozen=True)
class GenerateAll:
    generate: Generated
    refusal: Refusal
    apply: GeneratedApply
    build: GeneratedBuild | Skipped


@dataclass(frozen=True)
class Lanes:
    core: int
    model_support: int
    generated: int
    generated_moved_to_model_support: int | None = None


@dataclass(frozen=True)
class GitProcesses:
    skippy: int
    raw: int


@dataclass(frozen=True)
class ScaleCommand:
    skippy: Timed
    git: GitProcesses
    ratio: float | None = None


@dataclass(frozen=True)
class ScaleSize:
    n: int
    lanes: Lanes
    commands: Mapping[str, ScaleCommand]


@dataclass(frozen=True)
class ScaleTarget:
    target: str | None = None
    met: bool | None = None
    #: seconds per patch by N (the JSON's keys are strings)
    per_patch_s: Mapping[str, float] = field(default_factory=dict)
    growth: float | None = None
    spread: float | None = None


@dataclass(frozen=True)
class Scale:
    sizes: tuple[ScaleSize, ...]
    rounds: int
    targets: Mapping[str, ScaleTarget] = field(default_factory=dict)


@dataclass(frozen=True)
class DistCounts:
    remote: int | None = None
    local: int | None = None
    failed_over: int | None = None


@dataclass(frozen=True)
class DistLocal:
    build_s: Seconds
    compiles: int


@dataclass(frozen=True)
class DistSent:
    build_s: Seconds
    counts: DistCounts | None = None


@dataclass(frozen=True)
class CpuDistSent:
    build_s: Seconds
    overhead_per_compile_s: float
    counts: DistCounts | None = None


@dataclass(frozen=True)
class DistCuda:
    sample: int
    objects: int
    local: DistLocal
    dist: DistSent
    overhead_per_compile_s: float
    estimate_objects_s: Mapping[str, float]


@dataclass(frozen=True)
class Dist:
    local: DistLocal
    dist: CpuDistSent
    servers: int
    cores: int
    estimate_build_s: Mapping[str, float]
    cuda: DistCuda | None = None
    compile_steps: Mapping[str, int | None] = field(default_factory=dict)


# --- the report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    cpus: int | None = None


@dataclass(frozen=True)
class BenchReport:
    """Every section the figures table shows; a section the bench did not write is None."""

    schema: int | None = None
    machine: Machine | None = None
    provenance: str | None = None
    prepare: Prepare | None = None
    minimal_touch: MinimalTouch | None = None
    builds: Builds | None = None
    shared_objects: SharedObjects | None = None
    spot_check: SpotCheck | None = None
    remote_cache: RemoteCache | None = None
    cuda: Cuda | None = None
    cuda_profile: CudaProfile | None = None
    rocm: Rocm | None = None
    upstream_tests: UpstreamTests | None = None
    pin_move: PinMove | None = None
    graph_parse: GraphParse | Skipped | None = None
    parse: Parse | Skipped | None = None
    generate_all: GenerateAll | None = None
    scale: Scale | None = None
    dist: Dist | None = None


#: the report's sections the table shows (a section the JSON has beyond these is named under it)
SECTIONS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(BenchReport))


def parse_report(raw: Mapping[str, Any]) -> BenchReport:
    """The bench report ``raw`` (the JSON, loaded) as the table reads it; ShapeError names the first
    key that is missing or holds the wrong kind of value."""
    return read(BenchReport, raw)
