"""What the rows of one machine measure of a seed claim (``report.claims``): the quantity with
its 95% interval and n, from the newest matching row (``pick = "best"``: the largest over the
matching rows, for a claim about the best case), or the ratio of two such quantities.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from attnbench.report import data as d
from attnbench.report.claims import EIGHT_GIB, HARDWARE_BOUND, Claim, matches, short_label
from attnbench.report.fit import MemoryFit, fit_memory, fit_miss_cause
from attnbench.report.intervals import time_interval
from attnbench.schema import Row, Speedup


@dataclass
class Measured:
    value: float
    low: float | None
    high: float | None
    n: str
    machine: str
    workload: str
    date: str
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # FILE:LINE of the rows behind it

    def scaled(self, by: float) -> Measured:
        low, high = (self.low * by, self.high * by) if self.low is not None and self.high is not None else (None, None)
        return Measured(
            self.value * by, low, high, self.n, self.machine, self.workload, self.date, self.notes, self.sources
        )


def _chosen(rows: list[Any], value, pick: str) -> tuple[Any, int]:
    """The newest row (or the one of largest value) and how many others matched."""
    if not rows:
        return None, 0
    if pick == "best":
        return max(rows, key=lambda r: (value(r), d.row_date(_row(r)))), len(rows) - 1
    return max(rows, key=lambda r: d.row_date(_row(r))), len(rows) - 1


def _row(item: Any) -> Row:
    return item["row"] if isinstance(item, dict) else item


def _speedup(m, match, pick: str, per_gpu: bool) -> Measured | None:
    cases = [c for c in m.speedups if c["speedup"] and matches(c["row"], match)]
    if pick == "best":  # an efficiency above 1 beyond its interval is an anomaly, never the best case
        cases = [c for c in cases if not (c["efficiency_ci"] and c["efficiency_ci"].low > 1)]
    c, others = _chosen(cases, lambda c: c["efficiency" if per_gpu else "speedup"], pick)
    if c is None:
        return None
    iv = c["efficiency_ci"] if per_gpu else c["speedup_ci"]
    row = c["row"]
    out = Measured(
        iv.value,
        iv.low if iv.n > 1 else None,
        iv.high if iv.n > 1 else None,
        f"{_n(c['single'])}/{_n(row)}",
        m.name,
        short_label(row),
        d.row_date(row),
        sources=[x.source for x in (c["single"], row) if x is not None and x.source],
    )
    out.notes += replica_notes(row)
    if c["efficiency_ci"] and c["efficiency_ci"].low > 1:
        out.notes.append(f"efficiency {c['efficiency']:.2f} is above 1: unequal work, not super-linear scaling")
    if others:
        out.notes.append(f"the {'best' if pick == 'best' else 'newest'} of {others + 1} matching cases")
    return out


def _n(row: Row | None) -> int:
    iv = time_interval(row) if row is not None else None
    return iv.n if iv else 1


def _row_value(metric: str, row: Row) -> float | None:
    get = lambda name: getattr(row, name, None)  # noqa: E731 (a speedup row lacks some trial fields)
    if metric == "time_ms":
        return get("time_ms")
    if metric == "tokens_per_s":
        return get("tokens_per_s") or (d.tokens(row) / (row.time_ms / 1e3) if get("time_ms") else None)
    if metric == "peak_per_gpu":
        return d.peak_per_gpu(row)
    if metric in ("added_bytes", "added_per_token"):
        peak, inputs = get("peak_bytes"), get("inputs_bytes")
        if peak is None or inputs is None:
            return None
        return (peak - inputs) / (d.tokens(row) if metric == "added_per_token" else 1)
    if metric == "bytes_per_token":
        peak = d.peak_per_gpu(row)
        return peak / (d.tokens(row) / d.world_size(row)) if peak else None
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        gpus = d.gpu_memory(row)
        i = int(metric[3])
        return gpus[i]["allocated"] if len(gpus) > i else None
    return get(metric)


def _row_metric(m, metric: str, match: dict[str, Any], pick: str) -> Measured | None:
    pool = d.trials(m.rows) + d.speedup_rows(m.rows)
    rows = [r for r in d.ok(pool) if matches(r, match) and _row_value(metric, r) is not None]
    row, others = _chosen(rows, lambda r: _row_value(metric, r), pick)
    if row is None:
        return None
    value = _row_value(metric, row)
    low = high = None
    iv = time_interval(row)
    timed = metric in HARDWARE_BOUND and iv is not None and iv.n > 1
    if timed and metric == "time_ms":
        low, high = iv.low, iv.high
    elif timed:  # a rate: the bounds swap
        low, high = value * row.time_ms / iv.high, value * row.time_ms / iv.low
    out = Measured(
        value, low, high, str(iv.n if timed else 1), m.name, short_label(row), d.row_date(row), sources=[row.source]
    )
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        out.notes += replica_notes(row)
    if others and pick == "newest":
        out.notes.append(f"the newest of {others + 1} matching rows")
    return out


def _max_seq(m, match: dict[str, Any]) -> Measured | None:
    found = [s for s in m.summaries if s["max_seq_len"] and matches(s["head"], match)]
    if not found:
        return None
    s = max(found, key=lambda s: d.row_date(s["head"]))
    bound = "" if s["complete"] else "at least "
    return _search_answer(m, s, f"{bound}what one search ran, stopped by {s['stopped_by']}")


def _search_answer(m, s: dict[str, Any], note: str) -> Measured:
    """A search's longest length, as one measured value."""
    head = s["head"]
    return Measured(
        s["max_seq_len"], None, None, "1 search", m.name, short_label(head), d.row_date(head), [note], [head.source]
    )


def _max_seq_8gb(m, match: dict[str, Any]) -> Measured | None:
    """The longest sequence in 8 GiB: a finished search under an 8 GiB allocator limit where one
    ran, else the series' memory fit solved for 8 GiB (the allocator's share, with what this
    device sets aside for the CUDA context)."""
    limited = [
        s
        for s in m.summaries
        if s["max_seq_len"] and s["complete"] and s["head"].memory_limit == EIGHT_GIB and matches(s["head"], match)
    ]
    if limited:
        s = max(limited, key=lambda s: d.row_date(s["head"]))
        return _search_answer(m, s, f"a search under an 8 GiB allocator limit, stopped by {s['stopped_by']}")
    if match.get("kind") == "speedup":
        return _speedup_capacity(m, match)
    found = [c for c in m.capacities if c.fit and matches(c.head, match) and c.predict_for(EIGHT_GIB)]
    if not found:
        return None
    c = max(found, key=lambda c: (c.successful, d.row_date(c.head)))
    notes = [f"the {'quadratic' if c.fit.degree == 2 else 'linear'} fit of {c.successful} trials solved for 8 GiB"]
    if c.error is not None and abs(c.error) > 0.05:
        notes.append(f"it misses this GPU's measured maximum by {c.error * 100:+.0f}% ({fit_miss_cause(c)})")
    return Measured(
        c.predict_for(EIGHT_GIB),
        None,
        None,
        f"{c.successful} trials",
        m.name,
        short_label(c.head),
        d.row_date(c.head),
        notes,
        [c.head.source],
    )


def _speedup_capacity(m, match: dict[str, Any]) -> Measured | None:
    """8 GiB capacity from speedup rows: GPU 0's allocator peak fitted over the cases' lengths
    (batch-1 DataParallel holds everything on GPU 0)."""
    rows = [r for r in d.ok(d.speedup_rows(m.rows)) if matches(r, match) and _gpu0_reserved(r)]
    if len({r.seq_len for r in rows}) < 2:
        return None
    fit: MemoryFit | None = fit_memory([r.seq_len for r in rows], [_gpu0_reserved(r) for r in rows], 1)
    aside = [
        g["nvml_peak"] - g["reserved"] for r in rows for g in d.gpu_memory(r)[:1] if g["nvml_peak"] and g["reserved"]
    ]
    n = fit.max_seq(EIGHT_GIB - (statistics.median(aside) if aside else 0.0)) if fit else None
    if n is None:
        return None
    newest = max(rows, key=d.row_date)
    return Measured(
        n,
        None,
        None,
        f"{len(rows)} rows",
        m.name,
        short_label(newest),
        d.row_date(newest),
        [f"a linear fit of GPU 0's reserved peak at {len({r.seq_len for r in rows})} lengths solved for 8 GiB"],
        [r.source for r in rows],
    )


def _gpu0_reserved(row: Speedup) -> float | None:
    gpus = d.gpu_memory(row)
    return (gpus[0]["reserved"] or gpus[0]["allocated"]) if gpus else None


def measure_one(claim: Claim, m, match: dict[str, Any]) -> Measured | None:
    if claim.metric in ("speedup", "efficiency"):
        return _speedup(m, match, claim.pick, claim.metric == "efficiency")
    if claim.metric == "max_seq":
        return _max_seq(m, match)
    if claim.metric == "max_seq_8gb":
        return _max_seq_8gb(m, match)
    return _row_metric(m, claim.metric, match, claim.pick)


def measure(claim: Claim, m) -> Measured | None:
    """The claim's quantity on one machine: its metric, or the ratio ``match`` over ``over``,
    times ``scale``. A claim about GPUs takes GPU rows only, unless its rows come from the CPU
    (``settles = "CPU"``): a CPU's memory fit says nothing certain about a GPU's."""
    on = {} if claim.where == "CPU" else {"device": "cuda"}
    top = measure_one(claim, m, {**on, **claim.match})
    if top is None or claim.over is None:
        return top.scaled(claim.scale) if top is not None and claim.scale else top
    over = {**on, **claim.over}
    if "seq_len" in claim.match and "seq_len" not in over:
        over["seq_len"] = claim.match["seq_len"]
    bottom = measure_one(claim, m, over)
    if bottom is None or not bottom.value:
        return None
    low = high = None
    if None not in (top.low, top.high, bottom.low, bottom.high) and bottom.low and bottom.high:
        low, high = top.low / bottom.high, top.high / bottom.low
    ratio = Measured(
        top.value / bottom.value,
        low,
        high,
        f"{top.n}/{bottom.n}",
        m.name,
        f"{top.workload} over {bottom.workload}",
        max(top.date, bottom.date),
        top.notes + [n for n in bottom.notes if n not in top.notes],
        top.sources + bottom.sources,
    )
    return ratio.scaled(claim.scale) if claim.scale else ratio


def replica_notes(row: Row) -> list[str]:
    """Why a data-parallel GPU sat idle: fewer batch elements than GPUs."""
    batch = int(getattr(row, "batch", 1) or 1)
    if getattr(row, "strategy", None) == "dp" and batch < d.world_size(row):
        idle = ", ".join(f"GPU {i}" for i in range(batch, d.world_size(row)))
        return [f"at batch {batch} DataParallel ran {batch} replica; {idle} held nothing"]
    return []
