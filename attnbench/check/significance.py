"""The time test of the regression check: whether a moved time is a change, judged against the
noise between the processes of that point (the unit a trial is repeated in) and a stated
minimum factor.

A process is the unit: samples of one process share its clocks, memory layout, the kernel the
library chose and the machine's load while it ran, so two processes of the same code differ
more than any interval from one process admits (asv times every benchmark in two processes for
this reason). Each process is one time: its median call on a GPU; on a CPU its fastest call,
since other work on a shared CPU (a preemption, a busy sibling core, evicted caches) only ever
adds time, and the fastest call is the one it disturbed least. On a CPU the calls' CPU time is
compared where both sides recorded it (``cpu_times_ms``): the load on the machine delays a
call, which its wall time shows, but adds little to the CPU time the call costs. A side's
time is the median of its processes' times. A change is claimed only when the ratio of the
two sides' times is

1. beyond the stated minimum ``factor`` (TIME_FACTORS: 1.10 on a GPU, 1.8 on a CPU), and
2. beyond the noise between processes of this point: the larger ratio between the times of
   two of its processes on one side, each side measured by its own processes. A noisy point
   elsewhere in the run says nothing about this one: each point is gated once its own
   processes agree.

A point that cannot be judged is *not gated*, with the reason: timed in one process on a side
(the noise between processes is unmeasured), too few samples, calls too short for the timer,
CPU processes at different thread counts, or a change within the noise. Never a regression.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Fewest samples per side for a side's time to mean anything.
MIN_SAMPLES = 5
# Fewest processes per side for the noise between processes to be measured at all.
MIN_PROCESSES = 2
# A call shorter than this is mostly the timer and the call around it (CUDA events resolve
# about 0.5 us; a Python call costs about 1 us).
MIN_CALL_MS = 0.01
# The stated minimum factor per device: a GPU's processes agree within a few percent; a CPU
# shared with other work moves by tens of percent between runs even with one thread.
TIME_FACTORS = {"cuda": 1.10, "cpu": 1.8}
NOT_GATED = "not gated"


@dataclass(frozen=True)
class TimeVerdict:
    verdict: str  # regression | improvement | unchanged | not gated
    ratio: float  # current time / baseline time
    baseline_ms: float  # each side's time: the median of its processes' times
    current_ms: float
    noise: float | None  # the noise between this trial's processes the ratio was held against
    evidence: str


def statistic(device: str, cpu_time: bool = False) -> str:
    """What one process's time is on this device, in words."""
    if device == "cuda":
        return "median call"
    return "fastest call's CPU time" if cpu_time else "fastest call"


def process_time(samples: list[float], device: str) -> float:
    return statistics.median(samples) if device == "cuda" else min(samples)


def side_time(processes: list[list[float]], device: str) -> float:
    return statistics.median(process_time(p, device) for p in processes)


def process_spread(processes: list[list[float]], device: str) -> float | None:
    """The largest ratio between the times of two processes of one trial on one side; None
    for fewer than two processes."""
    times = [process_time(p, device) for p in processes if p]
    if len(times) < MIN_PROCESSES or min(times) <= 0:
        return None
    return max(times) / min(times)


def unlike_threads(baseline: set[int], current: set[int]) -> str:
    """Why CPU processes of two sides cannot be compared by time ('' where they can): they ran
    at different thread counts (an unrecorded count is not held against a recorded one)."""
    if not (baseline and current) or (baseline == current and len(baseline) == 1):
        return ""
    counts = [", ".join(map(str, sorted(t))) for t in (baseline, current)]
    return (
        f"timed with {counts[0]} thread(s) on the baseline and {counts[1]} on the current: "
        "CPU times compare at one thread count (--threads)"
    )


def compare_times(
    baseline: list[list[float]],
    current: list[list[float]],
    device: str,
    factor: float,
    cpu_time: bool = False,
    unlike: str = "",
) -> TimeVerdict:
    """One trial's verdict. Each side is a list of processes, each a list of samples (CPU
    time per call where ``cpu_time``); the noise is this trial's own, the larger spread
    between processes of either side. ``unlike``: why the sides are not comparable at all."""
    b_ms, c_ms = side_time(baseline, device), side_time(current, device)
    ratio = c_ms / b_ms if b_ms > 0 else math.inf
    n = (
        f"{statistic(device, cpu_time)} of each of {len(baseline)} vs {len(current)} processes, "
        f"{sum(map(len, baseline))} vs {sum(map(len, current))} samples"
    )
    why_not = unlike or _not_gateable(baseline, current, min(b_ms, c_ms))
    if why_not:
        return TimeVerdict(NOT_GATED, ratio, b_ms, c_ms, None, f"{why_not}; {n}")
    noise = max(process_spread(baseline, device) or 1.0, process_spread(current, device) or 1.0)
    change = max(ratio, 1.0 / ratio)
    if change <= factor:
        return TimeVerdict("unchanged", ratio, b_ms, c_ms, noise, f"within x{factor:g}; {n}")
    if change <= noise:
        return TimeVerdict(
            NOT_GATED,
            ratio,
            b_ms,
            c_ms,
            noise,
            f"too noisy: two processes of one side differ by up to x{noise:.2f}, more than this change; {n}",
        )
    verdict = "regression" if ratio > 1 else "improvement"
    return TimeVerdict(
        verdict, ratio, b_ms, c_ms, noise, f"beyond x{factor:g} and the noise between its processes x{noise:.2f}; {n}"
    )


def _not_gateable(baseline: list[list[float]], current: list[list[float]], fastest_ms: float) -> str:
    """Why a point cannot be gated at all, or ''."""
    if min(len(baseline), len(current)) < MIN_PROCESSES:
        return (
            "timed in one process on a side: the noise between processes is unmeasured; "
            "time each point in several processes (--repeat 3)"
        )
    fewest = min(sum(map(len, baseline)), sum(map(len, current)))
    if fewest < MIN_SAMPLES:
        return f"{fewest} samples on a side: record at least {MIN_SAMPLES} (min_samples)"
    if fastest_ms < MIN_CALL_MS:
        return f"a call of {fastest_ms * 1000:.1f} us is too short to time (under {MIN_CALL_MS * 1000:g} us)"
    return ""
