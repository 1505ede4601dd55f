"""The capacity model: peak memory fitted against sequence length from a series' successful
trials, solved for the longest sequence a given memory holds; the memory a series may use on
its device; and the time of one call extrapolated along the implementation's FLOPs.

Pure Python: the max-seq search predicts with it before it probes (``attnbench.sweeps.search``)
and the report predicts other GPU sizes with it (``attnbench.report.fit``).

Each series gets a least-squares fit of its measured peaks over its lengths: linear for
implementations whose memory grows with N, quadratic for those that hold N x N scores. The fit
is solved exactly in rationals and its roots in closed form, so every machine (whatever its
BLAS, threads or SIMD) gets the same bits: the report regenerates byte for byte.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol


class GpuPeaks(Protocol):
    """One GPU's readings in a trial row (``attnbench.results.schema.GpuMemory``)."""

    nvml_used_peak: int | None
    max_memory_reserved: int | None
    max_memory_allocated: int | None


class Machine(Protocol):
    """The machine a row records (``attnbench.results.schema.Environment``)."""

    gpus: list[dict[str, Any]] | None


class Trial(Protocol):
    """What the capacity model reads of a trial row (``attnbench.results.schema.Trial``, a
    layer above this one, has it all)."""

    status: str
    seq_len: int
    device: str
    world_size: int | None
    memory_limit: int | None
    device_total_bytes: int | None
    max_memory_reserved: int | None
    peak_bytes: int | None
    gpus: list[GpuPeaks] | None
    env: Machine | None
    impl_source: dict[str, Any] | None


# Backends that hold N x N scores whatever the implementation declares (sdpa's math).
QUADRATIC_BACKENDS = {"math"}
# Trials nearest the limit say most about what is not the allocator's near the limit.
OVERHEAD_TRIALS = 3


def memory_degree(impl: str, backend: str | None = None, row: Trial | None = None) -> int:
    """The fit's degree: the implementation's declared memory order (``ImplSpec.memory_order``,
    recorded in the rows of outside implementations), 2 when a quadratic backend ran."""
    from attnbench import impls

    recorded = {"impl_source": row.impl_source} if row is not None else None
    return 2 if impls.memory_order(impl, recorded) == 2 or backend in QUADRATIC_BACKENDS else 1


# Growth faster than linear, read from the peaks themselves over the three longest lengths
# n1 < n2 < n3 (nearest any limit, past the fixed costs of short trials): the slope between the
# last two against the slope between the first two. A line keeps it (ratio 1); a + b N^2 raises
# it by (n2 + n3) / (n1 + n2) at most (2 at doubling lengths). A curve is read where the ratio is
# at least halfway to that and not far past it: a larger jump is fixed costs giving way to a
# line (a process's resident set at short lengths), not a curve.
MIN_LENGTHS_FOR_CURVE = 3
CURVE_JUMP_FACTOR = 1.5


def grows_faster_than_linear(seq_lens: list[int], peaks: list[float]) -> bool:
    """Whether the peaks at the three longest lengths bend upward as a quadratic does (above)."""
    by_length: dict[int, list[float]] = {}
    for n, p in zip(seq_lens, peaks):
        by_length.setdefault(n, []).append(p)
    if len(by_length) < MIN_LENGTHS_FOR_CURVE:
        return False
    (n1, p1), (n2, p2), (n3, p3) = [(n, statistics.fmean(by_length[n])) for n in sorted(by_length)[-3:]]
    before, after = (p2 - p1) / (n2 - n1), (p3 - p2) / (n3 - n2)
    if before <= 0 or after <= 0:
        return False
    quadratic = (n2 + n3) / (n1 + n2)
    return 1 + (quadratic - 1) / 2 <= after / before <= CURVE_JUMP_FACTOR * quadratic


def fitted_degree(seq_lens: list[int], peaks: list[float], declared: int) -> int:
    """The memory model's degree: the declared one, or 2 where the peaks grow faster than a
    line (a plugin that holds N x N without saying so is fitted as what it is)."""
    return 2 if declared >= 2 or grows_faster_than_linear(seq_lens, peaks) else declared


def memory_model(seq_lens: list[int], peaks: list[float], declared: int) -> MemoryFit | None:
    """The least-squares memory fit of ``fitted_degree``; a curve found in the peaks stands only
    where the curve through all of them bends upward too (its N^2 term positive), else the
    declared degree's (a few MiB of noise at the longest lengths is no quadratic)."""
    degree = fitted_degree(seq_lens, peaks, declared)
    fit = fit_memory(seq_lens, peaks, degree)
    if degree > declared and (fit is None or fit.coef[-1] <= 0):
        return fit_memory(seq_lens, peaks, declared)
    return fit


@dataclass(frozen=True)
class MemoryFit:
    """peak(N) = coef[0] + coef[1] N (+ coef[2] N^2), fitted by least squares."""

    degree: int
    coef: tuple[float, ...]
    seq_lens: tuple[int, ...]
    peaks: tuple[float, ...]

    def __call__(self, n: float) -> float:
        return float(sum(c * n**i for i, c in enumerate(self.coef)))

    def errors(self) -> list[float]:
        """Relative error of the fit on each measured point."""
        return [self(n) / p - 1 for n, p in zip(self.seq_lens, self.peaks)]

    @property
    def max_error(self) -> float:
        return max(abs(e) for e in self.errors())

    @property
    def error_at_largest(self) -> float:
        """The fit's error at the longest measured length, the one nearest any prediction."""
        return self.errors()[max(range(len(self.seq_lens)), key=lambda i: self.seq_lens[i])]

    def max_seq(self, budget: float) -> float | None:
        """The length at which the fitted peak first reaches ``budget`` bytes; None if it never
        does (no limit follows from the fit) or not even N = 0 fits."""
        if budget <= self.coef[0]:
            return None
        c, b, a = self.coef[0] - budget, self.coef[1], (self.coef[2] if self.degree == 2 else 0.0)
        if a == 0:
            return -c / b if b > 0 else None
        disc = b * b - 4 * a * c
        if disc < 0:
            return None
        q = -0.5 * (b + math.copysign(math.sqrt(disc), b))  # the stable pair of roots: q / a, c / q
        positive = [r for r in (q / a, c / q if q else math.inf) if 0 < r < math.inf]
        return min(positive) if positive else None

    def formula(self) -> str:
        from attnbench.units import format_bytes

        terms = [format_bytes(self.coef[0])] + [
            f"{format_bytes(c)}·N" + ("²" if i == 2 else "") for i, c in enumerate(self.coef[1:], 1)
        ]
        return " + ".join(terms).replace("+ -", "- ")


def fit_memory(seq_lens: list[int], peaks: list[float], degree: int) -> MemoryFit | None:
    """Least-squares fit; None with fewer distinct lengths than the model has coefficients."""
    if len(set(seq_lens)) < degree + 1:
        return None
    coef = least_squares([[n**i for i in range(degree + 1)] for n in seq_lens], peaks)
    return MemoryFit(degree, coef, tuple(seq_lens), tuple(float(p) for p in peaks))


def least_squares(rows: list[list[float]], y: list[float]) -> tuple[float, ...]:
    """The coefficients c minimising |rows @ c - y|, solved exactly (normal equations in
    rationals, Gauss-Jordan elimination), then rounded once: the same bits on every machine.
    The columns must be independent (distinct lengths)."""
    a = [[Fraction(x) for x in r] for r in rows]
    k = len(a[0])
    m = [
        [sum((r[i] * r[j] for r in a), Fraction(0)) for j in range(k)]
        + [sum((r[i] * Fraction(t) for r, t in zip(a, y)), Fraction(0))]
        for i in range(k)
    ]
    for col in range(k):
        pivot = next(i for i in range(col, k) if m[i][col] != 0)
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(k):
            if i != col and m[i][col] != 0:
                f = m[i][col] / m[col][col]
                m[i] = [x - f * p for x, p in zip(m[i], m[col])]
    return tuple(float(m[i][k] / m[i][i]) for i in range(k))


def measured_budget(rows: list[Trial]) -> tuple[float | None, float | None, float | None, str]:
    """(device bytes, non-allocator bytes, allocator budget, assumption) from a series' trials.

    What the allocator can use is less than the device: the CUDA context, library modules and
    the driver's reservation take the rest. That part is measured: NVML device memory used at a
    trial's peak minus that trial's ``max_memory_reserved`` (in a fresh process per trial it only
    grows, so both peaks coincide), the median over the series' longest successful trials, and
    assumed the same on every GPU size. The allocator's cache is not subtracted: before failing,
    the allocator frees it and retries."""
    good = sorted((r for r in rows if r.status == "ok"), key=lambda r: r.seq_len)
    head = rows[0]
    limit = head.memory_limit
    if head.device != "cuda":
        if not limit:
            return None, None, None, "CPU run without --memory-limit: no memory bound was measured"
        return (
            limit,
            0.0,
            float(limit),
            (
                "CPU: the trial's memory limit (an address-space cap) is the budget for "
                "its resident-memory peak; indicative only"
            ),
        )
    totals = [r.device_total_bytes for r in rows if r.device_total_bytes]
    if not totals:
        env = head.env
        totals = [g.get("memory_total_bytes") for g in ((env.gpus if env else None) or [])[:1]]
    total = float(totals[0]) if totals and totals[0] else None
    if total is None:
        return None, None, None, "the device's total memory is not in the rows"
    extra = []
    for r in good[-OVERHEAD_TRIALS:]:
        per_gpu = [
            g.nvml_used_peak - g.max_memory_reserved
            for g in r.gpus or []
            if g.nvml_used_peak is not None and g.max_memory_reserved is not None
        ]
        if per_gpu:
            extra.append(max(per_gpu))
    if extra:
        overhead = max(0.0, statistics.median(extra))
        note = (
            "GPU: Set Aside is what the allocator cannot use: NVML device memory used at the peak minus "
            f"max_memory_reserved, the median over the {OVERHEAD_TRIALS} longest successful trials (CUDA "
            "context, library modules, driver reservation); the allocator's cache is not set aside, as it is "
            "freed before an allocation fails"
        )
    else:
        overhead = 0.0
        note = "GPU without NVML readings: nothing is set aside for the CUDA context, so predictions run high"
    budget = total - overhead
    if limit and limit < budget:
        budget, note = float(limit), "GPU with --memory-limit: the limit caps the allocator and is the budget"
    return total, overhead, budget, note


def fitted_peak(row: Trial) -> float | None:
    """The memory a trial needed: on a GPU the allocator's reserved peak (per GPU, the fullest
    rank's), elsewhere ``peak_bytes``. Reserved, the allocator's whole footprint: an allocation
    fails when that cannot grow, and where a pass fragments its segments (a backward's large
    transient buffers) it outgrows ``max_memory_allocated`` (dilated forward plus backward on an
    H100: a fit of allocated peaks predicted 10% beyond the measured limit, one of reserved peaks
    1% short of it)."""
    if row.device == "cuda" and row.max_memory_reserved:
        return row.max_memory_reserved
    if int(row.world_size or 1) > 1:
        peaks = [g.max_memory_allocated for g in row.gpus or [] if g.max_memory_allocated is not None]
        if peaks:
            return max(peaks)
    return row.peak_bytes


def fit_leading(seq_lens: list[int], peaks: list[float], degree: int) -> MemoryFit | None:
    """peak(N) = c0 + c_d N^degree by least squares: the model's leading term alone, from two
    lengths where a full fit of a quadratic needs three. The lower terms' growth is taken for
    the leading term's, so the fit grows faster than the peak and predicts its limit short of it."""
    if len(set(seq_lens)) < 2:
        return None
    c0, cd = least_squares([[1, n**degree] for n in seq_lens], peaks)
    coef = (c0, *([0.0] * (degree - 1)), cd)
    return MemoryFit(degree, coef, tuple(seq_lens), tuple(float(p) for p in peaks))


@dataclass(frozen=True)
class TimeModel:
    """time(N) = time(N0) * (N / N0) ** exponent, from the longest successful call N0: the
    exponent is the growth of the call's FLOPs where they are known (time follows them once
    fixed costs are small; the times of short calls are mostly noise and dispatch), else of
    the time between the two longest successes; clamped to [1, 3]."""

    seq_len: int
    time_ms: float
    exponent: float

    def __call__(self, n: float) -> float:
        return self.time_ms * (n / self.seq_len) ** self.exponent

    def max_seq(self, limit_ms: float) -> float:
        """The length at which a call is predicted to take ``limit_ms``."""
        return self.seq_len * (limit_ms / self.time_ms) ** (1 / self.exponent)


def fit_time(points: list[tuple[int, float, float | None]]) -> TimeModel | None:
    """(length, time of one warm call in ms, FLOPs or None) of successful trials; None
    without two lengths of positive time (one point says nothing of the growth)."""
    points = sorted(p for p in points if p[1] and p[1] > 0)
    if len({p[0] for p in points}) < 2:
        return None
    (n0, t0, f0), (n1, t1, f1) = points[-2], points[-1]
    grows = (f1 / f0) if f0 and f1 else (t1 / t0)
    return TimeModel(n1, t1, min(3.0, max(1.0, math.log(grows) / math.log(n1 / n0))))
