"""Uncertainty of a measurement: bootstrap intervals of medians and ratios, Holm's correction.

Percentile bootstrap with a fixed seed, so the same samples always give the same interval
(reports regenerate byte for byte). Samples come grouped by process where a trial ran in
several fresh processes: resampling processes first and samples within them second (a
hierarchical bootstrap) keeps the process-to-process spread in the interval, which samples
of one process alone cannot show.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
SEED = 20240601
LEVEL = 0.95

Groups = Sequence[Sequence[float]]  # samples per process; one group for one process
# The resampled medians of one process's samples, ``after`` the draws of a numerator of that
# many samples in the seeded stream (0: from its start): what ``flat_medians`` gives, or a
# caller's memo of it (the report's: a baseline is the numerator of many ratios).
Medians = Callable[[Sequence[float], int], np.ndarray]


@dataclass(frozen=True)
class Interval:
    """A point estimate, its bootstrap interval and the number of samples behind it."""

    value: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the interval's width: the `±` a table shows."""
        return (self.high - self.low) / 2

    def relative(self) -> float:
        return self.half_width / self.value if self.value else float("inf")


def _is_grouped(samples: Sequence[float] | Groups) -> bool:
    return bool(len(samples)) and isinstance(samples[0], (list, tuple, np.ndarray))


def _groups(samples: Sequence[float] | Groups) -> list[np.ndarray]:
    if _is_grouped(samples):
        groups = [np.asarray(g, dtype=float) for g in samples if len(g)]
    else:
        groups = [np.asarray(samples, dtype=float)] if len(samples) else []
    return groups


def _resampled_medians(groups: list[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of ``resamples`` hierarchical resamples: processes with replacement, then each
    chosen process's samples with replacement."""
    if len(groups) == 1:
        g = groups[0]
        return np.median(g[rng.integers(0, len(g), (resamples, len(g)))], axis=1)
    picks = rng.integers(0, len(groups), (resamples, len(groups)))
    out = np.empty(resamples)
    for i, row in enumerate(picks):
        out[i] = np.median(np.concatenate([groups[j][rng.integers(0, len(groups[j]), len(groups[j]))] for j in row]))
    return out


def _point(groups: list[np.ndarray]) -> float:
    return float(np.median(np.concatenate(groups)))


def median_interval(
    samples: Sequence[float] | Groups, resamples: int = RESAMPLES, seed: int = SEED, medians: Medians | None = None
) -> Interval | None:
    """Median and its 95% bootstrap interval; None without samples. ``medians``: as for
    ``ratio_distribution``."""
    groups = _groups(samples)
    if not groups:
        return None
    if medians is not None and not _is_grouped(samples):
        meds = medians(samples, 0)
    else:
        meds = _resampled_medians(groups, np.random.default_rng(seed), resamples)
    lo, hi = np.quantile(meds, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Interval(_point(groups), float(lo), float(hi), sum(len(g) for g in groups))


def scaled(iv: Interval | None, numerator: float) -> Interval | None:
    """``numerator / x`` of an interval of x (a time to a rate: TFLOP/s, tokens/s); the bounds swap."""
    if iv is None or iv.value <= 0 or iv.low <= 0:
        return None
    return Interval(numerator / iv.value, numerator / iv.high, numerator / iv.low, iv.n)


def flat_medians(samples: Sequence[float], after: int = 0, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The resampled medians of one process's samples that a ratio draws: a numerator's from the
    seeded stream's start (``after`` 0, as ``median_interval`` draws them too), a denominator's
    after its numerator's ``after`` samples. Which integers a draw takes depends on the stream and
    the counts alone, so the stream's state after a numerator is the same for every numerator
    of that many samples."""
    rng = np.random.default_rng(seed)
    if after:
        rng.bit_generator.state = _state_after(after, resamples, seed)
    return _resampled_medians([np.asarray(samples, dtype=float)], rng, resamples)


@functools.lru_cache(maxsize=1024)
def _state_after(after: int, resamples: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    rng.integers(0, after, (resamples, after))  # what _resampled_medians draws for one process
    return rng.bit_generator.state


def ratio_distribution(
    num: Sequence[float] | Groups,
    den: Sequence[float] | Groups,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    medians: Medians | None = None,
) -> tuple[float, np.ndarray]:
    """median(num) / median(den) and its bootstrap distribution (the two sets resampled
    independently). ``medians``: where both are one process's samples, what gives their resampled
    medians (``flat_medians`` or a memo of it)."""
    a, b = _groups(num), _groups(den)
    value = _point(a) / _point(b)
    if medians is not None and not _is_grouped(num) and not _is_grouped(den):
        return value, medians(num, 0) / medians(den, len(a[0]))
    rng = np.random.default_rng(seed)
    return value, _resampled_medians(a, rng, resamples) / _resampled_medians(b, rng, resamples)


def ratio_interval(
    num: Sequence[float] | Groups,
    den: Sequence[float] | Groups,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    medians: Medians | None = None,
) -> Interval | None:
    """Ratio of the medians of two independent sample sets (a speedup: baseline time over
    time; an efficiency; sparse vs dense) with its 95% bootstrap interval."""
    if not _groups(num) or not _groups(den):
        return None
    value, dist = ratio_distribution(num, den, resamples, seed, medians)
    lo, hi = np.quantile(dist, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    n = min(sum(len(g) for g in _groups(num)), sum(len(g) for g in _groups(den)))
    return Interval(value, float(lo), float(hi), n)


def ratio_p_value(
    num: Groups | Sequence[float], den: Groups | Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> float:
    """Two-sided bootstrap p-value of "the medians are equal": twice the share of resampled
    ratios on the far side of 1, never below 1 / (resamples + 1)."""
    _, dist = ratio_distribution(num, den, resamples, seed)
    tail = min(np.count_nonzero(dist <= 1.0), np.count_nonzero(dist >= 1.0))
    return min(1.0, 2 * (tail + 1) / (resamples + 1))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down correction: which hypotheses are rejected with the family-wise error
    rate kept at ``alpha`` across all of them."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def anomalous_efficiency(iv: Interval | None) -> bool:
    """An efficiency (or any ratio bounded by 1 in theory) above 1 beyond its interval."""
    return iv is not None and iv.low > 1.0


# an interval wider than WIDE of its value, one side ASYMMETRIC times the other, is printed as
# its two ends (a narrow one reads the same either way)
ASYMMETRIC = 3.0
WIDE = 0.05


def plus_minus(iv: Interval | None, fmt=lambda x: f"{x:.3g}", unit: str = "", with_n: bool = True) -> str:
    """``19.1 ms ±0.3 (n=20)``: the median, half the 95% interval in the same decimals, n; an
    interval far from symmetric as its ends, ``0.55 ms [0.5, 45] (n=3)``."""
    if iv is None:
        return "–"
    value = fmt(iv.value)
    text = f"{value}{' ' + unit if unit else ''}"
    below, above = iv.value - iv.low, iv.high - iv.value
    wide = iv.high - iv.low > WIDE * abs(iv.value)
    if iv.n >= 2 and wide and max(below, above) > ASYMMETRIC * min(below, above):
        # one side of the interval several times the other: a ± would hide where it lies
        text += f" [{fmt(iv.low)}, {fmt(iv.high)}]"
    elif iv.n >= 2:  # one sample has no interval
        decimals = len(value.split(".")[1]) if "." in value else 0
        spread = f"{iv.half_width:.{decimals}f}"
        if iv.half_width > 0 and float(spread) == 0:
            spread = f"{iv.half_width:.1g}"  # a spread below the value's last digit still shows
        text += f" ±{spread}"
    return f"{text} (n={iv.n})" if with_n else text
