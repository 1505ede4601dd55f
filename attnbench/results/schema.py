"""The result schema in code: one dataclass per kind of row in ``trials.jsonl``.

Each field is one key of the JSON object a writer appends, with a comment saying what it
measures. ``row_from_json`` picks the class by the row's ``kind``, checks the schema version,
the presence and the JSON type of every field, and raises one ``SchemaError`` line naming
the bad or missing field; ``to_json`` gives the object back.

Version policy. ``schema`` is an integer that changes only when a key changes meaning or
disappears; a row of another version is refused. Keys added later without a version change
(a newer attnbench's new metric) are not an error: they are kept in ``extra``, written back
by ``to_json`` and ignored by the report and the check. Optional fields a row lacks (or holds
as null) are ``None``: not measured, or not applicable to that row; ``to_json`` leaves them out,
but a row a writer built (``build``) goes out key for key as it was given, nulls included.
Nested objects stay plain where a reader needs nothing more than a key (``config``,
``env.gpus``); per-GPU memory, the ranks of a multi-process trial and the environment are typed.

The conversion itself (checked reading, writing back, NaN as null) is ``results.convert``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from attnbench.results.convert import SchemaError, clean_floats, from_json, held, row_own, to_json

SCHEMA_VERSION = 1
R = TypeVar("R", bound="Row")
P = TypeVar("P")

# --- the rows ---------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Environment:
    """Where a row was measured; captured once per run and stored in every row."""

    machine: str  # what results are grouped by: GPU model x count, or "cpu: MODEL"
    attnbench: str | None = None  # attnbench version
    commit: str | None = None  # source commit, "-dirty" appended for local changes
    date: str | None = None  # run start, ISO 8601 UTC
    command: str | None = None  # the command line that produced the run
    hostname: str | None = None
    python: str | None = None
    platform: str | None = None
    cpu: str | None = None  # CPU model name
    cpu_count: int | None = None
    torch: str | None = None
    cuda: str | None = None  # CUDA version torch was built with
    cudnn: int | None = None
    nccl: str | None = None
    gpus: list[dict[str, Any]] | None = None  # NVML inventory: index, name, memory_total_bytes, nvlinks_active
    nvml: str | None = None  # "ok" or why NVML was unavailable
    driver: str | None = None  # NVIDIA driver version
    cuda_driver: int | None = None  # CUDA version the driver supports
    gpu_links: list[dict[str, Any]] | None = None  # per GPU pair: PCIe topology level and NVLink peer access
    gpu_settings: list[dict[str, Any]] | None = None  # per GPU: persistence mode, application and max clocks
    pytorch_cuda_alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF as the run saw it
    clipped: list[str] | None = None  # parts of a profile dropped for want of GPUs, in words
    nodes: list[str] | None = None  # the host names of the nodes a run spanned, by node rank (node 0 first)
    extra: dict[str, Any] = row_own(default_factory=dict)
    layout: tuple[str, ...] = row_own(default=(), compare=False, repr=False)  # a built row's keys: see ``build``


@dataclass(kw_only=True)
class GpuMemory:
    """One GPU's memory during a trial (rank and device indices where several take part)."""

    index: int  # GPU index as the trial saw it
    max_memory_allocated: int | None = None  # torch allocator peak, bytes
    max_memory_reserved: int | None = None  # torch caching allocator reserved peak, bytes
    nvml_used_before: int | None = None  # NVML used memory before the trial and its CUDA context, bytes (all processes)
    nvml_used_peak: int | None = None  # NVML used memory peak during the trial, bytes
    rank: int | None = None  # distributed rank that used this GPU
    cuda_device: int | None = None  # CUDA device index of that rank
    nvml_index: int | None = None  # NVML index of the same GPU
    extra: dict[str, Any] = row_own(default_factory=dict)
    layout: tuple[str, ...] = row_own(default=(), compare=False, repr=False)  # a built row's keys: see ``build``


@dataclass(kw_only=True)
class RankLine:
    """One rank of a multi-process trial: its own outcome, time and memory (a sequence-parallel
    rank's split of a call into compute and waiting on the ring; a speedup rank's devices)."""

    rank: int | None = None
    status: str | None = None
    message: str | None = None  # why it failed (only where it did)
    time_ms: float | None = None  # its own median call
    first_call_ms: float | None = None
    compile_ms: float | None = None
    compute_ms: float | None = None  # sequence parallel: median per call
    comm_wait_ms: float | None = None
    sent_bytes: int | None = None  # sequence parallel: bytes this rank sends per call
    comm_steps: int | None = None
    inputs_bytes: int | None = None
    max_memory_allocated: int | None = None
    max_memory_reserved: int | None = None
    cpu_peak_rss_delta: int | None = None
    devices: list[int] | None = None  # speedup: the CUDA devices the rank used
    cpu_peak_rss: int | None = None
    extra: dict[str, Any] = row_own(default_factory=dict)
    layout: tuple[str, ...] = row_own(default=(), compare=False, repr=False)  # a built row's keys: see ``build``


@dataclass(kw_only=True)
class Row:
    """Fields every row has."""

    KIND: ClassVar[tuple[str, ...]] = ()
    schema: int = SCHEMA_VERSION  # schema version the row was written with
    kind: str  # which class below describes the row
    run: str  # results directory name of the run
    env: Environment | None = None  # where it ran (absent only in rows built by hand)
    extra: dict[str, Any] = row_own(default_factory=dict)  # keys this schema version does not know
    source: str | None = row_own(default=None, compare=False)  # the file a reader found it in; not stored
    layout: tuple[str, ...] = row_own(default=(), compare=False, repr=False)  # a built row's keys: see ``build``

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, d: Any) -> Row:
        """The row ``d`` as this class; a SchemaError names the first bad field."""
        if not isinstance(d, dict):
            raise SchemaError(f"a result row is a JSON object, not {type(d).__name__}")
        if d.get("kind") not in cls.KIND:
            raise SchemaError(f"field 'kind' is {d.get('kind')!r}, expected {' or '.join(map(repr, cls.KIND))}")
        _check_version(d)
        return from_json(cls, d, f"{d['kind']} row")


@dataclass(kw_only=True)
class Workload(Row):
    """The attention call a row measured."""

    impl: str  # implementation name (attnbench list)
    config: dict[str, Any]  # implementation parameters
    batch: int
    seq_len: int  # tokens per sequence
    heads: int
    head_dim: int
    dtype: str  # float16, bfloat16 or float32
    device: str  # cuda or cpu
    causal: bool
    mode: str | None = None  # fwd or fwd_bwd (absent in verify rows)
    world_size: int | None = None  # GPUs (ranks) the call was spread over; None: one device
    strategy: str | None = None  # how: single, a sequence-parallel ring, dp/ddp/mp; None: single
    kv_heads: int | None = None  # key/value heads shared by groups of query heads; None: as many as heads
    model: str | None = None  # the model preset the shape came from (attnbench models)

    def identity(self, seq_len: bool = True) -> Identity:
        """What makes two rows the same attention call (``workload_identity`` of this row's
        fields); ``seq_len=False`` for a series (the call but its length)."""
        return workload_identity({name: getattr(self, name) for name in _workload_field_names()}, seq_len)

    def identity_key(self, seq_len: bool = True, without: tuple[str, ...] = (), **also: Any) -> str:
        """``identity`` as one canonical string, for grouping and dictionary keys: the one key
        every comparison of rows derives from. ``without``: identity fields a grouping spans
        (a configuration's modes, say); ``also``: what else must match (a search's limits)."""
        ident = self.identity(seq_len)
        for name in without:
            ident.pop(name, None)
        return json.dumps({**ident, **also}, sort_keys=True, default=str)


@dataclass(kw_only=True)
class Timing:
    """Time samples of one measured call and their summary, milliseconds."""

    status: str  # ok, oom, time-limit or error; anything but ok ends a search
    message: str  # why it failed, one line ("" when it ran)
    times_ms: list[float]  # every timed sample (none when it failed)
    time_ms: float | None = None  # median sample
    time_iqr_ms: float | None = None  # interquartile range of the samples
    time_min_ms: float | None = None
    time_max_ms: float | None = None
    first_call_ms: float | None = None  # the untimed first call (compilation, allocator warm-up)
    timer: str | None = None  # how samples were taken (CUDA events or wall clock)
    threads: int | None = None  # CPU: torch's intra-op threads the calls ran with
    backend: str | None = None  # kernel backend the implementation chose
    tokens_per_s: float | None = None  # batch * seq_len / time
    gpus: list[GpuMemory] | None = None  # per-GPU memory
    ranks: list[RankLine] | None = None  # per rank of a multi-process trial: times, communication, memory
    nvml_note: str | None = None  # why NVML memory readings are missing, when they are
    started_at: str | None = None  # ISO 8601 UTC
    duration_s: float | None = None  # wall time of the whole trial, start-up included
    host_load: list[float] | None = None  # the host's 1-minute load average before and after the trial
    trial: str | None = None  # random id of the trial
    time_n: int | None = None  # samples behind time_ms
    time_ci_low: float | None = None  # 95% bootstrap interval of the median eager time
    time_ci_high: float | None = None
    gpu_times_ms: list[float] | None = None  # GPU time per call: CUDA-graph replays or back-to-back calls
    # CPU: the process's CPU time per timed call (user and system, every thread), beside its
    # wall time: the call's own cost, which other work on the machine does not add to
    cpu_times_ms: list[float] | None = None
    gpu_time_ms: float | None = None  # median GPU time
    gpu_time_n: int | None = None
    gpu_time_ci_low: float | None = None
    gpu_time_ci_high: float | None = None
    gpu_timer: str | None = None  # cuda-graph, back-to-back, or why GPU time is missing
    dispatch_share: float | None = None  # 1 - GPU time / eager time: the host's share of a call
    host_bound: bool | None = None  # eager time well above GPU time (dispatch dominates)
    warm_call_ms: float | None = None  # the call the sample plan (and the time limit) was decided on
    warmup_calls: int | None = None
    warmup_s: float | None = None  # warm-up by time, until the SM clock settles
    clocks: list[dict[str, Any]] | None = None  # per GPU during the timed calls: SM/memory clock, power, throttle
    clocks_moved: bool | None = None  # a clock moved more than a few percent while timing
    kv_layout: str | None = None  # grouped K/V: shared (read once per group) or expanded (copied per query head)

    def summarize(self) -> None:
        """Set the statistics of ``times_ms`` and ``gpu_times_ms`` (``measure.timing.sample_statistics``)."""
        from attnbench.measure.timing import sample_statistics

        for name, value in held(sample_statistics(self.times_ms, self.gpu_times_ms)).items():
            setattr(self, name, value)


@dataclass(kw_only=True)
class Measured(Timing):
    """What a trial's process measured: the part of a trial row its worker sends back
    (``to_json``, read back with ``received``), memory, FLOPs and communication beside the time."""

    impl_source: dict[str, Any] | None = None  # outside implementation: import path, package, version, memory order
    inputs_bytes: int | None = None  # q, k, v (and gradients) as allocated
    floor_bytes: int | None = None  # closed-form memory floor of the call
    peak_bytes: int | None = None  # peak memory as peak_counter measured it
    peak_counter: str | None = None  # which counter gave peak_bytes
    peak_over_floor: float | None = None  # peak_bytes / floor_bytes
    max_memory_allocated: int | None = None  # torch allocator peak on the trial's device, bytes
    max_memory_reserved: int | None = None
    device_total_bytes: int | None = None  # the device's memory
    cpu_peak_rss: int | None = None  # process resident-set peak, bytes (cpu trials)
    cpu_peak_rss_delta: int | None = None  # growth of that peak during the trial
    cpu_tensor_peak_bytes: int | None = None  # cpu trials: tensor bytes one call held at once (exact run to run)
    flops_useful: float | None = None  # FLOPs of the attended pairs only
    flops_executed: float | None = None  # FLOPs the kernel performs (masked blocks included)
    kept_fraction: float | None = None  # attended pairs / all pairs
    tflops_useful: float | None = None
    tflops_executed: float | None = None
    compile_ms: float | None = None  # torch.compile time of the first call
    compile_peak_bytes: int | None = None  # allocator peak of the compiling call, kept out of peak_bytes
    tflops_executed_ci_low: float | None = None  # executed TFLOP/s over the time interval
    tflops_executed_ci_high: float | None = None
    pairs_counted: str | None = None  # closed-form, declared (by the implementation), blocks, exact or unknown
    pairs_useful: int | None = None  # (query, key) pairs of the key sets, summed over heads (FLOPs: 4 B D each)
    pairs_executed: int | None = None  # pairs the kernel computes, masked ones included
    pairs_source: str | None = None  # an outside implementation's own functions behind the pairs, by name
    flops_unknown: str | None = None  # why the FLOPs are not known (pairs_counted unknown): one line
    count_s: float | None = None  # seconds counting the pairs took, outside the trial (once per length)
    sent_bytes: int | None = None  # sequence parallel: bytes the busiest rank sends per call
    algbw_gbps: float | None = None  # those bytes over the call's time (nccl-tests' algbw)
    link_gbps: float | None = None  # sequence parallel: the same ranks' ring exchange alone, GB/s (what the link gives)
    phase_s: dict[str, float] | None = None  # seconds per phase of its process: start, setup, ..., exit


@dataclass(kw_only=True)
class Trial(Workload, Measured):
    """One timed call at one sequence length: a probe of a max-seq search or a fixed point."""

    KIND: ClassVar[tuple[str, ...]] = ("max-seq", "points")
    series: str  # identity of the sweep line (everything but seq_len)
    label: str  # the series' name in tables
    phase: str | None = None  # grow, predict, bracket, bisect, confirm, predicted (not run) or point
    isolate: bool | None = None  # ran in its own process
    max_trial_seconds: float | None = None  # time limit of one trial
    memory_limit: int | None = None  # bytes a trial may use on its device, when capped
    attempt: int | None = None  # 2 and on: the same length again in a fresh process (a retry, the confirmation)
    process: int | None = None  # which of --repeat K fresh processes measured this point
    timing: dict[str, Any] | None = None  # the timing plan (warm-up, samples, budget): part of the identity
    sweep: str | None = None  # the sweep kind that ran it, where its rows are another kind's (max-seq, points)
    predicted_peak_bytes: float | None = None  # max-seq: the peak the capacity model predicted before it ran
    predicted_time_ms: float | None = None  # max-seq: the warm call the model predicted before it ran
    predicted_max_seq: int | None = None  # max-seq: the largest length the model predicted before it ran
    predicted_only: bool | None = None  # not run: the model put its call over the time limit (status time-limit)
    verified: bool | None = None  # its configuration passed the reference check first; False: run without it


@dataclass(kw_only=True)
class MaxSeqResult(Workload):
    """How a max-seq search of one series ended."""

    KIND: ClassVar[tuple[str, ...]] = ("max-seq-result",)
    seq_len: int | None  # the longest length that ran; None when none did
    series: str
    label: str
    first_failure: int | None = None  # shortest length that failed
    stop_status: str | None = None  # status of that failure
    stopped_by: str | None = None  # what ended the search (memory, time, max length...)
    granularity: int | None = None  # lengths the implementation accepts are multiples of it
    resolution: int | None = None  # bisection stops when failure - best <= this
    start: int | None = None  # first length tried
    max_seq_len: int | None = None  # upper bound of the search, if any
    trials: int | None = None  # trials the search ran
    confirmed: bool | None = None  # the longest success ran again in a fresh process and ran
    margin: int | None = None  # first_failure - seq_len: the bracket's width, in tokens
    first_failure_predicted: bool | None = None  # first_failure was predicted over the time limit, not run
    predicted_max_seq: int | None = None  # the capacity model's largest length at the end of the search
    verified: bool | None = None  # its configuration passed the reference check first; False: run without it
    impl_source: dict[str, Any] | None = None  # outside implementation: as its trials record it


@dataclass(kw_only=True)
class Check:
    """What one check of an implementation against the float64 reference found: the part of a
    verify row the checking process makes and sends back (``to_json``, read back with ``received``)."""

    status: str  # pass, fail, error or unsupported (the kernel has no such shape: not a wrong output)
    rel_err: float | None = None  # max |out - ref| / max |ref|
    tolerance: float | None = None  # largest rel_err that passes for the dtype
    seed: int | None = None  # input seed
    backend: str | None = None
    message: str  # why it failed ("" when it passed)
    rel_err_single: float | None = None  # sequence-parallel: the same inputs on one device
    counterpart: str | None = None  # the single-device implementation compared with
    rel_err_dq: float | None = None  # fwd_bwd: the gradients against the float64 reference
    rel_err_dk: float | None = None
    rel_err_dv: float | None = None
    grad_tolerance: float | None = None
    kv_layout: str | None = None  # grouped K/V: shared or expanded
    twin_of: dict[str, Any] | None = None  # checked on a reduced twin: the configuration it stands for
    twin_scale: int | None = None  # the twin's lengths (sequence, segments) are twin_of's divided by this
    elapsed_s: float | None = None  # seconds the check took (inputs, the call, the float64 reference)
    impl_source: dict[str, Any] | None = None  # outside implementation: as its trials record it


@dataclass(kw_only=True)
class Verify(Check, Workload):
    """One check of an implementation against the float64 reference: the case's workload and
    what the check found (Check first among the bases keeps a row's fields, and so the first
    missing one a reader names, in their order: Row's, the workload's, then the check's)."""

    KIND: ClassVar[tuple[str, ...]] = ("verify",)


@dataclass(kw_only=True)
class StepMeasured(Timing):
    """What a speedup trial's ranks measured, merged into one part (``merge_ranks`` of the speedup
    sweep): the training step's time, memory and its output against the single-GPU run's."""

    processes: int | None = None  # processes launched
    output_match: bool | None = None  # output agrees with the single-GPU reference
    output_rel_err: float | None = None
    grad_rel_err: float | None = None
    tolerance: float | None = None
    grad_tolerance: float | None = None
    output_message: str | None = None  # why the output check failed or had nothing to compare with
    replica_batches: list[list[int]] | None = None  # dp: [gpu, batch size] each replica really got


@dataclass(kw_only=True)
class Speedup(Workload, StepMeasured):
    """One multi-GPU (or single-GPU baseline) training-step measurement."""

    KIND: ClassVar[tuple[str, ...]] = ("speedup",)
    case: str  # the workload case's label
    key: str  # identity used for resume
    module: str | None = None  # the model wrapped around attention
    grad_compression: str | None = None  # mp only
    max_trial_seconds: float | None = None
    note: str | None = None  # what the row's numbers mean, for the table


#: a workload field's value in an identity: text, a number, a flag, the implementation's
#: configuration (a JSON object), None where a row does not record the field
IdentityValue = str | int | float | bool | dict[str, Any] | None
#: what makes two rows the same attention call, by workload field (``workload_identity``)
Identity = dict[str, IdentityValue]

# Workload fields that are bookkeeping, not part of what was measured: a model preset names a
# shape that heads, kv_heads, head_dim and causal already hold.
NOT_IDENTITY = ("model",)


def workload_identity(fields: Mapping[str, Any], seq_len: bool = True) -> Identity:
    """The one identity of an attention call, from a workload's fields by name (a row's, a
    planned trial's): every workload field of the row schema (derived from ``Workload``, so a
    new workload field joins it), one device meaning world size 1 and strategy "single";
    ``kv_heads`` only where fewer than the heads (a row from before grouped heads and one
    without grouping are the same call); ``seq_len=False`` for a series. Every comparison of
    rows and every key stored in a row (``series``, a speedup trial's ``key``) derives from it."""
    ident = {name: fields.get(name) for name in _workload_field_names()}
    ident["world_size"] = ident["world_size"] or 1
    ident["strategy"] = ident["strategy"] or "single"
    if ident["kv_heads"] in (None, ident["heads"]):
        del ident["kv_heads"]
    if not seq_len:
        del ident["seq_len"]
    return ident


def digest(ident: Mapping[str, Any], length: int) -> str:
    """An identity as the short hex key a row stores."""
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:length]


@functools.cache
def _workload_field_names() -> tuple[str, ...]:
    own = {f.name for f in dataclasses.fields(Row)}
    return tuple(f.name for f in dataclasses.fields(Workload) if f.name not in own and f.name not in NOT_IDENTITY)


ROW_TYPES: tuple[type[Row], ...] = (Trial, MaxSeqResult, Verify, Speedup)
KINDS = {kind: cls for cls in ROW_TYPES for kind in cls.KIND}


def row_from_json(d: Any) -> Row:
    """Any row, typed by its ``kind``."""
    if not isinstance(d, dict):
        raise SchemaError(f"a result row is a JSON object, not {type(d).__name__}")
    if "kind" not in d:
        raise SchemaError("missing field 'kind'")
    if d["kind"] not in KINDS:
        raise SchemaError(f"field 'kind' is {d['kind']!r}, expected one of {', '.join(KINDS)}")
    return KINDS[d["kind"]].from_json(d)


def build(cls: type[R], **fields: Any) -> R:
    """A row a writer makes, checked as a reader would; its numbers and ``layout`` (keys, order, nulls) as given."""
    return from_json(cls, {"schema": SCHEMA_VERSION, **fields}, f"{fields.get('kind')} row", built=True)


def join(cls: type[R], *parts: Any, **fields: Any) -> R:
    """A row a writer makes from typed parts (each one's fields that hold a value; a later one
    wins) and its own ``fields`` (which win over any part), checked as ``build`` checks; NaN
    and infinity stored as null. Stored in that order: the writer's fields (what the row is),
    the parts' (what was measured), the environment last."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(held(part))
    env = fields.pop("env", None)
    row = {**fields, **{k: v for k, v in merged.items() if k not in fields}}
    if env is not None:
        row["env"] = env
    # nested records (a part's per-GPU memory) are checked as the objects a reader finds
    return build(cls, **clean_floats({k: to_json(v) for k, v in row.items()}))


def received(cls: type[P], d: Any, sender: str) -> P:
    """The typed part a worker process sent as JSON (``to_json``), checked like a row: a
    SchemaError names a missing, mistyped or unknown field."""
    if not isinstance(d, dict):
        raise SchemaError(f"{sender} sent {type(d).__name__}, not a JSON object")
    return from_json(cls, d, f"{sender}'s {cls.__name__.lower()}", built=True)


def validate(d: dict[str, Any]) -> None:
    """A SchemaError unless ``d`` is a valid row."""
    row_from_json(d)


def _check_version(d: dict[str, Any]) -> None:
    if "schema" not in d:
        raise SchemaError("missing field 'schema'")
    v = d["schema"]
    if not isinstance(v, int) or isinstance(v, bool) or v != SCHEMA_VERSION:
        newer = isinstance(v, int) and v > SCHEMA_VERSION
        raise SchemaError(
            f"field 'schema' is {v!r}, this attnbench reads schema {SCHEMA_VERSION}"
            + ("; upgrade attnbench to read it" if newer else "")
        )
