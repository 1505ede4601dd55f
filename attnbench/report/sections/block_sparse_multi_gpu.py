"""Block-sparse over several GPUs (seed report 000): its data-parallel speedup, memory per
GPU, and the measured memory saving of the ring implementations."""

from __future__ import annotations

from typing import Any

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, gb, tokens_cell
from attnbench.report.intervals import ratio_cell
from attnbench.report.markdown import Table, short_message
from attnbench.report.multigpu import ring_pairs
from attnbench.report.sections.data_parallel import memory_distribution, speedup_notes


def ring_memory_records(m: Machine) -> list[dict[str, Any]]:
    """Memory per GPU of each ring measurement against the same length on one GPU."""
    records = []
    for p in ring_pairs(m.rows):
        r, s = p["row"], p["single"]
        mine, base = d.peak_per_gpu(r), d.peak_per_gpu(s) if s else None
        records.append(
            {
                "Sequence Length": r["seq_len"],
                "Implementation": d.describe(r),
                "GPUs": d.world_size(r),
                "Tokens per GPU": r["seq_len"] // d.world_size(r),
                "Memory per GPU": mine,
                "Single-GPU Memory": base,
                "Saved per GPU": base - mine if base and mine else None,
            }
        )
    return records


def block_sparse_multi_gpu(doc: Doc, m: Machine) -> None:
    sparse = [c for c in m.speedups if str(c["impl"]).startswith("block-sparse")]
    doc.heading(4, "Data-parallel performance (block-sparse)")
    if sparse:
        doc.table(
            Table(
                "000-speedup",
                ["Sequence Length", "Batch Size", "Strategy", "GPUs", "Speedup", "Notes"],
                [
                    {
                        "Sequence Length": c["seq_len"],
                        "Batch Size": c["batch"],
                        "Strategy": c["strategy"],
                        "GPUs": c["world_size"],
                        "Speedup": c["speedup_ci"],
                        "Notes": speedup_notes(c),
                    }
                    for c in sparse
                ],
                {"Sequence Length": tokens_cell, "Speedup": ratio_cell, "Notes": short_message},
            )
        )
        doc.heading(4, "Memory distribution")
        memory_distribution(doc, sparse, "000-memory-distribution")
    else:
        doc.missing("no block-sparse speedup rows on this machine", "speedup-block-sparse")
    doc.heading(4, "Ring scaling (measured, not theoretical)")
    records = ring_memory_records(m)
    if records:
        doc.table(
            Table(
                "000-ring-scaling",
                [
                    "Sequence Length",
                    "Implementation",
                    "GPUs",
                    "Tokens per GPU",
                    "Memory per GPU",
                    "Single-GPU Memory",
                    "Saved per GPU",
                ],
                records,
                {
                    "Sequence Length": tokens_cell,
                    "Tokens per GPU": tokens_cell,
                    "Memory per GPU": gb,
                    "Single-GPU Memory": gb,
                    "Saved per GPU": gb,
                },
            )
        )
    else:
        doc.missing("no multi-GPU ring rows on this machine", "ring-points")
