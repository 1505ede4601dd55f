"""Does a second GPU help? The first screen's answer for a machine of several GPUs, from its rows.

Two short tables: one sequence over the GPUs (per sequence-parallel implementation, its longest
sequence on one GPU and on all of them, and its time at the longest length measured against
the best one-GPU implementation of the same key sets over the whole sequence: equal work), and
a batch over the GPUs (per kernel, DataParallel and one process per GPU: the fixed cost per call
and the speedup at the largest case, and what a new thread alone costs that kernel).
"""

from __future__ import annotations

from typing import Any

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
from attnbench.units import format_bytes, short_tokens

SEQUENCE_TEXT = (
    "One sequence over the GPUs: the longest sequence on one GPU and on all of them; the time at the longest "
    "length measured on all, against the best one-GPU implementation over the whole sequence (equal work):"
)
BATCH_TEXT = (
    "A batch over the GPUs, per kernel: a line through each strategy's eager times against one GPU's gives its "
    "fixed cost per call (±half its 95% interval, n cases); `New thread alone`: the same call on one GPU from a "
    "new thread, as DataParallel makes each replica's (section Data parallelism says why):"
)


def sequence_parallel(rows: list, gpus: int) -> Table | None:
    """Per sequence-parallel implementation: the equal-work comparison at its longest length on
    the most GPUs, and its longest sequence on one GPU and on all of them."""
    chosen: dict[str, RingPair] = {}
    for p in ring_pairs(rows):
        if p.world_size != gpus or p.baseline != EQUAL_WORK:
            continue
        best = chosen.get(p.row.impl)
        if best is None or (p.row.seq_len, p.row.time_ms or 0) > (best.row.seq_len, best.row.time_ms or 0):
            chosen[p.row.impl] = p
    if not chosen:
        return None
    longest = _longest(rows)
    columns = {
        "Implementation": lambda p: p.row.impl,
        "Longest, 1 GPU → all": lambda p: longest.get(p.row.impl),
        "At": lambda p: short_tokens(p.row.seq_len),
        "1 GPU (equal work)": lambda p: f"{p.single.impl} {ms_cell(p.base_ci)}",
        "All GPUs": lambda p: ms_cell(p.time_ci),
        "Speedup": (lambda p: p.speedup_ci, ratio_cell),
        "Efficiency": (lambda p: p.efficiency_ci, ratio_cell),
        "Sent per call": _sent,
    }
    return Table.of("second-gpu-sequence", columns, chosen.values())


def _longest(rows: list) -> dict[str, str]:
    """impl -> "32M → 64M": its searches' longest on one GPU and on the most GPUs."""
    out = {}
    for fam in scaling_families(rows):
        multi = [s for s in fam.multi if s.max_seq_len]
        if fam.single and fam.single.max_seq_len and fam.single.impl == fam.head.impl and multi:
            out[fam.head.impl] = f"{short_tokens(fam.single.max_seq_len)} → {short_tokens(multi[-1].max_seq_len)}"
    return out


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
    # (kernel, its lines by strategy)
    kernels = [(k, by) for k, by in by_kernel.items() if "dp" in by or "mp" in by]
    if not kernels:
        return None
    columns = {
        "Kernel": lambda k: names.get(k[0], k[0]),
        "DataParallel: fixed cost per call": lambda k: _fixed(k[1].get("dp")),
        "speedup at largest case": (lambda k: largest.get((k[0], "dp")), _case_ratio),
        "New thread alone": lambda k: _fixed(k[1].get("thread")),
        "Multi-process: fixed cost per call": lambda k: _fixed(k[1].get("mp")),
        "speedup at largest case ": (lambda k: largest.get((k[0], "mp")), _case_ratio),
    }
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
