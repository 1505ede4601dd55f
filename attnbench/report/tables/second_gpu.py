"""Does adding GPUs help? The first screen's answer for a machine of several GPUs, from its rows.

Two short tables: one sequence over the GPUs, as a curve (per sequence-parallel implementation
and GPU count measured: its longest sequence, and at one length every count ran its time, its
efficiency against the best one-GPU implementation of the same key sets over the whole sequence,
equal work, and each rank's memory over its shard's floor), and a batch over the GPUs (per
kernel, DataParallel and one process per GPU: the fixed cost per call and the speedup at the
largest case, and what a new thread alone costs that kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.analysis.search import answering
from attnbench.plan import strategies
from attnbench.report import data as d
from attnbench.report.intervals import ms_cell, ratio_cell
from attnbench.report.markdown import Table
from attnbench.report.tables.call_cost import CallCost, call_costs, family_kernel
from attnbench.report.tables.multigpu import (
    EQUAL_WORK,
    RingPair,
    SpeedupCase,
    ring_pairs,
    scaling_families,
    speedup_groups,
)
from attnbench.results.series import is_superseded, row_date
from attnbench.units import format_bytes, format_gib, short_tokens

SEQUENCE_TEXT = (
    "One sequence over the GPUs, per implementation and GPU count: its longest sequence; at one length every "
    "count ran, its time, efficiency against the best one-GPU implementation over the whole sequence (equal "
    "work; GPU time where both rows have it) and each rank's peak over its shard's floor (q, k, v, output):"
)
NO_EQUAL_WORK = (
    "No time or efficiency: no one-GPU implementation of the same key sets was timed at a length every GPU count "
    "ran. A profile's sweep with `equal_work = true` times one beside each sequence-parallel point (as "
    "`profiles/multi-gpu.toml` does)."
)
BATCH_TEXT = (
    "A batch over the GPUs, per kernel: a line through each strategy's eager times against one GPU's gives its "
    "fixed cost per call (±half its 95% interval, n cases); `New thread alone`: the same call on one GPU from a "
    "new thread, as DataParallel makes each replica's (section Data parallelism says why):"
)


@dataclass(frozen=True)
class CurvePoint:
    """One implementation on one GPU count: its equal-work pair at the curve's length, and its
    longest sequence there."""

    pair: RingPair | None
    longest: str | None
    impl: str
    gpus: int
    at: int | None


def sequence_parallel(rows: list, gpus: int) -> Table | None:
    """The curve: per sequence-parallel implementation, a row per GPU count it was measured on."""
    points = curve(rows)
    if not points or max(p.gpus for p in points) < 2:
        return None
    columns = {
        "Implementation": lambda c: c.impl,
        "GPUs": lambda c: c.gpus,
        "Longest": lambda c: c.longest,
        "At": lambda c: short_tokens(c.at) if c.at else None,
        "Time": lambda c: ms_cell(c.pair.time_ci) if c.pair else None,
        "Efficiency": (lambda c: c.pair.efficiency_ci if c.pair else None, ratio_cell),
        "Timer": lambda c: c.pair.timer if c.pair else None,
        "Per rank / floor": lambda c: _over_floor(c.pair),
    }
    return Table.of("gpu-curve", columns, points)


def curve(rows: list) -> list[CurvePoint]:
    """Per implementation, per GPU count: the equal-work pair at the longest length every
    count ran (the one fixed length of the curve), and the longest sequence searched."""
    pairs: dict[str, dict[int, dict[int, RingPair]]] = {}
    for p in ring_pairs(rows):
        if p.baseline == EQUAL_WORK and not is_superseded(p.row.label):  # newer code measured it again
            pairs.setdefault(p.row.impl, {}).setdefault(p.world_size, {})[p.row.seq_len] = p
    longest = _longest_by_count(rows)
    out = []
    for impl in sorted(set(pairs) | {i for i, _ in longest}):
        by_count = pairs.get(impl, {})
        common = set.intersection(*(set(v) for v in by_count.values())) if by_count else set()
        at = max(common) if common else None
        for gpus in sorted(set(by_count) | {g for i, g in longest if i == impl}):
            pair = by_count.get(gpus, {}).get(at) if at else None
            out.append(CurvePoint(pair, longest.get((impl, gpus)), impl, gpus, at if pair else None))
    return out


def _longest_by_count(rows: list) -> dict[tuple[str, int], str]:
    """(impl, GPUs) -> the longest sequence of its newest code's search (≥ where unfinished).
    One memory limit per implementation where it can: the whole device where a multi-GPU
    search of its own ran there, else its newest multi-GPU search's limit, named. On one GPU,
    where the implementation has no search of its own, its one-GPU counterpart's (sdpa's for
    ring), named: how far one GPU goes is the curve's first point."""
    by_impl: dict[str, list[tuple[int, Any]]] = {}
    for fam in scaling_families(rows):
        for s in [fam.single, *fam.multi]:
            if s is not None and s.max_seq_len and not is_superseded(s.head.label):
                by_impl.setdefault(fam.head.impl, []).append((s.world_size, s))
    out = {}
    for impl, searches in by_impl.items():
        limit = _curve_limit([s for gpus, s in searches if gpus > 1 and s.impl == impl])
        for gpus in {g for g, _ in searches}:
            at = [s for g, s in searches if g == gpus]
            s = answering([s for s in at if s.impl == impl] or at, lambda s: s.head, limit)
            notes = [s.impl] if s.impl != impl else []
            notes += [f"{format_gib(s.head.memory_limit)} limit"] if s.head.memory_limit else []
            text = ("" if s.complete else "≥ ") + short_tokens(s.max_seq_len)
            out[(impl, gpus)] = text + (f" ({', '.join(notes)})" if notes else "")
    return out


def _curve_limit(multi: list) -> int | None:
    """The memory limit an implementation's curve reads its searches under (None: the whole device)."""
    if not multi or any(s.head.memory_limit is None for s in multi):
        return None
    return max(multi, key=lambda s: (row_date(s.head), s.series)).head.memory_limit


def _over_floor(p: RingPair | None) -> str | None:
    """The fullest rank's peak over its shard's floor."""
    if p is None or not p.row.floor_bytes:
        return None
    peak = d.peak_per_gpu(p.row)
    return f"{peak / p.row.floor_bytes:.2f}x" if peak else None


def _sent(p: RingPair) -> str:
    r = p.row
    if not p.sent_bytes:
        return "0 B (each shard holds its keys)"
    share = f", {100 * r.algbw_gbps / r.link_gbps:.2g}% of the link's rate" if r.link_gbps and r.algbw_gbps else ""
    return f"{format_bytes(p.sent_bytes)}{share}"


def data_parallel(speedups: list[SpeedupCase]) -> Table | None:
    """Per kernel: DataParallel's and multi-process's fixed cost per call and their speedup at
    the largest case, beside what the same call costs on one GPU from a new thread."""
    costs = call_costs(speedup_groups(speedups))
    by_kernel: dict[str, dict[str, CallCost]] = {}
    names: dict[str, str] = {}
    for c in costs:
        by_kernel.setdefault(family_kernel(c.family), {})[c.strategy] = c
        if c.single is not None:
            names[family_kernel(c.family)] = kernel_name(c.single)
    largest = _largest_case(speedups)
    shown = sorted(
        (decl for decl in strategies.DECLARED if decl.batch_column), key=lambda decl: decl.batch_column.place
    )
    spread = [decl.name for decl in shown if decl.batch_column.speedup]
    # (kernel, its lines by strategy): a kernel that some strategy spread over GPUs
    kernels = [(k, by) for k, by in by_kernel.items() if any(s in by for s in spread)]
    if not kernels:
        return None
    columns: dict[str, Any] = {"Kernel": lambda k: names.get(k[0], k[0])}
    for decl in shown:
        columns[decl.batch_column.heading] = lambda k, s=decl.name: _fixed(k[1].get(s))
        if decl.batch_column.speedup:  # headings must differ: a space per earlier speedup column
            heading = "speedup at largest case" + " " * sum(c.startswith("speedup at") for c in columns)
            columns[heading] = (lambda k, s=decl.name: largest.get((k[0], s)), _case_ratio)
    return Table.of("second-gpu-batch", columns, kernels)


def merged(tables: list[tuple[str, Table | None]]) -> Table | None:
    """One table of several machines' tables of the same headers: a Machine column first."""
    present = [(name, t) for name, t in tables if t is not None]
    if not present:
        return None
    first = present[0][1]
    records = [{"Machine": name, **r} for name, t in present for r in t.records]
    return Table(first.name, ["Machine", *first.headers], records, first.formats)


def kernel_name(row) -> str:
    """`sdpa (cudnn)`, `dilated[1024,2048/1,2] (triton)`: the configuration and the kernel that ran;
    a model around it and training named too."""
    name = d.short_name(row) + (f" ({row.backend})" if row.backend else "")
    if getattr(row, "module", None) == "multihead":
        name += " multi-head"
    return name + (" training" if row.mode == "fwd_bwd" else "")


def _fixed(c: CallCost | None) -> str | None:
    return ms_cell(c.line.fixed) if c else None


def _largest_case(speedups: list[SpeedupCase]) -> dict[tuple[str, str], tuple[str, Any]]:
    """(kernel, strategy) -> (case, speedup interval) at the case with the longest one-GPU time."""
    out: dict[tuple[str, str], tuple[str, Any, float]] = {}
    for (strategy, family), cases in speedup_groups(speedups).items():
        for c in cases:
            if c.speedup_ci is None or not c.base_ci:
                continue
            key = (family_kernel(family), strategy)
            if key not in out or c.base_ci.value > out[key][2]:
                out[key] = (c.row.case, c.speedup_ci, c.base_ci.value)
    return {k: v[:2] for k, v in out.items()}


def _case_ratio(v: tuple[str, Any]) -> str:
    case, iv = v
    return f"{ratio_cell(iv)} at {case}"
