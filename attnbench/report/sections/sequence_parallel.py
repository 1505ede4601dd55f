"""Whether splitting the sequence over devices helps: each ring (sequence-parallel) measurement
against the same length on one device (time, throughput, memory per rank), where each rank's
time goes, and the longest sequence over several devices against one device's."""

from __future__ import annotations

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, memory, ms, times, tok_s, tokens_cell
from attnbench.report.markdown import Table
from attnbench.report.sections import Section, register
from attnbench.report.tables.multigpu import rank_breakdown, ring_pairs, scaling_families
from attnbench.units import format_bytes


def _against_one_device(doc: Doc, m: Machine) -> None:
    pairs = ring_pairs(m.rows)
    if not pairs:
        if m.several_gpus:
            doc.missing("no multi-GPU ring rows on this machine", "ring-points")
        return
    records = []
    for p in pairs:
        r, s = p.row, p.single
        mine, base = d.peak_per_gpu(r), d.peak_per_gpu(s)
        records.append(
            {
                "Sequence Length": r.seq_len,
                "Configuration": d.describe(r),
                "Ranks": d.world_size(r),
                "One-Device Time": s.time_ms if s else None,
                "Ring Time": r.time_ms,
                "Overhead": r.time_ms / s.time_ms if s and s.time_ms and r.time_ms else None,
                "One-Device Tokens/s": s.tokens_per_s if s else None,
                "Ring Tokens/s": r.tokens_per_s or (d.tokens(r) / (r.time_ms / 1e3) if r.time_ms else None),
                "One-Device Memory": base,
                "Memory per Rank": mine,
                "Saved per Rank": base - mine if base and mine else None,
                "Baseline": f"{p.baseline}: {s.impl}" if s else None,
                "Sent per Call": getattr(r, "sent_bytes", None),
                "algbw (GB/s)": getattr(r, "algbw_gbps", None),
                "Link (GB/s)": getattr(r, "link_gbps", None),
            }
        )
    doc.table(
        Table(
            "ring-vs-one-device",
            list(records[0]),
            records,
            {
                "Sequence Length": tokens_cell,
                "One-Device Time": ms,
                "Ring Time": ms,
                "Overhead": times,
                "One-Device Tokens/s": tok_s,
                "Ring Tokens/s": tok_s,
                "One-Device Memory": memory,
                "Memory per Rank": memory,
                "Saved per Rank": memory,
                "Sent per Call": format_bytes,
                "algbw (GB/s)": lambda v: f"{v:,.2f}",
            },
        )
    )
    cpu = m.on_cpu
    doc.add(
        f"\nA rank is {'one CPU process (gloo)' if cpu else 'one GPU'}. Overhead = ring time / one device's "
        "time at the same length (below 1: the ring is faster); ring time is the slowest rank's. Memory per "
        f"rank is the fullest rank's {'resident-set growth' if cpu else '`max_memory_allocated`'}. Baseline "
        "`equal work`: the single-device implementation of the same key sets over the whole sequence (sdpa for "
        "ring, dilated for ring-dilated); `same split`: the same implementation on one rank, used only where no "
        "equal-work row was measured. Sent per Call: bytes the busiest rank sends; algbw: those bytes over the "
        "call's time (nccl-tests' algbw).\n"
    )


def _per_rank(doc: Doc, m: Machine) -> None:
    ranks = rank_breakdown(m.rows)
    if not ranks:
        return
    doc.heading(4, "Where the time goes, per rank")
    doc.table(
        Table(
            "ring-ranks",
            ["Sequence Length", "Configuration", "Rank", "Compute (ms)", "Waiting on Communication (ms)"],
            [
                {
                    "Sequence Length": x.row.seq_len,
                    "Configuration": d.describe(x.row),
                    "Rank": x.rank,
                    "Compute (ms)": x.compute_ms,
                    "Waiting on Communication (ms)": x.comm_wait_ms,
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


def _longest(doc: Doc, m: Machine) -> None:
    families = scaling_families(m.rows)
    if not families and not m.several_gpus:
        return
    doc.heading(4, "Longest sequence over several GPUs against one")
    if not families:
        doc.missing("no multi-GPU max-seq search on this machine", "ring-max-seq")
    for fam in families:
        single = fam.single
        doc.heading(5, f"{d.describe(fam.head)}: {d.settings_text(fam.head)}")
        one = single.max_seq_len if single else None
        records = [{"GPUs": 1, "Perfect Split": one, "Measured": one}] if single else []
        for s in fam.multi:
            records.append(
                {
                    "GPUs": s.world_size,
                    "Perfect Split": one * s.world_size if one else None,
                    "Measured": s.max_seq_len or None,
                }
            )
        doc.table(
            Table(
                "ring-longest",
                ["GPUs", "Perfect Split", "Measured"],
                records,
                {"Perfect Split": tokens_cell, "Measured": tokens_cell},
            )
        )
        doc.add(
            "\nPerfect Split: GPUs × the measured one-GPU maximum (memory split evenly, N/P per GPU)"
            + ("" if single else "; no one-GPU search of this configuration was measured here")
            + ". Measured: the longest length the search over that many GPUs ran.\n"
        )


def render(doc: Doc, m: Machine) -> None:
    _against_one_device(doc, m)
    _per_rank(doc, m)
    _longest(doc, m)


register(Section(60, "Sequence parallelism: ring attention against one device", render))
