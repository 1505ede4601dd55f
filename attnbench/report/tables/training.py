"""The training table: per implementation configuration, the largest sequence a training step
(forward plus backward) ran at, its peak over the training floor (q, k, v, out, dout, dq, dk,
dv) and its useful training TFLOP/s (useful pairs x 4 D x 3.5), beside the same
configuration's forward-only largest sequence when the rows hold one. Reads rows only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.report.intervals import tflops_cell, tflops_interval
from attnbench.report.markdown import Table
from attnbench.report.tables.sweep import MaxSeqSummary, max_seq_summary, series_groups
from attnbench.results.schema import Row
from attnbench.results.series import machine_of, short_commit
from attnbench.units import format_gib, format_tokens

COMPARE_AT, COMPARE_LABEL = 65536, "64K"  # where block-sparse's training throughput meets dense SDPA's


@dataclass
class TrainingRecord:
    """A configuration's training capacity and throughput, beside its forward capacity."""

    label: str
    dtype: str
    machine: str
    max_seq_len: int | None = None
    memory_limit: int | None = None
    peak_over_floor: float | None = None
    tflops_at_max: Any = None  # Interval or None
    tflops_compare: Any = None
    fwd_max_seq_len: int | None = None
    fwd_peak_over_floor: float | None = None


def training_records(rows: list[Row]) -> list[TrainingRecord]:
    """One record per (configuration, code version, dtype, machine) with a training max-seq
    search or a training trial at 64K. A search and 64K points of one configuration are two
    series; where the points were also measured by other code, only theirs carry the commit in
    their label (``data.separate_code_versions``), so records key on the label without it and
    the commit, and show the label that names it."""
    summaries = max_seq_summary(rows)
    # a configuration may run as several series (a search, and points at 64K): the training
    # search belongs to its own series; the forward one is found by configuration
    searches = {s.series: s for s in summaries}
    largest = {(s.label, s.dtype, s.machine or s.device, _mode(s, rows)): s for s in summaries}
    records: dict[tuple, TrainingRecord] = {}
    for trials in series_groups(rows).values():
        head = trials[0]
        if head.mode != "fwd_bwd":
            continue
        where = (head.label, head.dtype, machine_of(head) if head.env else head.device)
        rec = records.setdefault((head.label.split(" @ ")[0], short_commit(head), *where[1:]), TrainingRecord(*where))
        if " @ " in where[0]:
            rec.label = where[0]
        compare = next((r for r in trials if r.seq_len == COMPARE_AT and r.status == "ok"), None)
        if compare and compare.tflops_useful:
            rec.tflops_compare = tflops_interval(compare)
        train = searches.get(head.series)
        if train and train.max_seq_len:
            best = next(r for r in trials if r.seq_len == train.max_seq_len and r.status == "ok")
            rec.max_seq_len, rec.peak_over_floor = train.max_seq_len, train.peak_over_floor
            rec.memory_limit = best.memory_limit or 0  # 0: the whole GPU
            rec.tflops_at_max = tflops_interval(best)
        fwd = largest.get((*where, "fwd"))
        if fwd and fwd.max_seq_len:
            rec.fwd_max_seq_len, rec.fwd_peak_over_floor = fwd.max_seq_len, fwd.peak_over_floor
    return [r for r in records.values() if r.max_seq_len or r.tflops_compare]  # else nothing to show


def _mode(summary: MaxSeqSummary, rows: list[Row]) -> str:
    return next((r.mode or "fwd" for r in rows if getattr(r, "series", None) == summary.series), "fwd")


def _tokens(v: int) -> str:
    return format_tokens(v) if v else "-"


def _ratio(v: float) -> str:
    return f"{v:.2f}x"


COLUMNS = {  # column: record field, or (record field, its cell)
    "Implementation": "label",
    "Dtype": "dtype",
    "Device": "machine",
    "Largest Training Sequence": ("max_seq_len", _tokens),
    "Searched Under": ("memory_limit", lambda v: format_gib(v) if v else "whole GPU"),
    "Peak / Training Floor": ("peak_over_floor", _ratio),
    "Training TFLOP/s at Largest": ("tflops_at_max", tflops_cell),
    f"Training TFLOP/s at {COMPARE_LABEL}": ("tflops_compare", tflops_cell),
    "Largest Forward Sequence": ("fwd_max_seq_len", _tokens),
    "Peak / Forward Floor": ("fwd_peak_over_floor", _ratio),
}
NOTE = (
    "The training floor is q, k, v, the output, its gradient and dq, dk, dv (8 tensors); the forward floor q, k, v "
    "and the output. Training TFLOP/s count useful pairs x 4 D x 3.5 (forward 1, backward 2.5) over the step's "
    "median time (eager timer), ± half its 95% bootstrap interval (n samples). Searched Under: the allocator limit the "
    "search ran under (a capacity under a limit is the limit's). '-': no such trial in these rows.\n"
)


def training_table(records: list[TrainingRecord]) -> Table:
    return Table.of("training", COLUMNS, records)
