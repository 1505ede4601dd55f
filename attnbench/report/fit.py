"""Capacity prediction: fit peak memory against sequence length from a series' successful
trials, then solve the fit for the longest sequence a given memory holds.

The seeds extrapolated one number linearly. Here each series gets a least-squares fit of
its measured peaks over its lengths: linear for implementations whose memory grows with N,
quadratic for those that hold N x N scores; the fit's error on the measured points is shown
next to every prediction. On a GPU the peak fitted is ``max_memory_reserved``, the
allocator's whole footprint: an allocation fails when that cannot grow, and where a pass
fragments its segments (a backward's large transient buffers) the footprint outgrows
``max_memory_allocated`` (dilated forward plus backward on an H100: a fit of allocated
peaks predicted 10% beyond the measured limit, one of reserved peaks 1% short of it).
Elsewhere it is ``peak_bytes``.

What the allocator can use is less than the device: the CUDA context, library modules and
the driver's reservation take the rest. That part is measured: NVML device memory used at a
trial's peak minus that trial's ``max_memory_reserved`` (the allocator's whole footprint;
in a fresh process per trial it only grows, so both peaks coincide), the median over the
series' longest successful trials, and assumed the same on every GPU size. The allocator's
cache is not subtracted: before failing, the allocator frees it and retries.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from attnbench.report.data import gpu_memory, ok, peak_per_gpu, trials, world_size
from attnbench.report.sweep_tables import max_seq_summary, series_groups
from attnbench.schema import Row, Trial

GIB = 2**30
ACCURACY_TARGET = 0.05
MIN_TRIALS_FOR_TARGET = 4
# Backends that hold N x N scores whatever the implementation declares (sdpa's math).
QUADRATIC_BACKENDS = {"math"}
# Trials nearest the limit say most about what is not the allocator's near the limit.
OVERHEAD_TRIALS = 3


def memory_degree(impl: str, backend: str | None = None, row: Row | None = None) -> int:
    """The fit's degree: the implementation's declared memory order (``ImplSpec.memory_order``,
    recorded in the rows of outside implementations), 2 when a quadratic backend ran."""
    from attnbench import impls

    recorded = {"impl_source": row.impl_source} if row is not None else None
    return 2 if impls.memory_order(impl, recorded) == 2 or backend in QUADRATIC_BACKENDS else 1


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
        roots = np.polynomial.polynomial.polyroots([self.coef[0] - budget, *self.coef[1:]])
        real = [r.real for r in roots if abs(r.imag) < 1e-9 * max(1.0, abs(r.real)) and r.real > 0]
        if not real:
            return None
        return float(min(real))

    def formula(self) -> str:
        from attnbench.units import format_bytes, format_bytes_short

        terms = [format_bytes(self.coef[0])] + [
            f"{format_bytes_short(c)}·N" + ("²" if i == 2 else "") for i, c in enumerate(self.coef[1:], 1)
        ]
        return " + ".join(terms).replace("+ -", "- ")


def fit_memory(seq_lens: list[int], peaks: list[float], degree: int) -> MemoryFit | None:
    """Least-squares fit; None with fewer distinct lengths than the model has coefficients."""
    if len(set(seq_lens)) < degree + 1:
        return None
    coef = np.polynomial.polynomial.polyfit(np.asarray(seq_lens, float), np.asarray(peaks, float), degree)
    return MemoryFit(degree, tuple(float(c) for c in coef), tuple(seq_lens), tuple(float(p) for p in peaks))


# --- per series ----------------------------------------------------------------------------


@dataclass
class Capacity:
    series: str
    label: str
    impl: str
    head: Trial  # the series' first trial: its settings
    world_size: int
    fit: MemoryFit | None
    degree: int  # of the memory model: 1 linear, 2 quadratic
    successful: int  # successful trials with a peak
    successful_lengths: int  # distinct lengths among them
    device: str
    device_total: float | None  # bytes the measured device (or limit) has
    overhead: float | None  # bytes not available to the allocator
    budget: float | None  # bytes the fitted peak may reach on the measured device
    budget_note: str
    measured_max: int | None
    stopped_by: str | None

    @property
    def predicted(self) -> float | None:
        return self.fit.max_seq(self.budget) if self.fit and self.budget else None

    @property
    def error(self) -> float | None:
        """Prediction vs measurement on the measured device, where memory stopped the search."""
        if self.predicted is None or not self.measured_max or self.stopped_by != "memory":
            return None
        return self.predicted / self.measured_max - 1

    @property
    def target_applies(self) -> bool:
        return self.successful >= MIN_TRIALS_FOR_TARGET and self.stopped_by == "memory" and self.device == "cuda"

    def predict_for(self, device_bytes: float) -> float | None:
        """Longest sequence on a device of ``device_bytes`` (same non-allocator memory)."""
        if not self.fit:
            return None
        return self.fit.max_seq(device_bytes - (self.overhead or 0))


def fit_miss_cause(c: Capacity) -> str:
    """The likely reason a capacity prediction misses the measured maximum (``c.error`` set)."""
    if c.error > 0:
        return "predicted high: the peak grows faster near the limit than over the fitted lengths (fragmentation, workspace)"
    return "predicted low: the fitted lengths are small, where fixed costs steepen the slope"


def _measured_budget(rows: list[Trial]) -> tuple[float | None, float | None, float | None, str]:
    """(device bytes, non-allocator bytes, allocator budget, assumption) from a series' trials."""
    good = sorted(ok(rows), key=lambda r: r.seq_len)
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
        totals = [g.get("memory_total_bytes") for g in ((head.env.gpus if head.env else None) or [])[:1]]
    total = float(totals[0]) if totals and totals[0] else None
    if total is None:
        return None, None, None, "the device's total memory is not in the rows"
    extra = []
    for r in good[-OVERHEAD_TRIALS:]:
        per_gpu = [
            g["nvml_peak"] - g["reserved"]
            for g in gpu_memory(r)
            if g["nvml_peak"] is not None and g["reserved"] is not None
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
    rank's), elsewhere ``peak_bytes``."""
    if row.device == "cuda" and row.max_memory_reserved:
        return row.max_memory_reserved
    return peak_per_gpu(row)


def capacities(rows: list[Row]) -> list[Capacity]:
    """One capacity estimate per series (max-seq and points trials of one workload together)."""
    stops = {s["series"]: s for s in max_seq_summary(rows)}
    out = []
    for key, series_rows in series_groups(rows).items():
        head = series_rows[0]
        good = [r for r in ok(series_rows) if fitted_peak(r)]
        backend = next((r.backend for r in good if r.backend), None)
        degree = memory_degree(head.impl, backend, head)
        fit = fit_memory([r.seq_len for r in good], [fitted_peak(r) for r in good], degree)
        total, overhead, budget, note = _measured_budget(series_rows)
        stop = stops.get(key)
        out.append(
            Capacity(
                series=key,
                label=head.label or head.impl,
                impl=head.impl,
                head=head,
                world_size=world_size(head),
                fit=fit,
                degree=degree,
                successful=len(good),
                successful_lengths=len({r.seq_len for r in good}),
                device=head.device,
                device_total=total,
                overhead=overhead,
                budget=budget,
                budget_note=note,
                measured_max=stop["max_seq_len"] if stop else None,
                stopped_by=stop["stopped_by"] if stop else None,
            )
        )
    return out


def single_device_capacities(rows: list[Row]) -> list[Capacity]:
    return [c for c in capacities(rows) if c.world_size == 1]


# --- `attnbench predict` ---------------------------------------------------------------------------


def predict_lines(impl: str, gpu_memory: str, source, label: str | None = None) -> list[str]:
    """One line per measured series of ``impl``: its longest sequence on a device of ``gpu_memory``."""
    from attnbench import impls
    from attnbench.errors import AttnbenchError
    from attnbench.report.data import load
    from attnbench.units import format_tokens, parse_bytes

    device_bytes = parse_bytes(gpu_memory)
    results = load(source)
    measured = sorted({r.impl for r in trials(results.rows)})
    if impl not in measured and impl not in impls.names():
        raise AttnbenchError(f"unknown implementation {impl!r}: the results hold {', '.join(measured) or 'no trials'}")
    lines = []
    for machine, rows in results.by_machine.items():
        for c in capacities(rows):
            if c.impl != impl or (label and c.label != label):
                continue
            if not c.fit:
                continue
            n = c.predict_for(device_bytes)
            where = (
                f"{c.label} [{machine}, {c.head.dtype}, B={c.head.batch}, H={c.head.heads}, "
                f"D={c.head.head_dim}, {c.head.mode}" + (f", {c.world_size} GPUs" if c.world_size > 1 else "") + "]"
            )
            if n is None:
                lines.append(
                    f"{where}: no sequence fits in {gpu_memory} (the fit needs {c.fit(0) / GIB:.2f} GiB at N=0 "
                    f"plus {(c.overhead or 0) / GIB:.2f} GiB set aside)"
                )
                continue
            measured_text = f"; measured max {format_tokens(c.measured_max)} on this device" if c.measured_max else ""
            lines.append(
                f"{where}: about {format_tokens(int(n))} tokens on {gpu_memory} ({'quadratic' if c.fit.degree == 2 else 'linear'} "
                f"fit of {c.successful} successful trials, max fit error {c.fit.max_error:.1%}, "
                f"{(c.overhead or 0) / GIB:.2f} GiB set aside for context and libraries{measured_text})"
            )
    if not lines:
        scope = f" with label {label!r}" if label else ""
        raise AttnbenchError(
            f"no series of {impl}{scope} in {source} has enough successful trials to fit "
            f"(2 lengths, 3 for a quadratic model): run `attnbench max-seq --impl {impl} --out DIR` "
            "and predict --from DIR"
        )
    return lines
