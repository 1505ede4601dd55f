"""The timing policy and the statistics of samples, pure: the timers themselves (CUDA
events, CUDA-graph replays) are in ``measure.core``. The clocks of a trial:

- **eager time**: one synchronised call per sample, dispatch included: CUDA events on the
  GPU, a monotonic clock on the CPU. What a caller of one attention call waits for.
- **GPU time** (CUDA only): the device's own time per call, with the host out of the way:
  a CUDA graph of one call replayed back to back between one event pair where the
  implementation can be captured, else many eager calls back to back between one pair,
  divided by their number. Sub-millisecond calls get an L2 flush before each call (its own
  time measured the same way and subtracted), so a small case is not timed from a warm cache.
- **CPU time** (CPU only): the process's CPU time per timed call, taken with the eager
  sample: a shared CPU's other work delays a call (its wall time) but adds nothing to the
  CPU time it costs, so this is what a regression check compares on a CPU.

Warm-up runs by time (GPU clocks take about a second to settle after idle) and the sample
plan is made from warm calls, never from the cold first one. We time ourselves instead of
calling triton's ``do_bench``: it allocates its flush buffer for the whole trial (moving an
out-of-memory point) and may keep one sample for slow calls; its rules (time-based warm-up,
flush, many samples) are followed here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Eager time above this multiple of GPU time: the host (Python, dispatch, launch) is the
# bottleneck, not the kernel. 1.5 means at least a third of each call is host overhead.
HOST_BOUND_FACTOR = 1.5


# A cold first call on CUDA may take this many times the per-call limit (cold_call_limit_s);
# outside code being imported and built gets as long, from its import on.
COLD_CALL_FACTOR = 3.0


def cold_call_limit_s(limit_s: float, cuda: bool) -> float:
    """How long the first call may take. On CUDA a cold call carries library setup (handles,
    autotuning), so it may take three times the limit and a warm call decides; on the CPU a
    cold call is a warm one and the limit is the limit."""
    return COLD_CALL_FACTOR * limit_s if cuda else limit_s


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 1  # warm-up calls after the first, at least
    warmup_s: float | None = None  # warm-up time, at least; None: 1 s on a GPU, none on the CPU
    min_samples: int = 10
    max_samples: int = 50
    target_ms: float = 1000.0  # aim for this much timed work per trial
    budget_s: float = 60.0  # the timing budget of a trial (not the per-call time limit)
    # CPU calls: torch's intra-op threads (None: torch's default, one per core). On a CPU
    # shared with other work one preempted thread of a parallel region stalls the others, and
    # processes of the same code land several-fold apart; a single thread is only delayed.
    threads: int | None = None

    def warmup_seconds(self, cuda: bool) -> float:
        return (1.0 if cuda else 0.0) if self.warmup_s is None else self.warmup_s


def plan_calls(first_ms: float, policy: TimingPolicy) -> tuple[int, int]:
    """(warmup calls, timed calls) for calls of ``first_ms`` (a warm call where the caller
    has one): aim for the target time and the sample counts, never beyond the budget,
    always at least one sample."""
    per_call = max(first_ms, 1e-3)
    affordable = max(1, int(policy.budget_s * 1e3 / per_call))
    warmup = min(policy.warmup, affordable - 1)
    wanted = max(policy.min_samples, int(policy.target_ms / per_call))
    return warmup, max(1, min(wanted, affordable - warmup, policy.max_samples))


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
    warm_ms: tuple[float, ...] = (),
) -> WarmUp:
    """Call ``fn`` until ``policy``'s warm-up time and calls have passed and ``settled()``
    says the clocks are steady, for at most ``cap_s`` (half the budget by default), counting
    the ``warm_ms`` calls already made warm. A call that would end past the cap is not started
    once the warm-up time has passed: a 4 s call under a 5 s cap warms up once, or not at all
    after a warm call."""
    want_s = policy.warmup_seconds(cuda)
    cap_s = policy.budget_s / 2 if cap_s is None else cap_s
    # calls already made warm (the call that decided the time limit) count as warm-up done
    times: list[float] = list(warm_ms)
    t0 = time.monotonic() - sum(warm_ms) / 1e3
    while True:
        elapsed = time.monotonic() - t0
        done = len(times) >= policy.warmup and elapsed >= want_s and settled()
        if done or (times and elapsed >= want_s and elapsed + times[-1] / 1e3 > cap_s):
            break
        times.append(timer(fn))
    last = times[-3:] or [0.0]
    return WarmUp(len(times) - len(warm_ms), time.monotonic() - t0, statistics.median(last))


def timed_samples(
    fn: Callable[[], object], timer: Callable[[Callable[[], object]], float], warm_ms: float, policy: TimingPolicy
) -> list[float]:
    """Eager samples planned from a warm call (the warm-up is already done)."""
    _, n = plan_calls(warm_ms, TimingPolicy(**{**policy.__dict__, "warmup": 0}))
    return [timer(fn) for _ in range(n)]


@dataclass
class SampleStatistics:
    """Every statistic a row carries of its samples, named as the row's fields: the eager
    median and spread, the intervals of the eager and GPU medians, the host's share of a call."""

    time_ms: float | None = None  # median eager sample
    time_iqr_ms: float | None = None
    time_min_ms: float | None = None
    time_max_ms: float | None = None
    time_ci_low: float | None = None  # the median's 95% interval
    time_ci_high: float | None = None
    time_n: int | None = None
    gpu_time_ms: float | None = None  # median GPU time
    gpu_time_ci_low: float | None = None
    gpu_time_ci_high: float | None = None
    gpu_time_n: int | None = None
    host_bound: bool | None = None
    dispatch_share: float | None = None


def sample_statistics(times_ms: list[float], gpu_times_ms: list[float] | None = None) -> SampleStatistics:
    """The statistics of eager samples and GPU times: the one place they are computed, whether
    the samples came from one process or the slowest of several ranks."""
    from attnbench.measure import stats

    out = SampleStatistics(**summarize(times_ms))
    eager = stats.median_interval(times_ms or [])
    if eager:
        out.time_ci_low, out.time_ci_high, out.time_n = eager.low, eager.high, eager.n
    gpu = stats.median_interval(gpu_times_ms or [])
    if gpu:
        out.gpu_time_ms, out.gpu_time_ci_low, out.gpu_time_ci_high, out.gpu_time_n = gpu.value, gpu.low, gpu.high, gpu.n
        if eager and eager.value > 0:
            out.host_bound = host_bound(eager.value, gpu.value)
            out.dispatch_share = max(0.0, 1 - gpu.value / eager.value)
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
