"""How long a sequence each configuration handles: every max-seq search on one GPU and over
several (each trial with its memory), and memory per token at the longest sequence."""

from __future__ import annotations

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, memory, per_token, times, tokens_cell
from attnbench.report.markdown import Table, result_text, short_message
from attnbench.report.sections import Section, register
from attnbench.report.tables.multigpu import memory_per_gpu_cells
from attnbench.report.tables.sweep import CONFIRMED, each_length_once, max_seq_summary, memory_table, summary_table


def _multi_gpu_tables(doc: Doc, m: Machine) -> None:
    for s in m.summaries:
        if s.world_size == 1:
            continue
        rows, confirmed = each_length_once(
            sorted((r for r in m.trials if r.series == s.series), key=lambda r: r.seq_len)
        )
        n = s.world_size
        doc.heading(5, f"{s.label}: {n} GPUs, {d.settings_text(s.head)}")
        headers = ["Sequence Length"] + [f"GPU{i} Memory" for i in range(n)] + ["Result", "Notes"]
        records = []
        for r in rows:
            cells = memory_per_gpu_cells(r, n)
            records.append(
                {
                    "Sequence Length": r.seq_len,
                    **{f"GPU{i} Memory": cells[f"GPU {i} Memory"] for i in range(n)},
                    "Result": r.status,
                    "Notes": CONFIRMED if r.seq_len in confirmed and r.status == "ok" else r.message or "",
                }
            )
        doc.table(
            Table(
                "multi-gpu-max",
                headers,
                records,
                {
                    "Sequence Length": tokens_cell,
                    "Result": result_text,
                    "Notes": short_message,
                    **{f"GPU{i} Memory": memory for i in range(n)},
                },
            )
        )


def _memory_at_longest(doc: Doc, m: Machine) -> None:
    records = []
    for s in m.summaries:
        best = m.at_max(s)
        if not best:
            continue
        peak = d.peak_per_gpu(best)
        records.append(
            {
                "Implementation": s.label,
                "GPUs": s.world_size,
                "Sequence Length": best.seq_len,
                "Input Tensors (QKV)": best.inputs_bytes,
                "Peak Memory": peak,
                "Memory per Token": peak / (d.tokens(best) / s.world_size) if peak else None,
                "Peak / Floor": best.peak_over_floor,
            }
        )
    if not records:
        doc.missing("no successful max-seq trial on this machine", "single")
        return
    doc.table(
        Table(
            "memory-at-longest",
            list(records[0]),
            records,
            {
                "Sequence Length": tokens_cell,
                "Input Tensors (QKV)": memory,
                "Peak Memory": memory,
                "Memory per Token": per_token,
                "Peak / Floor": times,
            },
        )
    )


def render(doc: Doc, m: Machine) -> None:
    single = [s for s in m.summaries if s.world_size == 1]
    doc.heading(4, "One device")
    if single:
        single_rows = [r for r in m.trials if d.world_size(r) == 1]
        doc.add(summary_table(max_seq_summary(single_rows + d.search_results(m.rows))))
        doc.add(
            "\nMax Sequence is the bracket a search ends with: the longest length that ran – the shortest "
            "that failed; ≥ where the search did not finish. Every trial of each search:\n"
        )
        for s in single:
            rows = sorted((r for r in single_rows if r.series == s.series), key=lambda r: r.seq_len)
            doc.heading(5, f"{s.label}: {d.settings_text(s.head)}")
            doc.add(memory_table(rows))
    else:
        doc.missing("no single-device max-seq search on this machine", "single")
    if any(s.world_size > 1 for s in m.summaries):
        doc.heading(4, "Several GPUs")
        _multi_gpu_tables(doc, m)
    elif m.several_gpus:
        doc.heading(4, "Several GPUs")
        doc.missing("no multi-GPU max-seq search on this machine", "ring-max-seq")
    doc.heading(4, "Memory at the longest sequence")
    _memory_at_longest(doc, m)


register(Section(10, "How long: every max-seq search", render))
