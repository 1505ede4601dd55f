"""The time test of the regression check: whether a moved median is a change, by a bootstrap
of the ratio of medians with the processes a trial ran in as the resampled unit."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from attnbench.measure import stats

# Fewest samples per side for a bootstrap interval of a median to mean anything.
MIN_SAMPLES = 5


@dataclass(frozen=True)
class TimeVerdict:
    verdict: str  # regression | improvement | inconclusive | unchanged
    ratio: float  # current median / baseline median
    p_value: float | None
    evidence: str


def resamples_for(tests: int, alpha: float) -> int:
    """Enough bootstrap resamples that the smallest p-value, 2 / (B + 1), can pass Holm's
    strictest threshold, alpha / tests."""
    return max(stats.RESAMPLES, math.ceil(4 * max(tests, 1) / alpha))


def compare_times(
    baseline: list[list[float]],
    current: list[list[float]],
    factor: float,
    alpha: float,
    resamples: int = stats.RESAMPLES,
) -> TimeVerdict:
    """asv's rule on the right unit: the median moved beyond ``factor`` and the bootstrap
    interval of the ratio of medians excludes 1 (p <= ``alpha`` before Holm's correction,
    which the comparison applies across all trials).

    Each side is a list of processes, each a list of samples. Samples of one process are
    not independent (clocks, allocator and kernel choice are shared), so the bootstrap
    resamples processes first: with several processes (``--repeat``) the process-to-process
    spread is in the test; with one process per side only the factor guards against it.
    """
    b_all = [x for g in baseline for x in g]
    c_all = [x for g in current for x in g]
    ratio = statistics.median(c_all) / statistics.median(b_all) if statistics.median(b_all) > 0 else math.inf
    n = f"{len(b_all)} vs {len(c_all)} samples in {len(baseline)} vs {len(current)} processes"
    slower, faster = ratio > factor, ratio < 1.0 / factor
    if not (slower or faster):
        return TimeVerdict("unchanged", ratio, None, f"within x{factor:g} ({n})")
    if min(len(b_all), len(c_all)) < MIN_SAMPLES:
        return TimeVerdict(
            "inconclusive",
            ratio,
            None,
            f"{n}: too few for an interval; record at least {MIN_SAMPLES} samples per trial (min_samples)",
        )
    p = stats.ratio_p_value(current, baseline, resamples)
    iv = stats.ratio_interval(current, baseline, resamples)
    where = f"ratio 95% interval [{iv.low:.3f}, {iv.high:.3f}], p = {p:.2g}, {n}"
    if p > alpha:
        return TimeVerdict("unchanged", ratio, p, f"not significant: {where}")
    return TimeVerdict("regression" if slower else "improvement", ratio, p, where)
