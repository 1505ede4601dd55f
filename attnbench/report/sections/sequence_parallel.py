"""Whether splitting the sequence over devices helps: each ring (sequence-parallel) measurement
against the same length on one device (time, throughput, memory per rank), where each rank's
time goes, and the longest sequence over several devices against one device's."""

from __future__ import annotations

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, memory, tok_s, tokens_cell
from attnbench.report.intervals import ms_cell, ratio_cell
from attnbench.report.markdown import Table
from attnbench.report.sections import Section, register
from attnbench.report.tables.multigpu import rank_breakdown, ring_pairs, scaling_families
from attnbench.units import flop_rate, format_bytes


def _against_one_device(doc: Doc, m: Machine) -> None:
    pairs = ring_pairs(m.rows)
    if not pairs:
        if m.several_gpus:
            doc.missing("no multi-GPU ring rows on this machine", "ring-points")
        return

    def ring_tok_s(p):
        r = p.row
        return r.tokens_per_s or (d.tokens(r) / (r.time_ms / 1e3) if r.time_ms else None)

    columns = {
        "Sequence Length": (lambda p: p.row.seq_len, tokens_cell),
        "Configuration": lambda p: d.describe(p.row),
        "Ranks": lambda p: p.world_size,
        "Baseline": lambda p: p.baseline_text,
        "One-Device Time": (lambda p: p.base_ci, ms_cell),
        "Ring Time": (lambda p: p.time_ci, ms_cell),
        "Speedup": (lambda p: p.speedup_ci, ratio_cell),
        "Efficiency": (lambda p: p.efficiency_ci, lambda v: ratio_cell(v, anomaly_above_one=True)),
        "Efficiency (same split)": (lambda p: p.efficiency_same_split, lambda v: f"{v:.3f}"),
        "Eager Efficiency": (lambda p: p.eager_efficiency if p.timer == "gpu" else None, lambda v: f"{v:.2f}"),
        "Ring Tokens/s": (ring_tok_s, tok_s),
        "TFLOP/s per GPU": (lambda p: p.tflops_per_gpu, flop_rate),
        "One-Device Memory": (lambda p: d.peak_per_gpu(p.single), memory),
        "Memory per Rank": (lambda p: d.peak_per_gpu(p.row), memory),
        "Sent per Call": (lambda p: p.sent_bytes, format_bytes),
        "algbw (GB/s)": (lambda p: getattr(p.row, "algbw_gbps", None), lambda v: f"{v:,.2f}"),
        "Link (GB/s)": (lambda p: getattr(p.row, "link_gbps", None), lambda v: f"{v:,.1f}"),
        "Timer": lambda p: p.timer,
    }
    doc.table(Table.of("ring-vs-one-device", columns, pairs))
    cpu = m.on_cpu
    doc.add(
        f"\nA rank is {'one CPU process (gloo)' if cpu else 'one GPU'}. Speedup = the baseline's time / the ring's "
        "(the slowest rank's) at the same length; efficiency = speedup / ranks, ±half its 95% bootstrap interval "
        "(n samples). Timer `gpu` where both rows have GPU time (a ring's ranks replay a captured call together: "
        "the ring without its host), else `eager`; `Eager Efficiency` beside a `gpu` one is what a caller sees on "
        "this host. TFLOP/s per GPU: the call's executed FLOPs over its time and its ranks. Memory per "
        f"rank is the fullest rank's {'resident-set growth' if cpu else '`max_memory_allocated`'}. Baseline "
        "`equal work`: the single-device implementation of the same key sets over the whole sequence (sdpa for "
        "ring, dilated for ring-dilated, block-sparse for block-sparse-ring); `same split`: the same implementation "
        "on one rank, the baseline only where no equal-work row was measured, else its efficiency beside. Sent "
        "per Call: bytes the busiest rank sends; algbw: those bytes over the call's time (nccl-tests' algbw); "
        "Link: the same ranks' exchange alone, measured just before the trial.\n"
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
