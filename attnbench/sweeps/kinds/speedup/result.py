"""What one rank of a speedup trial sends back: made typed by the rank (``job.measure``), sent
as its JSON (``results.convert.to_json``) and read back checked by the parent
(``schema.received``), so a field the two sides disagree on is named, not guessed at.

No torch here: the parent reads these without starting it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.results.schema import GpuMemory, received


@dataclass(kw_only=True)
class Compared:
    """A rank's share of the output (or the parameter gradients) against the single run's, in float32."""

    sq_err: float  # sum of squared differences
    sq_ref: float  # sum of squared reference values
    elements: int  # values compared
    nonfinite: bool = False  # the share holds NaN or infinity (outputs only: gradients are not looked at)


@dataclass(kw_only=True)
class RankResult:
    """One rank's trial: its timing, memory and output check, or why it failed. The launcher
    (``runtime.distributed``) adds ``rank``, and writes the result of a rank that failed or
    left none itself, with ``failed_at``, ``outcome`` or ``signal`` saying how."""

    status: str  # ok, or how it failed (oom, time-limit, error, killed...)
    times_ms: list[float]  # every timed iteration (none when it failed or only saved its output)
    message: str | None = None  # why it failed
    rank: int | None = None
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
    failed_at: float | None = None  # time.time() of its failure: the first one is the cause
    outcome: str | None = None  # the launcher's outcome, for a rank that left no result
    signal: int | None = None  # the signal that ended it


def read_ranks(sent: list[Any]) -> list[RankResult]:
    """The ranks' results as the launcher returns them, in rank order, each checked."""
    return [received(RankResult, r, f"rank {i}") for i, r in enumerate(sent)]
