"""Sequence-parallel scaling from result rows alone.

* ``time_scaling``: per (implementation, configuration, length, P): time, tokens/s, memory
  per GPU, speedup T1 / TP and efficiency T1 / (P x TP) against the equal-work baseline
  (``report.tables.multigpu.baselines``), the same-split efficiency beside it, bytes sent and
  achieved bandwidth, and where the slowest rank's time went (compute vs communication wait);
* ``max_seq_scaling``: per (implementation, configuration, P): the largest length and its
  ratio to one GPU's.

Rows are matched on everything but the ranks (``series`` hashes the ranks in too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from attnbench.measure.stats import Interval
from attnbench.report.data import ok, trials, world_size
from attnbench.report.intervals import divided, ms_cell, ratio_cell, speedup_interval, time_interval
from attnbench.report.markdown import record_table
from attnbench.results.schema import MaxSeqResult, Row, Workload
from attnbench.units import format_bytes, format_tokens


def _ident(r: Workload) -> str:
    """The workload but its length and its ranks."""
    ident = r.identity(seq_len=False)
    ident.pop("world_size")
    return json.dumps(ident, sort_keys=True, default=str)


def _ranked(rows: list[Row]) -> list[Row]:
    return [r for r in rows if isinstance(r, Workload) and r.strategy == "ring"]


@dataclass(frozen=True)
class TimeScaling:
    """One sequence-parallel time against one GPU: ``baseline`` names which (``equal work: sdpa``)."""

    impl: str
    label: str
    config: Any
    seq_len: int
    world_size: int
    time_ms: float | None
    tokens_per_s: float | None
    peak_bytes_per_gpu: int | None
    peak_counter: str | None
    baseline: str | None
    speedup: float | None
    efficiency: float | None
    timer: str
    time_ci: Interval | None
    base_ci: Interval | None
    speedup_ci: Interval | None
    efficiency_ci: Interval | None
    overhead: float | None
    efficiency_same_split: float | None
    compute_ms: float | None
    comm_wait_ms: float | None
    sent_bytes: int | None
    algbw_gbps: float | None
    link_gbps: float | None
    backend: str | None


@dataclass(frozen=True)
class MaxSeqScaling:
    """A sequence-parallel search's largest length and its ratio to one GPU's."""

    impl: str
    label: str
    config: Any
    world_size: int
    max_seq_len: int | None
    stopped_by: str | None
    ratio: float | None


def time_scaling(rows: list[Row]) -> list[TimeScaling]:
    """Each sequence-parallel time against the equal-work baseline (the single-device
    counterpart over the whole sequence, measured in the same results) where there is one,
    else against the same implementation on one rank; both efficiencies where both exist."""
    from attnbench.report.tables.multigpu import SAME_SPLIT, baselines, preferred

    points = ok(trials(rows))
    singles = [r for r in points if world_size(r) == 1]
    out = []
    for r in sorted(_ranked(points), key=lambda r: (r.impl, _ident(r), r.seq_len, world_size(r))):
        found = baselines(r, singles)
        base, kind = preferred(found)
        p = world_size(r)
        slowest = max(r.ranks or [{}], key=lambda x: x.get("time_ms") or 0)
        speedup_ci, timer = speedup_interval(base, r)
        speedup = speedup_ci.value if speedup_ci else None
        same = found[SAME_SPLIT]
        same_ci, _ = speedup_interval(same, r)
        out.append(
            TimeScaling(
                impl=r.impl,
                label=r.label,
                config=r.config,
                seq_len=r.seq_len,
                world_size=p,
                time_ms=r.time_ms,
                tokens_per_s=r.tokens_per_s,
                peak_bytes_per_gpu=r.peak_bytes,
                peak_counter=r.peak_counter,
                baseline=f"{kind}: {base.impl}" if base else None,
                speedup=speedup,
                efficiency=speedup / p if speedup else None,
                timer=timer,
                time_ci=time_interval(r, timer),
                base_ci=time_interval(base, timer),
                speedup_ci=speedup_ci,
                efficiency_ci=divided(speedup_ci, p),
                overhead=(p / speedup - 1) if speedup else None,
                efficiency_same_split=same_ci.value / p if same_ci else None,
                compute_ms=slowest.get("compute_ms"),
                comm_wait_ms=slowest.get("comm_wait_ms"),
                sent_bytes=r.sent_bytes if r.sent_bytes is not None else slowest.get("sent_bytes"),
                algbw_gbps=r.algbw_gbps,
                link_gbps=r.link_gbps,
                backend=r.backend,
            )
        )
    return out


def max_seq_scaling(rows: list[Row]) -> list[MaxSeqScaling]:
    results = [r for r in _ranked(rows) if isinstance(r, MaxSeqResult)]
    single = {_ident(r): r for r in results if world_size(r) == 1}
    out = []
    for r in sorted(results, key=lambda r: (r.impl, _ident(r), world_size(r))):
        base = single.get(_ident(r))
        ratio = r.seq_len / base.seq_len if base and base.seq_len and r.seq_len else None
        out.append(MaxSeqScaling(r.impl, r.label, r.config, world_size(r), r.seq_len, r.stopped_by, ratio))
    return out


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


TIME_COLUMNS = {
    "Implementation": lambda t: t.label,
    "Sequence": lambda t: format_tokens(t.seq_len),
    "GPUs": lambda t: t.world_size,
    "Time": lambda t: ms_cell(t.time_ci),
    "Tokens/s": lambda t: _f(t.tokens_per_s, ",.0f"),
    "Peak Memory/GPU": lambda t: format_bytes(t.peak_bytes_per_gpu),
    "Baseline": lambda t: t.baseline or "-",
    "Speedup": lambda t: _f(t.speedup, ".2f"),
    "Efficiency": lambda t: ratio_cell(t.efficiency_ci, anomaly_above_one=True),
    "Efficiency (same split)": lambda t: _f(t.efficiency_same_split, ".3f"),
    "Sent/Call": lambda t: format_bytes(t.sent_bytes),
    "algbw (GB/s)": lambda t: _f(t.algbw_gbps, ",.2f"),
    "Link (GB/s)": lambda t: _f(t.link_gbps, ",.1f"),
    "Compute (ms)": lambda t: _f(t.compute_ms, ",.2f"),
    "Comm Wait (ms)": lambda t: _f(t.comm_wait_ms, ",.2f"),
    "Timer": lambda t: t.timer,
}
SIZE_COLUMNS = {
    "Implementation": lambda s: s.label,
    "GPUs": lambda s: s.world_size,
    "Max Sequence": lambda s: format_tokens(s.max_seq_len) if s.max_seq_len else "none",
    "Stopped By": lambda s: s.stopped_by,
    "x One GPU": lambda s: _f(s.ratio, ".2f"),
}


def scaling_markdown(rows: list[Row]) -> str:
    parts = []
    times = time_scaling(rows)
    if times:
        parts += [
            "## Sequence-parallel time against one GPU\n\n",
            record_table(TIME_COLUMNS, times),
        ]
        parts.append(
            "\nEfficiency = T(baseline) / (GPUs x T(GPUs)), ±half its 95% bootstrap interval (n samples). "
            "Baseline `equal work`: the single-device implementation of the same key sets over the whole "
            "sequence on one GPU (sdpa for ring, dilated for ring-dilated, block-sparse for block-sparse-ring), "
            "measured in the same results; `same split`: the same implementation on one rank, used only where "
            "no equal-work row exists, and shown as its own column. Timer `gpu` where both rows have GPU time, "
            "else `eager`. Sent/Call: bytes the busiest rank sends per call; algbw: those bytes over the call's "
            "time (as nccl-tests' algbw); Link: the same ranks' exchange alone, measured just before the trial, what the link gives. Compute and communication wait are the slowest rank's medians; "
            "memory is the fullest GPU's `max_memory_allocated` (CPU: resident-set growth).\n"
        )
    sizes = max_seq_scaling(rows)
    if sizes:
        parts += [
            "\n## Sequence-parallel largest sequence against one GPU\n\n",
            record_table(SIZE_COLUMNS, sizes),
        ]
    return "".join(parts)
