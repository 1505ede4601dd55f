"""Timing with raw samples kept: CUDA events on the GPU, a monotonic clock on the CPU.

Every sample is stored in the result row, so `check` can run a significance test on them.
We time ourselves instead of calling triton's do_bench because do_bench allocates a 256 MB
cache-flush buffer, which would move a trial's out-of-memory point, and it may keep a single
sample for slow calls; attention inputs at benchmark sizes are far larger than L2 anyway.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 1          # calls after the first, untimed
    min_samples: int = 5
    max_samples: int = 50
    target_ms: float = 1000.0  # aim for this much timed work per trial
    budget_s: float = 60.0     # never spend more than this timing (max_trial_seconds)


class Timer:
    """Times one call of ``fn``; synchronizes the device so each sample is one call."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.name = "cuda-event" if self.cuda else "perf_counter"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def plan_calls(first_ms: float, policy: TimingPolicy) -> tuple[int, int]:
    """(warmup calls, timed calls) after a first call of ``first_ms``: aim for the target
    time and the sample counts, never beyond the budget, always at least one sample."""
    per_call = max(first_ms, 1e-3)
    affordable = max(1, int(policy.budget_s * 1e3 / per_call))
    warmup = min(policy.warmup, affordable - 1)
    wanted = max(policy.min_samples, int(policy.target_ms / per_call))
    return warmup, max(1, min(wanted, affordable - warmup, policy.max_samples))


def collect(fn: Callable[[], object], timer: Timer, first_ms: float, policy: TimingPolicy) -> list[float]:
    warmup, n = plan_calls(first_ms, policy)
    for _ in range(warmup):
        fn()
    return [timer(fn) for _ in range(n)]


def summarize(samples: list[float]) -> dict[str, float | None]:
    """Median and spread (interquartile range, min, max) in milliseconds."""
    if not samples:
        return {"time_ms": None, "time_iqr_ms": None, "time_min_ms": None, "time_max_ms": None}
    ordered = sorted(samples)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {
        "time_ms": statistics.median(ordered),
        "time_iqr_ms": q3 - q1,
        "time_min_ms": ordered[0],
        "time_max_ms": ordered[-1],
    }
