"""Timing with raw samples kept: two timers per trial.

- **eager time**: one synchronised call per sample, dispatch included: CUDA events on the
  GPU, a monotonic clock on the CPU. What a caller of one attention call waits for.
- **GPU time** (CUDA only): the device's own time per call, with the host out of the way:
  a CUDA graph of one call replayed back to back between one event pair where the
  implementation can be captured, else many eager calls back to back between one pair,
  divided by their number. Sub-millisecond calls get an L2 flush before each call (its own
  time measured the same way and subtracted), so a small case is not timed from a warm cache.

Warm-up runs by time (GPU clocks take about a second to settle after idle) and the sample
plan is made from warm calls, never from the cold first one. We time ourselves instead of
calling triton's ``do_bench``: it allocates its flush buffer for the whole trial (moving an
out-of-memory point) and may keep one sample for slow calls; its rules (time-based warm-up,
flush, many samples) are followed here.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Eager time above this multiple of GPU time: the host (Python, dispatch, launch) is the
# bottleneck, not the kernel. 1.5 means at least a third of each call is host overhead.
HOST_BOUND_FACTOR = 1.5
# Calls faster than this get an L2 flush before each call when GPU time is taken.
FLUSH_BELOW_MS = 1.0
# The GPU-time sample covers at least this much work, so event resolution (~0.5 us) is noise.
GPU_SAMPLE_MS = 10.0


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 1  # warm-up calls after the first, at least
    warmup_s: float | None = None  # warm-up time, at least; None: 1 s on a GPU, none on the CPU
    min_samples: int = 10
    max_samples: int = 50
    target_ms: float = 1000.0  # aim for this much timed work per trial
    budget_s: float = 60.0  # the timing budget of a trial (not the per-call time limit)

    def warmup_seconds(self, cuda: bool) -> float:
        return (1.0 if cuda else 0.0) if self.warmup_s is None else self.warmup_s


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
    """(warmup calls, timed calls) for calls of ``first_ms`` (a warm call where the caller
    has one): aim for the target time and the sample counts, never beyond the budget,
    always at least one sample."""
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


@dataclass
class WarmUp:
    calls: int
    seconds: float
    last_ms: float  # median of the last few warm-up calls: what the sample plan starts from


def warm_up(
    fn: Callable[[], object],
    timer: Callable[[Callable[[], object]], float],
    policy: TimingPolicy,
    cuda: bool,
    settled: Callable[[], bool] = lambda: True,
    cap_s: float | None = None,
) -> WarmUp:
    """Call ``fn`` until ``policy``'s warm-up time and calls have passed and ``settled()``
    says the clocks are steady, for at most ``cap_s`` (half the budget by default)."""
    want_s = policy.warmup_seconds(cuda)
    cap_s = policy.budget_s / 2 if cap_s is None else cap_s
    times: list[float] = []
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        done = len(times) >= policy.warmup and elapsed >= want_s and settled()
        if done or (times and elapsed >= max(cap_s, want_s)):
            break
        times.append(timer(fn))
    last = times[-3:] or [0.0]
    return WarmUp(len(times), time.monotonic() - t0, statistics.median(last))


def timed_samples(
    fn: Callable[[], object], timer: Callable[[Callable[[], object]], float], warm_ms: float, policy: TimingPolicy
) -> list[float]:
    """Eager samples planned from a warm call (the warm-up is already done)."""
    _, n = plan_calls(warm_ms, TimingPolicy(**{**policy.__dict__, "warmup": 0}))
    return [timer(fn) for _ in range(n)]


def gpu_samples(fn: Callable[[], object], warm_ms: float, n: int, flush_bytes: int = 0) -> tuple[list[float], str]:
    """GPU time per call, ``n`` samples, and how it was taken (``cuda-graph`` or
    ``back-to-back``; ``+l2-flush`` where a flush preceded each call)."""
    graph = _capture(fn)
    run = graph.replay if graph is not None else fn
    how = "cuda-graph" if graph is not None else "back-to-back"
    reps = max(1, int(GPU_SAMPLE_MS / max(warm_ms, 1e-3)))
    flush = None
    if flush_bytes and warm_ms < FLUSH_BELOW_MS:
        flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
        how += "+l2-flush"
    samples = []
    for _ in range(n):
        work = _between_events(run, reps, flush)
        overhead = _between_events(None, reps, flush) if flush is not None else 0.0
        samples.append(max(work - overhead, 0.0) / reps)
    del graph, flush
    return samples, how


def _between_events(run: Callable[[], object] | None, reps: int, flush: torch.Tensor | None) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        if run is not None:
            run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def _capture(fn: Callable[[], object]):
    """A CUDA graph of one call of ``fn``, or None where the implementation cannot be
    captured (host synchronisation, data-dependent shapes, collectives, autograd in some
    versions)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:  # anything capture rejects means "time it eagerly, back to back"
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None


def gpu_time(fn: Callable[[], object], eager: list[float], budget_s: float | None = None) -> dict[str, object]:
    """Row fields of GPU time for a step whose eager samples are ``eager``, in at most half
    of ``budget_s`` (at least 3 samples); a failure (capture or flush out of memory, say)
    leaves the eager row intact and says why."""
    from attnbench.measure import oom

    warm_ms = statistics.median(eager)
    n = len(eager)
    if budget_s:
        n = min(n, max(3, int(budget_s * 1e3 / 2 / max(warm_ms, GPU_SAMPLE_MS))))
    try:
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or 0
        samples, how = gpu_samples(fn, warm_ms, n, 2 * l2)
        return {"gpu_times_ms": samples, "gpu_timer": how}
    except Exception as exc:  # GPU time is extra: its failure must not lose the eager row
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return {"gpu_times_ms": [], "gpu_timer": f"failed: {oom.one_line(exc)}"}


def time_intervals(row: dict[str, object]) -> dict[str, object]:
    """Intervals of the eager and GPU medians, GPU time, the host's share of an eager call."""
    from attnbench.measure import stats

    out: dict[str, object] = {}
    eager = stats.median_interval(row.get("times_ms") or [])
    if eager:
        out.update(eager.to_row("time"))
    gpu = stats.median_interval(row.get("gpu_times_ms") or [])
    if gpu:
        out.update(gpu_time_ms=gpu.value, **gpu.to_row("gpu_time"))
        if eager and eager.value > 0:
            out.update(
                host_bound=host_bound(eager.value, gpu.value), dispatch_share=max(0.0, 1 - gpu.value / eager.value)
            )
    return out


def host_bound(eager_ms: float | None, gpu_ms: float | None) -> bool | None:
    """Eager time well above GPU time: the call waits on the host, not the kernel."""
    if not eager_ms or not gpu_ms:
        return None
    return eager_ms > HOST_BOUND_FACTOR * gpu_ms


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
