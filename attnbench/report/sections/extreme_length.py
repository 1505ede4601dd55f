"""Extreme sequence length (seed report 002): the largest sequence on one GPU and over several,
fixed-length measurements, the block-sparse base table and memory efficiency at the largest."""

from __future__ import annotations

from typing import Any

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, gb, per_token, times, tokens_cell
from attnbench.report.markdown import Table, result_text, short_message
from attnbench.report.multigpu import memory_per_gpu_cells
from attnbench.report.sweep_tables import max_seq_summary, memory_table, series_groups, summary_table, time_table

SPARSITY_MODULE = "attnbench.report.sparsity"


def sparsity_section(rows: list[dict[str, Any]]) -> str:
    """Report 002's block-sparse base table, from the block-sparse module where it exists."""
    import importlib

    try:
        module = importlib.import_module(SPARSITY_MODULE)
    except ImportError:
        return ""
    return module.sparsity_table(rows) or ""


def multi_gpu_max_tables(doc: Doc, m: Machine) -> bool:
    found = False
    for s in m.summaries:
        if s["world_size"] == 1:
            continue
        found = True
        rows = sorted((r for r in m.trials if r["series"] == s["series"]), key=lambda r: r["seq_len"])
        n = s["world_size"]
        doc.heading(5, f"{s['label']}: {n} GPUs, {d.settings_text(s['head'])}")
        headers = ["Sequence Length"] + [f"GPU{i} Memory" for i in range(n)] + ["Result", "Notes"]
        records = []
        for r in rows:
            cells = memory_per_gpu_cells(r, n)
            records.append(
                {
                    "Sequence Length": r["seq_len"],
                    **{f"GPU{i} Memory": cells[f"GPU {i} Memory"] for i in range(n)},
                    "Result": r["status"],
                    "Notes": r.get("message") or "",
                }
            )
        doc.table(
            Table(
                "002-multi-gpu-max",
                headers,
                records,
                {
                    "Sequence Length": tokens_cell,
                    "Result": result_text,
                    "Notes": short_message,
                    **{f"GPU{i} Memory": gb for i in range(n)},
                },
            )
        )
    return found


def extreme_length(doc: Doc, m: Machine) -> None:
    single = [s for s in m.summaries if s["world_size"] == 1]
    doc.heading(4, "1. Single GPU maximum")
    if single:
        single_rows = [r for r in m.trials if d.world_size(r) == 1]
        finished = [r for r in m.rows if r.get("kind") == "max-seq-result"]
        doc.add(summary_table(max_seq_summary(single_rows + finished)))
        for s in single:
            rows = sorted((r for r in single_rows if r["series"] == s["series"]), key=lambda r: r["seq_len"])
            doc.heading(5, f"{s['label']}: {d.settings_text(s['head'])}")
            doc.add(memory_table(rows))
    else:
        doc.missing("no single-GPU max-seq search on this machine", "single")
    points = [
        g
        for g in series_groups(m.trials).values()
        if g[0]["kind"] == "points" and d.world_size(g[0]) == 1 and not g[0]["impl"].startswith("block-sparse")
    ]
    if points:
        doc.heading(4, "Fixed-length measurements")
        for rows in points:
            doc.heading(5, f"{d.describe(rows[0])}: {d.settings_text(rows[0])}")
            doc.add(time_table(rows))
    doc.heading(4, "Block-sparse base implementation")
    sparse = sparsity_section(m.rows)
    if sparse.strip():
        doc.add(sparse)
    else:
        doc.missing(
            "no block-sparse rows on this machine (or the block-sparse tables are not installed)", "block-sparse"
        )
    doc.heading(4, "2. Multi-GPU maximum")
    if not multi_gpu_max_tables(doc, m):
        doc.missing("no multi-GPU max-seq search on this machine", "ring-max-seq")
    doc.heading(4, "Memory efficiency at the largest sequence")
    records = []
    for s in m.summaries:
        best = m.at_max(s)
        if not best:
            continue
        peak = d.peak_per_gpu(best)
        records.append(
            {
                "Implementation": s["label"],
                "GPUs": s["world_size"],
                "Sequence Length": best["seq_len"],
                "Input Tensors (QKV)": best.get("inputs_bytes"),
                "Peak Memory": peak,
                "Memory per Token": peak / (d.tokens(best) / s["world_size"]) if peak else None,
                "Peak / Floor": best.get("peak_over_floor"),
            }
        )
    if records:
        doc.table(
            Table(
                "002-memory-efficiency",
                [
                    "Implementation",
                    "GPUs",
                    "Sequence Length",
                    "Input Tensors (QKV)",
                    "Peak Memory",
                    "Memory per Token",
                    "Peak / Floor",
                ],
                records,
                {
                    "Sequence Length": tokens_cell,
                    "Input Tensors (QKV)": gb,
                    "Peak Memory": gb,
                    "Memory per Token": per_token,
                    "Peak / Floor": times,
                },
            )
        )
    else:
        doc.missing("no successful max-seq trial on this machine", "single")
    doc.add(
        "\nScaling to larger GPUs and the memory estimation formula: see Capacity prediction (a fit of the "
        "measured peaks, not a linear extrapolation of one number).\n"
    )
