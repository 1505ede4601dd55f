"""Ring attention against one GPU (seed report 004): time, throughput and memory per GPU of
each ring measurement beside its single-GPU baseline, and where each rank's time goes."""

from __future__ import annotations

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, gb, ms, times, tok_s, tokens_cell
from attnbench.report.markdown import Table
from attnbench.report.multigpu import rank_breakdown, ring_pairs
from attnbench.units import format_bytes


def ring_vs_single_gpu(doc: Doc, m: Machine) -> None:
    pairs = ring_pairs(m.rows)
    if not pairs:
        doc.missing("no multi-GPU ring rows on this machine", "ring-points")
        return
    records = []
    for p in pairs:
        r, s = p["row"], p["single"]
        records.append(
            {
                "Sequence Length": r["seq_len"],
                "Configuration": d.describe(r),
                "GPUs": d.world_size(r),
                "Single GPU Time": s.get("time_ms") if s else None,
                "Single GPU Tokens/s": s.get("tokens_per_s") if s else None,
                "Single GPU Memory": d.peak_per_gpu(s) if s else None,
                "Ring Time": r.get("time_ms"),
                "Ring Tokens/s": r.get("tokens_per_s")
                or (d.tokens(r) / (r["time_ms"] / 1e3) if r.get("time_ms") else None),
                "Memory per GPU": d.peak_per_gpu(r),
                "Overhead": r["time_ms"] / s["time_ms"] if s and s.get("time_ms") and r.get("time_ms") else None,
                "Baseline": f"{p['baseline']}: {s['impl']}" if s else None,
                "Sent per Call": r.get("sent_bytes"),
                "algbw (GB/s)": r.get("algbw_gbps"),
            }
        )
    doc.table(
        Table(
            "004-ring-vs-single",
            list(records[0]),
            records,
            {
                "Sequence Length": tokens_cell,
                "Single GPU Time": ms,
                "Single GPU Tokens/s": tok_s,
                "Single GPU Memory": gb,
                "Ring Time": ms,
                "Ring Tokens/s": tok_s,
                "Memory per GPU": gb,
                "Overhead": times,
                "Sent per Call": format_bytes,
                "algbw (GB/s)": lambda v: f"{v:,.2f}",
            },
        )
    )
    doc.add(
        "\nOverhead = ring time / single-GPU time at the same length (below 1: the ring is faster). Ring time is "
        "the slowest rank's; memory is `max_memory_allocated` of the fullest GPU. Baseline `equal work`: the "
        "single-device implementation of the same key sets over the whole sequence on one GPU (sdpa for ring, "
        "dilated for ring-dilated); `same split`: the same implementation on one rank, used only where no "
        "equal-work row was measured. Sent per Call: bytes the busiest rank sends; algbw: those bytes over the "
        "call's time (nccl-tests' algbw).\n"
    )
    ranks = rank_breakdown(m.rows)
    if ranks:
        doc.heading(4, "Where the time goes, per rank")
        doc.table(
            Table(
                "004-ranks",
                ["Sequence Length", "Configuration", "Rank", "Compute (ms)", "Waiting on Communication (ms)"],
                [
                    {
                        "Sequence Length": x["row"]["seq_len"],
                        "Configuration": d.describe(x["row"]),
                        "Rank": x["rank"],
                        "Compute (ms)": x["compute_ms"],
                        "Waiting on Communication (ms)": x["comm_wait_ms"],
                    }
                    for x in ranks
                ],
                {
                    "Sequence Length": tokens_cell,
                    "Compute (ms)": lambda v: f"{v:,.2f}",
                    "Waiting on Communication (ms)": lambda v: f"{v:,.2f}",
                },
            )
        )
