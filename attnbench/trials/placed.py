"""A trial placed over ranks: the one executor of every trial that runs on more than one
process or GPU, whatever spreads it (a strategy of ``attnbench.trials.strategies``: a sequence
sharded over ranks, a batch split by DataParallel or by processes, a call on a new thread).

Parent side (no torch): ``run(spec, device)`` launches ``spec.strategy``'s processes under
``runtime.distributed.launch``, each running the rank job ``attnbench.trials.placed_job:rank_job``
on a ``PlacedSpec``; ``merge`` makes the common part of one row from how the ranks ended
(each call the slowest rank's, a one-off cost the slowest rank's, one line per rank), the same
for a sequence-parallel trial and a speedup trial. What only one kind of row holds (a ring's
traffic, a speedup's output check) is read by its sweep from the ranks' ``RankResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.analysis.ranks import Calls, calls_of, own_median, slowest_of_all
from attnbench.measure.timing import TimingPolicy
from attnbench.results.schema import GpuMemory, RankLine, Timing
from attnbench.runtime.jobs import RankEnded
from attnbench.trials.workload import Workload

# the rank side, by name (the job module imports this one)
RANK_JOB = "attnbench.trials.placed_job:rank_job"


@dataclass
class OutputCheck:
    """A speedup trial's output against the single-GPU run's, kept in ``reference_dir``."""

    reference_dir: str
    role: str = "measure"  # measure; reference: also save the output; reference-only: save it untimed
    remake_reference: bool = False  # a node other than the single run's makes its own copy first


@dataclass
class PlacedSpec:
    """One trial as each of its ranks runs it."""

    strategy: str
    strategy_module: str  # imported first: it registers a strategy defined outside the package
    workload: Workload  # the whole problem: global batch and sequence length
    seed: int
    timing: TimingPolicy
    limit_s: float  # one call longer than this is a time-limit
    memory_limit: int | None = None  # bytes each rank may allocate on its device
    module: str = "attention"  # the model module timed (attention alone, or a block)
    gpus: int = 1  # GPUs the strategy spreads over (processes on the CPU)
    grad_compression: str | None = None
    output: OutputCheck | None = None
    fail_rank: int | None = None  # a test's fault: this rank raises once its inputs are made


@dataclass(kw_only=True)
class Compared:
    """A rank's share of the output (or the parameter gradients) against the single run's, in float32."""

    sq_err: float  # sum of squared differences
    sq_ref: float  # sum of squared reference values
    elements: int  # values compared
    nonfinite: bool = False  # the share holds NaN or infinity (outputs only: gradients are not looked at)


@dataclass(kw_only=True)
class RankResult:
    """What one rank measured: its calls, its memory, what its step said of each call, its
    output check. A rank that failed sends none: the launcher says how it ended
    (``runtime.jobs.RankEnded``)."""

    status: str  # ok, or time-limit
    times_ms: list[float]  # every timed call (none when it only saved its output)
    message: str | None = None  # why it stopped timing
    timer: str | None = None
    devices: list[int] | None = None  # CUDA devices it used
    first_call_ms: float | None = None  # its own first call
    compile_ms: float | None = None
    compile_peak_bytes: int | None = None
    warm_call_ms: float | None = None  # the call its plan and time limit were decided on
    warmup_calls: int | None = None
    warmup_s: float | None = None
    gpu_times_ms: list[float] | None = None
    gpu_timer: str | None = None
    cpu_times_ms: list[float] | None = None  # one CPU process: each call's CPU time
    cpu_tensor_peak_bytes: int | None = None
    threads: int | None = None  # CPU: torch's intra-op threads
    clocks: list[dict[str, Any]] | None = None  # its GPUs' clocks while timing (where NVML reads them)
    clocks_moved: bool | None = None
    link_gbps: float | None = None  # its ring exchange alone, measured before the trial
    inputs_bytes: int | None = None  # what its share held before the first call
    max_memory_allocated: int | None = None  # allocator peaks of its first device
    max_memory_reserved: int | None = None
    device_total_bytes: int | None = None
    cpu_peak_rss: int | None = None  # cpu: the process's resident-set peak, bytes
    cpu_peak_rss_delta: int | None = None
    allocator: dict[str, dict[str, int]] | None = None  # allocator peaks of each of its devices, by CUDA index
    nvml: list[GpuMemory] | None = None  # NVML used memory of its devices, by CUDA index
    nvml_note: str | None = None  # why NVML readings are missing
    backend: str | None = None  # what the kernel really ran
    kv_layout: str | None = None
    replica_batches: list[list[int]] | None = None  # dp: [gpu, batch size] each replica got
    compute_ms: float | None = None  # sequence parallel: median per call
    comm_wait_ms: float | None = None
    sent_bytes: int | None = None  # sequence parallel: bytes sent per call (the last call)
    comm_steps: int | None = None
    compare: Compared | None = None  # its output share; None without a single-run output
    grad_compare: Compared | None = None  # rank 0: the parameter gradients


def run(
    spec: PlacedSpec,
    device: str,
    launch: Callable[..., list[RankEnded]] | None = None,
    **limits: Any,
) -> list[RankEnded]:
    """Every rank of ``spec``'s trial, launched as its strategy says; how each ended, in rank
    order (``limits``: ``launch``'s, the phase limit at least)."""
    from attnbench.trials import strategies

    if launch is None:
        from attnbench.runtime.distributed import launch
    return launch(RANK_JOB, spec, strategies.get(spec.strategy).processes(spec.gpus), device, **limits)


def merge(m: Timing, ended: list[RankEnded]) -> list[RankResult]:
    """``m``'s common part from how the ranks ended: one status, each call the slowest rank's,
    the first call and compilation the slowest rank's where every rank took one, the kernel,
    the CPU threads and warm-up calls the ranks planned alike, and one line per rank. Returns
    what each rank sent (a rank that failed stands in with no calls, no memory) for the row's
    own fields."""
    from attnbench.runtime.distributed import agreed_status

    status, message = agreed_status(ended)
    results = [e.result or RankResult(status=e.status, message=e.message, times_ms=[]) for e in ended]
    calls = calls_of(results, len(ended)) if status == "ok" else Calls([])
    m.status, m.message = status, message
    m.times_ms, m.gpu_times_ms, m.gpu_timer = calls.times_ms, calls.gpu_times_ms, calls.gpu_timer
    m.summarize()
    m.first_call_ms = slowest_of_all([r.first_call_ms for r in results], len(results))
    m.timer = _first(r.timer for r in results)
    m.threads = _first(r.threads for r in results)  # on the CPU: every rank's calls ran with the plan's count
    m.warmup_calls = next((r.warmup_calls for r in results if r.warmup_calls is not None), None)  # planned alike
    m.backend = _first(r.backend for r in results)
    m.kv_layout = _first(r.kv_layout for r in results)  # grouped K/V: shared or copied
    m.nvml_note = _first(r.nvml_note for r in results)
    m.ranks = [rank_line(e, r) for e, r in zip(ended, results)]
    return results


def _first(values) -> Any:
    return next((v for v in values if v), None)


# What a rank's line keeps of what the rank measured (one that failed sent nothing: its line
# holds its rank, status and message).
RANK_LINE = (
    "first_call_ms",
    "compile_ms",
    "compute_ms",
    "comm_wait_ms",
    "sent_bytes",
    "comm_steps",
    "inputs_bytes",
    "max_memory_allocated",
    "max_memory_reserved",
    "cpu_peak_rss_delta",
    "devices",
    "cpu_peak_rss",
)


def rank_line(ended: RankEnded, r: RankResult) -> RankLine:
    """A rank's line in the row's ``ranks``: its own median call beside what it measured."""
    line = RankLine(rank=ended.rank, status=ended.status, message=None if ended.status == "ok" else ended.message)
    for k in RANK_LINE:
        setattr(line, k, getattr(r, k))
    line.time_ms = own_median(r.times_ms)
    return line
