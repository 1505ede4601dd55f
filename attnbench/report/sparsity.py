"""Report 002's "Block-Sparse Base Implementation" table, from result rows only:

    Sequence Length | Time (ms) | Memory (MB) | Result | Sparsity

with dense ``sdpa`` rows and block-sparse rows at several sparsity ratios, plus what the seeds
lacked: the pattern and block size, the kept fraction actually achieved, the wall-clock
speedup over the fastest dense ``sdpa`` row at the same length (same run, same workload), the
executed TFLOP/s, and FlexAttention's compile time (first call), apart from the steady state.
"""

from __future__ import annotations

from typing import Any

from attnbench.report.markdown import result_text, table
from attnbench.units import format_sparsity, format_tokens

SPARSE = "block-sparse"
DENSE = "sdpa"
HEADERS = [
    "Sequence Length",
    "Time (ms)",
    "Memory (MB)",
    "Result",
    "Sparsity",
    "Pattern",
    "Block",
    "Kept (achieved)",
    "Speedup vs Dense",
    "TFLOP/s (executed)",
    "Compile (s)",
]


def _workload(r: dict[str, Any]) -> tuple:
    return (
        r["dtype"],
        r["batch"],
        r["heads"],
        r["head_dim"],
        r["mode"],
        bool(r["causal"]),
        r["device"],
        (r.get("env") or {}).get("machine"),
    )


def achieved_kept(r: dict[str, Any]) -> float | None:
    """Kept share of the pairs the mask allows: all N^2, or N(N+1)/2 when causal."""
    kept = r.get("kept_fraction")
    if kept is None:
        return None
    n = r["seq_len"]
    return kept * n / ((n + 1) / 2) if r.get("causal") else kept


def _configured_sparsity(config: dict[str, Any]) -> str:
    ratio = config.get("sparsity_ratio")
    return format_sparsity(1.0 if ratio is None else ratio)


def sparsity_table(rows: list[dict[str, Any]], level: int = 5) -> str:
    """Markdown: one table per workload that has block-sparse trials ("" when none has), each
    under a heading of this level (the report nests them under its level-4 heading)."""
    trials = [r for r in rows if r.get("kind") in ("points", "max-seq") and r.get("impl") in (SPARSE, DENSE)]
    if not any(r["impl"] == SPARSE for r in trials):
        return ""
    # the timing sweep's points; a run with only max-seq searches shows their trials
    if any(r["kind"] == "points" and r["impl"] == SPARSE for r in trials):
        trials = [r for r in trials if r["kind"] == "points"]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in trials:
        groups.setdefault(_workload(r), []).append(r)
    parts = []
    for key, group in groups.items():
        if not any(r["impl"] == SPARSE for r in group):
            continue
        dtype, batch, heads, head_dim, mode, causal, device, machine = key
        parts.append(
            f"\n{'#' * level} {dtype}, B={batch}, H={heads}, D={head_dim}, {mode}{', causal' if causal else ''}, "
            f"{machine or device}\n\n"
        )
        parts.append(table(HEADERS, [_row(r, _fastest_dense(group, r["seq_len"])) for r in _ordered(group)]))
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


def _ordered(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r):
        c = r.get("config") or {}
        sparse = r["impl"] == SPARSE
        return (
            r["seq_len"],
            sparse,
            -(c.get("sparsity_ratio") or 1.0),
            c.get("pattern_type") or "",
            c.get("block_size") or 0,
            c.get("backend") or "",
        )

    return sorted(group, key=key)


def _fastest_dense(group: list[dict[str, Any]], seq_len: int) -> dict[str, Any] | None:
    dense = [
        r for r in group if r["impl"] == DENSE and r["seq_len"] == seq_len and r["status"] == "ok" and r.get("time_ms")
    ]
    return min(dense, key=lambda r: r["time_ms"], default=None)


def _row(r: dict[str, Any], dense: dict[str, Any] | None) -> list[Any]:
    c = r.get("config") or {}
    ok = r["status"] == "ok" and r.get("time_ms")
    sparse = r["impl"] == SPARSE
    kept = achieved_kept(r)
    if sparse:
        pattern, block, sparsity = c.get("pattern_type"), c.get("block_size"), _configured_sparsity(c)
    else:
        pattern, block, sparsity = f"dense sdpa ({r.get('backend') or c.get('backend')})", "-", "Dense"
    return [
        format_tokens(r["seq_len"]),
        f"{r['time_ms']:,.2f}" if ok else "-",
        f"{r['peak_bytes'] / 1e6:,.1f}" if ok and r.get("peak_bytes") else "-",
        result_text(r["status"]),
        sparsity,
        pattern,
        block,
        f"{kept:.2%}" if kept is not None else "-",
        f"{dense['time_ms'] / r['time_ms']:.2f}x" if ok and dense else "-",
        f"{r['tflops_executed']:.1f}" if ok and r.get("tflops_executed") else "-",
        f"{r['compile_ms'] / 1e3:.1f}" if r.get("compile_ms") else "-",
    ]
