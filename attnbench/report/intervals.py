"""Intervals of what a table shows, from rows: a median time, a rate, a ratio of two rows.

Rows written since intervals were added carry ``time_ci_low``/``time_ci_high``/``time_n``
(and the ``gpu_time_`` ones); older rows get theirs computed from ``times_ms`` with the
same seeded bootstrap, so every committed row renders the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnbench.measure import stats
from attnbench.measure.stats import Interval
from attnbench.results.schema import Row
from attnbench.units import token_pair

TIMERS = {"gpu": "gpu_times_ms", "eager": "times_ms"}


def timer_for(*rows: Row | None) -> str:
    """GPU time where every row has it, else eager time: a ratio compares like with like."""
    present = [r for r in rows if r is not None]
    return "gpu" if present and all(getattr(r, "gpu_times_ms", None) for r in present) else "eager"


def time_interval(row: Any, timer: str = "eager") -> Interval | None:
    """The median time of ``row`` and its 95% interval, in ms (``row`` a timed row, or a
    record with the same time fields, such as a max-seq summary)."""
    if row is None:
        return None
    prefix = "gpu_time" if timer == "gpu" else "time"
    value, low = getattr(row, f"{prefix}_ms", None), getattr(row, f"{prefix}_ci_low", None)
    if value is not None and low is not None:
        return Interval(value, low, getattr(row, f"{prefix}_ci_high", None), getattr(row, f"{prefix}_n", None))
    iv = stats.median_interval(getattr(row, TIMERS[timer], None) or [], medians=_memo_medians)
    if iv is None and value is not None:
        return Interval(value, value, value, 1)  # a median without its samples: no spread known
    return iv


# A data-parallel call's cost is on the host (DataParallel's threads, scatter and gather) and on
# GPUs and threads that a CUDA graph or events of one stream do not see: its speedup is read in
# what a caller waits for, eager time, on both sides.
DATA_PARALLEL_TIMER = "eager"


def speedup_interval(base: Row | None, row: Row | None, timer: str | None = None) -> tuple[Interval | None, str]:
    """base time / row time with its interval, and the timer both sides were read with (``timer``,
    else GPU time where both have it)."""
    if base is None or row is None:
        return None, timer or "eager"
    timer = timer or timer_for(base, row)
    b, r = getattr(base, TIMERS[timer], None), getattr(row, TIMERS[timer], None)
    if not (b and r):
        return _unsampled_ratio(base, row), timer
    key = (id(b), id(r))
    if key not in _RATIOS:
        if len(_RATIOS) >= MAX_RATIOS:
            _RATIOS.clear()
        _RATIOS[key] = (b, r, stats.ratio_interval(b, r, medians=_memo_medians))
    return _RATIOS[key][2], timer


# Each pair's ratio, by the identity of the two rows' sample lists (held with it, so that an id
# is never reused while its entry stands): a report reads one pair in several tables, its CSV, a
# figure and the terminal, and a row relabelled for a table shares its lists with the row read.
# Equal samples in two rows are two lists, bootstrapped apart.
_RATIOS: dict[tuple[int, int], tuple[list, list, Interval | None]] = {}
MAX_RATIOS = 100_000


def _memo_medians(values: list, after: int) -> np.ndarray:
    """``stats.flat_medians`` of a row's sample list, by the list's identity: a one-device baseline
    is the numerator of a ratio for each of its multi-GPU rows, drawn alike every time."""
    key = (id(values), after)
    if key not in _MEDIANS:
        if len(_MEDIANS) >= MAX_MEDIANS:
            _MEDIANS.clear()
        _MEDIANS[key] = (values, stats.flat_medians(values, after))
    return _MEDIANS[key][1]


_MEDIANS: dict[tuple[int, int], tuple[list, np.ndarray]] = {}
MAX_MEDIANS = 1024  # 16 KiB each: a few tables' worth of baselines


def _unsampled_ratio(base: Row, row: Row) -> Interval | None:
    """A ratio of two rows without samples: their median times, no spread known."""
    if getattr(base, "time_ms", None) and getattr(row, "time_ms", None):
        v = base.time_ms / row.time_ms
        return Interval(v, v, v, 1)
    return None


def divided(iv: Interval | None, by: float) -> Interval | None:
    """An interval divided by an exact number (a speedup by the GPU count: efficiency)."""
    return None if iv is None else Interval(iv.value / by, iv.low / by, iv.high / by, iv.n)


def tflops_interval(row: Row) -> Interval | None:
    """A row's useful TFLOP/s with the 95% interval of its median (eager) time: rate = work / time."""
    value = getattr(row, "tflops_useful", None)
    if not value:
        return None
    iv = stats.scaled(time_interval(row), value * row.time_ms) if row.time_ms else None
    return iv or Interval(value, value, value, 1)


def tflops_cell(iv: Interval | None) -> str:
    """``309.0 ±0.7 (n=50)``: one decimal, three significant digits below 10 (a CPU's 0.0123)."""
    return stats.plus_minus(iv, lambda x: f"{x:,.1f}" if x >= 10 else f"{x:.3g}")


def ms_cell(iv: Interval | None) -> str:
    """``19.1 ms ±0.3 (n=20)``, three significant digits."""
    return stats.plus_minus(iv, lambda x: f"{x:,.3g}" if x < 1000 else f"{x:,.0f}", "ms")


def ratio_text(x: float) -> str:
    """Two decimals (1.00, 2.82); two significant digits below 0.1 (0.0069)."""
    return f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.2g}"


def ratio_cell(iv: Interval | None, anomaly_above_one: bool = False) -> str:
    """``1.48 ±0.57 (n=6)``; an efficiency above 1 beyond its interval is marked, never a headline."""
    if iv is None:
        return "-"
    text = stats.plus_minus(iv, ratio_text)
    if anomaly_above_one and stats.anomalous_efficiency(iv):
        text += " ⚠ above 1: unequal work or a warmer baseline, not super-linear scaling"
    return text


def bracket(largest: int | None, first_failure: int | None, fmt) -> str:
    """A max-seq as the search found it: the largest length that ran and the first that failed,
    with the decimals that tell them apart (``fmt``: short_tokens or format_tokens)."""
    if not largest:
        return f"none (fails {fmt(first_failure)})" if first_failure else "none"
    if not first_failure:
        return f"≥ {fmt(largest)}"
    ran, failed = token_pair(largest, first_failure, fmt)
    return f"{ran} – {failed}"
