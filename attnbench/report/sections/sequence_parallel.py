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

    def peaks(p):  # (one device's memory, the fullest rank's)
        return d.peak_per_gpu(p.single), d.peak_per_gpu(p.row)

    def overhead(p):
        r, s = p.row, p.single
        return r.time_ms / s.time_ms if s and s.time_ms and r.time_ms else None

    def ring_tok_s(p):
        r = p.row
        return r.tokens_per_s or (d.tokens(r) / (r.time_ms / 1e3) if r.time_ms else None)

    def saved(p):
        base, mine = peaks(p)
        return base - mine if base and mine else None

    def single(attr):
        return lambda p: getattr(p.single, attr) if p.single else None

    columns = {
        "Sequence Length": (lambda p: p.row.seq_len, tokens_cell),
        "Configuration": lambda p: d.describe(p.row),
        "Ranks": lambda p: d.world_size(p.row),
        "One-Device Time": (single("time_ms"), ms),
        "Ring Time": (lambda p: p.row.time_ms, ms),
        "Overhead": (overhead, times),
        "One-Device Tokens/s": (single("tokens_per_s"), tok_s),
        "Ring Tokens/s": (ring_tok_s, tok_s),
        "One-Device Memory": (lambda p: peaks(p)[0], memory),
        "Memory per Rank": (lambda p: peaks(p)[1], memory),
        "Saved per Rank": (saved, memory),
        "Baseline": lambda p: f"{p.baseline}: {p.single.impl}" if p.single else None,
        "Sent per Call": (lambda p: getattr(p.row, "sent_bytes", None), format_bytes),
        "algbw (GB/s)": (lambda p: getattr(p.row, "algbw_gbps", None), lambda v: f"{v:,.2f}"),
        "Link (GB/s)": lambda p: getattr(p.row, "link_gbps", None),
    }
    doc.table(Table.of("ring-vs-one-device", columns, pairs))
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
    columns = {
        "Sequence Length": (lambda x: x.row.seq_len, tokens_cell),
        "Configuration": lambda x: d.describe(x.row),
        "Rank": lambda x: x.rank,
        "Compute (ms)": (lambda x: x.compute_ms, lambda v: f"{v:,.2f}"),
        "Waiting on Communication (ms)": (lambda x: x.comm_wait_ms, lambda v: f"{v:,.2f}"),
    }
    doc.table(Table.of("ring-ranks", columns, ranks))


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
        counts = [(1, one)] if single else []
        counts += [(s.world_size, s.max_seq_len or None) for s in fam.multi]
        columns = {
            "GPUs": lambda c: c[0],
            "Perfect Split": (lambda c: c[0] * c[2] if c[2] else None, tokens_cell),
            "Measured": (lambda c: c[1], tokens_cell),
        }
        doc.table(Table.of("ring-longest", columns, [(*c, one) for c in counts]))
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
