"""How long a sequence each configuration handles: every max-seq search on one GPU and over
several (each trial with its memory), and memory per token at the longest sequence."""

from __future__ import annotations

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, memory, per_token, times, tokens_cell
from attnbench.report.markdown import Table, result_text, short_message
from attnbench.report.sections import Section, register
from attnbench.report.tables.multigpu import gpu_peak
from attnbench.report.tables.sweep import CONFIRMED, each_length_once, memory_table, summary_table


def _multi_gpu_tables(doc: Doc, m: Machine) -> None:
    for s in m.summaries:
        if s.world_size > 1:
            doc.heading(5, f"{s.label}: {s.world_size} GPUs, {d.settings_text(s.head)}")
            trials = sorted((r for r in m.trials if r.series == s.series), key=lambda r: r.seq_len)
            doc.table(_multi_gpu_table(trials, s.world_size))


def _multi_gpu_table(trials: list, n: int) -> Table:
    rows, confirmed = each_length_once(trials)
    columns = {"Sequence Length": (lambda r: r.seq_len, tokens_cell)}
    for i in range(n):
        columns[f"GPU{i} Memory"] = (lambda r, i=i: gpu_peak(r, i), memory)
    columns["Result"] = (lambda r: r.status, result_text)
    columns["Notes"] = (
        lambda r: CONFIRMED if r.seq_len in confirmed and r.status == "ok" else r.message or "",
        short_message,
    )
    return Table.of("multi-gpu-max", columns, rows)


def _memory_at_longest(doc: Doc, m: Machine) -> None:
    # (summary, its trial at the longest length, that trial's peak per GPU)
    found = [(s, best, d.peak_per_gpu(best)) for s in m.summaries if (best := m.at_max(s))]
    if not found:
        doc.missing("no successful max-seq trial on this machine", "single")
        return
    columns = {
        "Implementation": lambda x: x[0].label,
        "GPUs": lambda x: x[0].world_size,
        "Sequence Length": (lambda x: x[1].seq_len, tokens_cell),
        "Input Tensors (QKV)": (lambda x: x[1].inputs_bytes, memory),
        "Peak Memory": (lambda x: x[2], memory),
        "Memory per Token": (lambda x: x[2] / (d.tokens(x[1]) / x[0].world_size) if x[2] else None, per_token),
        "Peak / Floor": (lambda x: x[1].peak_over_floor, times),
    }
    doc.table(Table.of("memory-at-longest", columns, found))


def render(doc: Doc, m: Machine) -> None:
    single = [s for s in m.summaries if s.world_size == 1]
    doc.heading(4, "One device")
    if single:
        doc.add(summary_table(single))
        doc.add(
            "\nMax Sequence is the bracket a search ends with: the longest length that ran – the shortest "
            "that failed; ≥ where the search did not finish. Every trial of each search:\n"
        )
        for s in single:
            rows = sorted((r for r in m.trials if r.series == s.series), key=lambda r: r.seq_len)
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
