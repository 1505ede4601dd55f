"""Capacity prediction applied to results: per series, the memory fit of its successful trials
(``attnbench.measure.capacity``: the model, the peak that is fitted and the budget, each saying
why), solved for the longest sequence the measured device, or another size, holds; the fit's
error on the measured points goes beside every prediction (the seeds extrapolated one number)."""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.measure.capacity import (
    MemoryFit,
    fitted_peak,
    measured_budget,
    memory_degree,
    memory_model,
)
from attnbench.report.data import ok, world_size
from attnbench.report.tables.sweep import max_seq_summary, series_groups
from attnbench.results.schema import Row, Trial
from attnbench.units import short_tokens

GIB = 2**30
ACCURACY_TARGET = 0.05
MIN_TRIALS_FOR_TARGET = 4


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
    longest_ok: int | None = None  # the longest length with a fitted peak
    curve_measured: bool = False  # quadratic because the peaks grow faster than a line, not by declaration

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


#: a prediction this many times the longest fitted length says so: a peak's make-up can change
#: far beyond the lengths it was fitted on (a ring's K/V travel in pieces on long shards)
FAR_BEYOND = 100


def capacity_note(c: Capacity) -> str:
    """Why a prediction misses its measured maximum, else how far beyond its fitted lengths it reaches."""
    if c.error is not None and abs(c.error) > ACCURACY_TARGET:
        return fit_miss_cause(c)
    if c.measured_max is None and c.predicted and c.longest_ok and c.predicted > FAR_BEYOND * c.longest_ok:
        reach = c.predicted / c.longest_ok
        return f"{reach:,.0f}x past the longest length fitted ({short_tokens(c.longest_ok)}); no search measured it"
    return ""


def fit_miss_cause(c: Capacity) -> str:
    """The likely reason a capacity prediction misses the measured maximum (``c.error`` set)."""
    if c.error > 0:
        return "predicted high: the peak grows faster near the limit than over the fitted lengths (fragmentation, workspace)"
    return "predicted low: the fitted lengths are small, where fixed costs steepen the slope"


def capacities(rows: list[Row]) -> list[Capacity]:
    """One capacity estimate per series (max-seq and points trials of one workload together)."""
    stops = {s.series: s for s in max_seq_summary(rows)}
    out = []
    for key, series_rows in series_groups(rows).items():
        head = series_rows[0]
        good = [r for r in ok(series_rows) if fitted_peak(r)]
        backend = next((r.backend for r in good if r.backend), None)
        declared = memory_degree(head.impl, backend, head)
        lengths, peaks = [r.seq_len for r in good], [fitted_peak(r) for r in good]
        fit = memory_model(lengths, peaks, declared)
        degree = fit.degree if fit else declared
        total, overhead, budget, note = measured_budget(series_rows)
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
                measured_max=stop.max_seq_len if stop else None,
                stopped_by=stop.stopped_by if stop else None,
                longest_ok=max((r.seq_len for r in good), default=None),
                curve_measured=degree > declared,
            )
        )
    return out
