"""The single-GPU maximum tables of the seed reports (report 002's layout), per series:

    Sequence Length | Memory After QKV | Peak Memory | Result | Notes
    Sequence Length | Eager Time | GPU Time | Memory (MB) | Result | Sparsity

plus a summary of each series' largest length and what stopped it. Reads rows only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pandas as pd

from attnbench.analysis import search_outcome
from attnbench.report.data import trials as trials_of
from attnbench.report.data import world_size
from attnbench.report.intervals import bracket, ms_cell, time_interval
from attnbench.report.markdown import record_table, result_text, short_message
from attnbench.results.schema import MaxSeqResult, Row, Trial
from attnbench.units import format_bytes, format_sparsity, format_tokens, rate_per_device

CSV_COLUMNS = (
    "run label impl kind phase seq_len status message batch heads head_dim dtype device mode causal "
    "time_ms time_iqr_ms time_min_ms time_max_ms time_ci_low time_ci_high time_n gpu_time_ms "
    "gpu_time_ci_low gpu_time_ci_high gpu_timer host_bound dispatch_share warmup_calls warmup_s "
    "clocks_moved process tokens_per_s tflops_executed tflops_useful kept_fraction inputs_bytes "
    "peak_bytes peak_counter max_memory_allocated max_memory_reserved floor_bytes peak_over_floor backend "
    "machine"
).split()


def series_groups(rows: list[Row]) -> dict[str, list[Trial]]:
    """Trials by series, in the order the series first appear, each sorted by length."""
    groups: dict[str, list[Trial]] = {}
    for r in trials_of(rows):
        groups.setdefault(r.series, []).append(r)
    return {k: sorted(v, key=lambda r: r.seq_len) for k, v in groups.items()}


@dataclass(frozen=True)
class MaxSeqSummary:
    """A max-seq series' answer: its largest length, what stopped the next, the trial at the largest."""

    series: str
    label: str
    impl: str
    dtype: str
    mode: str
    device: str
    machine: str | None
    max_seq_len: int
    first_failure: int | None
    stopped_by: str
    stop_message: str | None
    complete: bool
    peak_bytes: int | None
    peak_over_floor: float | None
    time_ms: float | None
    time_ci_low: float | None
    time_ci_high: float | None
    time_n: int | None
    tokens_per_s: float | None
    trials: int
    head: Trial = field(repr=False)  # the series' first trial: its settings and world size
    unstable: tuple[int, ...] = ()  # lengths that ran in one trial and failed in another
    confirmed: bool | None = None  # the answer ran again in a fresh process (None: the row does not say)
    wider_than_promised: bool = False  # its bracket is wider than 1% of it, its grid or its resolution

    @property
    def world_size(self) -> int:
        return world_size(self.head)


def max_seq_csv(summary: list[MaxSeqSummary]) -> str:
    """The summaries' fields as columns, but the first trial (its fields are in trials.csv)."""
    names = [
        f.name for f in fields(MaxSeqSummary) if f.name not in ("head", "unstable", "confirmed", "wider_than_promised")
    ]
    return pd.DataFrame([[getattr(s, n) for n in names] for s in summary], columns=names).to_csv(index=False)


def max_seq_summary(rows: list[Row]) -> list[MaxSeqSummary]:
    """Per max-seq series: the search's answer and what stopped the next length
    (``analysis.search_outcome``, the rule every reader shares)."""
    results = {r.series: r for r in rows if isinstance(r, MaxSeqResult)}
    out = []
    for key, trials in series_groups(rows).items():
        head = trials[0]
        if head.kind != "max-seq":
            continue
        found = search_outcome(trials, results.get(key))
        best_row, stop = found.best_row, found.stop
        ci = time_interval(best_row)
        out.append(
            MaxSeqSummary(
                series=key,
                label=head.label,
                impl=head.impl,
                dtype=head.dtype,
                mode=head.mode or "fwd",  # a forward and a training search share a label
                device=head.device,
                machine=head.env.machine if head.env else None,
                max_seq_len=found.max_seq_len,
                first_failure=found.first_failure,
                stopped_by=found.stopped_by,
                stop_message=stop.message if stop else "",
                complete=found.complete,
                peak_bytes=best_row.peak_bytes if best_row else None,
                peak_over_floor=best_row.peak_over_floor if best_row else None,
                time_ms=best_row.time_ms if best_row else None,
                time_ci_low=ci.low if ci else None,
                time_ci_high=ci.high if ci else None,
                time_n=ci.n if ci else None,
                tokens_per_s=best_row.tokens_per_s if best_row else None,
                trials=len(trials),
                head=head,
                unstable=found.unstable,
                confirmed=found.confirmed,
                wider_than_promised=found.wider_than_promised,
            )
        )
    return out


def _gpu_cell(r: Trial) -> str:
    """GPU time ± interval; where the host dominates, its share of an eager call."""
    if not r.gpu_times_ms:
        return "-"
    cell = ms_cell(time_interval(r, "gpu"))
    if r.host_bound:
        cell += f"; host-bound, dispatch {r.dispatch_share:.0%}"
    return cell


def each_length_once(trials: list[Trial]) -> tuple[list[Trial], set[int]]:
    """A search's trials without repeats, and the lengths a second fresh process confirmed: a
    confirmation that ran is the same point again, so it marks its length's row instead of
    repeating it (a failed one stays, a row of its own)."""
    ran = {r.seq_len for r in trials if r.status == "ok" and r.phase != "confirm"}
    repeats = [r for r in trials if r.phase == "confirm" and r.status == "ok" and r.seq_len in ran]
    gone = {id(r) for r in repeats}  # by identity: a row's equality compares every field
    return [r for r in trials if id(r) not in gone], {r.seq_len for r in repeats}


CONFIRMED = "confirmed in a fresh process"


def _notes(r: Trial, confirmed: bool = False) -> str:
    if r.status != "ok":
        return short_message(r.message)
    bits = [CONFIRMED] if confirmed else []
    if r.peak_over_floor:
        bits.append(f"peak {r.peak_over_floor:.2f}x floor")
    if r.tflops_executed:
        bits.append(rate_per_device(r.tflops_executed, world_size(r)))
    if r.backend:
        bits.append(f"backend {r.backend}")
    return "; ".join(bits)


def _peak_cell(r: Trial) -> str:
    if r.status == "ok":
        return format_bytes(r.peak_bytes)
    return format_bytes(r.peak_bytes) + " at failure" if r.peak_bytes else "-"


def memory_table(trials: list[Trial]) -> str:
    trials, confirmed = each_length_once(trials)
    columns = {
        "Sequence Length": lambda r: format_tokens(r.seq_len),
        "Memory After QKV": lambda r: format_bytes(r.inputs_bytes),
        "Peak Memory": _peak_cell,
        "Result": lambda r: result_text(r.status),
        "Notes": lambda r: _notes(r, r.seq_len in confirmed),
    }
    return record_table(columns, trials)


# eager time (every row has it) and GPU time where the row has one, each ±95% interval
TIME_COLUMNS = {
    "Sequence Length": lambda r: format_tokens(r.seq_len),
    "Eager Time": lambda r: ms_cell(time_interval(r)) if r.time_ms else "-",
    "GPU Time": _gpu_cell,
    "Peak Memory": lambda r: format_bytes(r.peak_bytes) if r.peak_bytes and r.status == "ok" else "-",
    "Result": lambda r: result_text(r.status),
    "Sparsity": lambda r: format_sparsity(r.kept_fraction, r.causal),
}


def time_table(trials: list[Trial]) -> str:
    return record_table(TIME_COLUMNS, trials)


def max_seq_text(s: MaxSeqSummary, fmt=format_tokens) -> str:
    """The largest length of a summary; an unfinished search gives only a lower bound."""
    if not s.max_seq_len:
        return "none" if s.complete else "none yet"
    return fmt(s.max_seq_len) if s.complete else f"≥ {fmt(s.max_seq_len)}"


def search_bracket(s: MaxSeqSummary, fmt=format_tokens) -> str:
    """A search's answer: its bracket (largest that ran – first that failed) where it finished,
    else the lower bound it reached."""
    return bracket(s.max_seq_len, s.first_failure, fmt) if s.complete else max_seq_text(s, fmt)


SUMMARY_COLUMNS = {
    "Implementation": lambda s: s.label,
    "Dtype": lambda s: s.dtype,
    "Mode": lambda s: s.mode,
    "Device": lambda s: s.machine or s.device,
    "Max Sequence (ran – failed)": search_bracket,
    "Stopped By": lambda s: s.stopped_by,
    "Peak at Max": lambda s: format_bytes(s.peak_bytes),
    "Peak / Floor": lambda s: f"{s.peak_over_floor:.2f}x" if s.peak_over_floor else "-",
    "Eager Time at Max": lambda s: ms_cell(time_interval(s)) if s.time_ms else "-",
}


def summary_table(summary: list[MaxSeqSummary]) -> str:
    return record_table(SUMMARY_COLUMNS, summary)


def trials_csv(rows: list[Row]) -> str:
    flat = []
    for r in trials_of(rows):
        flat.append({c: (r.env.machine if r.env else None) if c == "machine" else getattr(r, c) for c in CSV_COLUMNS})
    return pd.DataFrame(flat, columns=CSV_COLUMNS).to_csv(index=False)
