"""Where a data-parallel call's time goes: per strategy and kernel, a straight line through its
times against the one-GPU time of the same cases, time = fixed + per_work x one-GPU time.

The one-GPU time of a case is its work, in the unit that matters (the kernel's own speed on
that shape), so the line needs no FLOP count: ``fixed`` is what a call costs beyond its work
(DataParallel: scatter, gather, and the replica threads it starts anew at every call),
``per_work`` what a millisecond of one GPU's work costs the strategy (1 / GPUs at best).
Where ``per_work`` < 1 the strategy breaks even at a one-GPU call of fixed / (1 - per_work).

The line is fitted by least squares weighted by 1 / time^2 (every case counts by its relative
error, so the shortest calls, which hold the fixed cost, are not drowned by the longest), with
a 95% interval from the residuals (Student's t with cases - 2 degrees of freedom).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench.measure.stats import Interval

if TYPE_CHECKING:
    from attnbench.report.tables.multigpu import SpeedupCase

# two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the normal's)
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
T95_LARGE = {15: 2.131, 20: 2.086, 30: 2.042}
MIN_CASES = 3  # a line through two points has no residual to judge it by


def t95(dof: int) -> float:
    if dof <= len(T95):
        return T95[dof - 1]
    return next((t for d, t in sorted(T95_LARGE.items()) if dof <= d), 1.96)


@dataclass(frozen=True)
class Line:
    """y = fixed + per_work x, with intervals; ``n`` cases."""

    fixed: Interval
    per_work: Interval
    n: int

    @property
    def break_even_ms(self) -> float | None:
        """The one-GPU call time at which the strategy takes as long as one GPU: None where it
        never does (per unit of work no cheaper than one GPU, or no fixed cost to win back)."""
        if self.per_work.value >= 1 or self.fixed.value <= 0:
            return None
        return self.fixed.value / (1 - self.per_work.value)


def fit_line(points: list[tuple[float, float]]) -> Line | None:
    """The weighted least-squares line through (x, y) points, weights 1 / y^2; None with fewer
    than ``MIN_CASES`` points or all x equal."""
    pts = [(x, y) for x, y in points if x > 0 and y > 0]
    n = len(pts)
    if n < MIN_CASES:
        return None
    w = [1 / (y * y) for _, y in pts]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, pts))
    sy = sum(wi * y for wi, (_, y) in zip(w, pts))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    sxy = sum(wi * x * y for wi, (x, y) in zip(w, pts))
    det = sw * sxx - sx * sx
    if det <= 0:
        return None
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    s2 = sum(wi * (y - a - b * x) ** 2 for wi, (x, y) in zip(w, pts)) / (n - 2)
    ta, tb = t95(n - 2) * (s2 * sxx / det) ** 0.5, t95(n - 2) * (s2 * sw / det) ** 0.5
    return Line(Interval(a, a - ta, a + ta, n), Interval(b, b - tb, b + tb, n), n)


@dataclass(frozen=True)
class CallCost:
    """One strategy's line over the cases of one workload family (a kernel and its settings)."""

    strategy: str
    family: str  # the group label: implementation, configuration, module, mode, dtype, GPUs
    line: Line
    cases: tuple[tuple[str, float, float], ...]  # (case, one-GPU ms, strategy ms)
    single: Any = None  # a one-GPU row of the family: what kernel ran (its ``backend``)

    @property
    def first_faster_case(self) -> str | None:
        """The first measured case, in order of one-GPU time, where the strategy took less time."""
        return next((c for c, one, multi in sorted(self.cases, key=lambda t: t[1]) if multi < one), None)


def call_costs(groups: dict[tuple, list[SpeedupCase]]) -> list[CallCost]:
    """A line per (strategy, family) of ``multigpu.speedup_groups``, from its successful cases
    (medians of the same timer on both sides); families with fewer than three cases have none."""
    out = []
    for (strategy, family), cases in groups.items():
        measured = tuple(
            (c.row.case or f"{c.row.seq_len}x{c.row.batch}", c.base_ci.value, c.time_ci.value)
            for c in cases
            if c.speedup_ci is not None and c.base_ci and c.time_ci
        )
        line = fit_line([(one, multi) for _, one, multi in measured])
        if line is not None:
            out.append(CallCost(strategy, family, line, measured, next((c.single for c in cases if c.single), None)))
    return out


def thread_share(costs: list[CallCost]) -> dict[str, tuple[CallCost, CallCost]]:
    """Per family (its label without the GPU count), DataParallel's line beside the `thread`
    line of the same kernel: how much of DataParallel's fixed cost a new thread alone costs."""
    by_family: dict[str, dict[str, CallCost]] = {}
    for c in costs:
        by_family.setdefault(family_kernel(c.family), {})[c.strategy] = c
    return {k: (v["dp"], v["thread"]) for k, v in by_family.items() if "dp" in v and "thread" in v}


def family_kernel(family: str) -> str:
    """A family label without its trailing GPU count (``..., 2 GPUs``, ``..., 2 CPU processes``):
    the kernel and settings."""
    head, _, tail = family.rpartition(", ")
    return head if tail.endswith(("GPU", "GPUs", "process", "processes")) else family
