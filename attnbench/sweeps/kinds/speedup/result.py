"""What every rank of a speedup trial is given (``RankSpec``) and what it sends back
(``RankResult``): typed on both sides, they cross the process boundary as JSON through the
rank job (``runtime.jobs``), so a field the two sides disagree on is named, not guessed at.

No torch here: the parent reads these without starting it.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.measure.timing import TimingPolicy
from attnbench.results.schema import GpuMemory
from attnbench.trials.workload import Workload


@dataclass
class RankSpec:
    """One speedup trial as each of its ranks runs it."""

    strategy: str
    strategy_module: str  # imported first: it registers a strategy defined outside the package
    workload: Workload
    module: str  # the model module timed (attention alone, or a block)
    gpus: int
    seed: int
    timing: TimingPolicy  # its budget is the per-call limit
    reference_dir: str  # where the single run's output lies
    role: str = "measure"  # measure; reference: also save the output; reference-only: save it untimed
    remake_reference: bool = False  # a node other than the single run's makes its own copy first
    grad_compression: str | None = None


@dataclass(kw_only=True)
class Compared:
    """A rank's share of the output (or the parameter gradients) against the single run's, in float32."""

    sq_err: float  # sum of squared differences
    sq_ref: float  # sum of squared reference values
    elements: int  # values compared
    nonfinite: bool = False  # the share holds NaN or infinity (outputs only: gradients are not looked at)


@dataclass(kw_only=True)
class RankResult:
    """One rank's trial: its timing, memory and output check, or a time limit it reached. A
    rank that failed sends none: the launcher says how it ended (``runtime.jobs.RankEnded``)."""

    status: str  # ok, or time-limit
    times_ms: list[float]  # every timed iteration (none when it only saved its output)
    message: str | None = None  # why it stopped timing
    devices: list[int] | None = None  # CUDA devices it used
    first_call_ms: float | None = None  # the slowest rank's first call: every rank agrees on it
    rank_first_call_ms: float | None = None  # its own first call
    gpu_times_ms: list[float] | None = None  # one process on a GPU: GPU time per call
    gpu_timer: str | None = None
    nvml: list[GpuMemory] | None = None  # local rank 0: NVML used memory of every GPU, by CUDA index
    nvml_note: str | None = None  # why NVML readings are missing
    allocator: dict[str, dict[str, int]] | None = None  # allocator peaks of its devices, by CUDA index
    cpu_peak_rss: int | None = None  # cpu: the process's resident-set peak, bytes
    backend: str | None = None  # what the kernel really ran
    replica_batches: list[list[int]] | None = None  # dp: [gpu, batch size] each replica got
    compare: Compared | None = None  # its output share; None without a single-run output
    grad_compare: Compared | None = None  # rank 0: the parameter gradients
