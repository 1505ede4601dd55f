"""Report 002's "Block-Sparse Base Implementation" table, from result rows only:

    Sequence Length | Time (ms) | Memory (MB) | Result | Sparsity

with dense ``sdpa`` rows and block-sparse rows at several sparsity ratios, plus what the seeds
lacked: the pattern and block size, the kept fraction actually achieved, the wall-clock
speedup over the fastest dense ``sdpa`` row at the same length (same run, same workload), the
executed TFLOP/s, and FlexAttention's compile time (first call), apart from the steady state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnbench.report.data import trials
from attnbench.report.markdown import Columns, record_table, result_text
from attnbench.results.schema import Row, Trial
from attnbench.results.series import machine_of
from attnbench.units import format_sparsity, format_tokens

SPARSE = "block-sparse"
DENSE = "sdpa"


def _workload(r: Trial) -> tuple:
    return (r.dtype, r.batch, r.heads, r.head_dim, r.mode, bool(r.causal), r.device, machine_of(r))


def achieved_kept(r: Trial) -> float | None:
    """Kept share of the pairs the mask allows: all N^2, or N(N+1)/2 when causal."""
    kept = r.kept_fraction
    if kept is None:
        return None
    n = r.seq_len
    return kept * n / ((n + 1) / 2) if r.causal else kept


def _configured_sparsity(config: dict[str, Any]) -> str:
    ratio = config.get("sparsity_ratio")
    return format_sparsity(1.0 if ratio is None else ratio)


def sparsity_table(rows: list[Row], level: int = 5) -> str:
    """Markdown: one table per workload that has block-sparse trials ("" when none has), each
    under a heading of this level (the report nests them under its level-4 heading)."""
    found = [r for r in trials(rows) if r.impl in (SPARSE, DENSE)]
    if not any(r.impl == SPARSE for r in found):
        return ""
    # the timing sweep's points; a run with only max-seq searches shows their trials
    if any(r.kind == "points" and r.impl == SPARSE for r in found):
        found = [r for r in found if r.kind == "points"]
    groups: dict[tuple, list[Trial]] = {}
    for r in found:
        groups.setdefault(_workload(r), []).append(r)
    parts = []
    for key, group in groups.items():
        if not any(r.impl == SPARSE for r in group):
            continue
        dtype, batch, heads, head_dim, mode, causal, device, machine = key
        parts.append(
            f"\n{'#' * level} {dtype}, B={batch}, H={heads}, D={head_dim}, {mode}{', causal' if causal else ''}, "
            f"{machine or device}\n\n"
        )
        parts.append(record_table(_columns(group), _ordered(group)))
    if parts:
        parts.append(
            "\nSparsity: the configured `sparsity_ratio` (kept fraction of block pairs). Kept (achieved): the share "
            "of the allowed query-key pairs (all N^2, or the causal triangle) the pattern really keeps, from its "
            "declared key sets. Speedup vs Dense: the fastest dense `sdpa` row at the same length in these results "
            "divided by this row's median time. TFLOP/s counts the FLOPs the kernel executes (whole blocks). "
            "Compile (s): the untimed first call, which compiles FlexAttention (and runs once), not part of Time (ms). "
            "Memory (MB): peak allocator memory (10^6 bytes).\n"
        )
    return "".join(parts)


def _ordered(group: list[Trial]) -> list[Trial]:
    def key(r):
        c = r.config or {}
        sparse = r.impl == SPARSE
        return (
            r.seq_len,
            sparse,
            -(c.get("sparsity_ratio") or 1.0),
            c.get("pattern_type") or "",
            c.get("block_size") or 0,
            c.get("backend") or "",
        )

    return sorted(group, key=key)


def _fastest_dense(group: list[Trial], seq_len: int) -> Trial | None:
    dense = [r for r in group if r.impl == DENSE and r.seq_len == seq_len and r.status == "ok" and r.time_ms]
    return min(dense, key=lambda r: r.time_ms, default=None)


def _columns(group: list[Trial]) -> Columns:
    """The table's cells of a trial; Speedup vs Dense against the fastest dense row of ``group``."""

    def ok(r: Trial) -> bool:
        return bool(r.status == "ok" and r.time_ms)

    def speedup(r: Trial) -> str:
        dense = _fastest_dense(group, r.seq_len)
        return f"{dense.time_ms / r.time_ms:.2f}x" if ok(r) and dense else "-"

    def dense_or(sparse: Callable[[dict], Any], dense: Callable[[Trial], Any]) -> Callable[[Trial], Any]:
        return lambda r: sparse(r.config or {}) if r.impl == SPARSE else dense(r)

    return {
        "Sequence Length": lambda r: format_tokens(r.seq_len),
        "Time (ms)": lambda r: f"{r.time_ms:,.2f}" if ok(r) else "-",
        "Memory (MB)": lambda r: f"{r.peak_bytes / 1e6:,.1f}" if ok(r) and r.peak_bytes else "-",
        "Result": lambda r: result_text(r.status),
        "Sparsity": dense_or(_configured_sparsity, lambda r: "Dense"),
        "Pattern": dense_or(
            lambda c: c.get("pattern_type"), lambda r: f"dense sdpa ({r.backend or (r.config or {}).get('backend')})"
        ),
        "Block": dense_or(lambda c: c.get("block_size"), lambda r: "-"),
        "Kept (achieved)": lambda r: "-" if achieved_kept(r) is None else f"{achieved_kept(r):.2%}",
        "Speedup vs Dense": speedup,
        "TFLOP/s (executed)": lambda r: f"{r.tflops_executed:.1f}" if ok(r) and r.tflops_executed else "-",
        "Compile (s)": lambda r: f"{r.compile_ms / 1e3:.1f}" if r.compile_ms else "-",
    }
