"""The plots of one machine: memory, time and TFLOP/s against length (small multiples by
implementation family, newest code version only) and the speedup bars."""

from __future__ import annotations

from attnbench.report.document import Doc, Machine
from attnbench.report.sections import Section, register


def render(doc: Doc, m: Machine) -> None:
    from attnbench.report.plots import figures as p

    before = len(doc.figures)
    doc.figure("memory", p.memory_plot(m.rows, m.name), "peak memory vs sequence length, with the memory floor dashed")
    doc.figure("time", p.time_plot(m.rows, m.name), "time vs sequence length, log-log")
    doc.figure("tflops", p.tflops_plot(m.rows, m.name), "achieved TFLOP/s vs sequence length")
    doc.figure("speedup", p.speedup_plot(m.speedups, m.name), "speedup per strategy and GPU count")
    if len(doc.figures) == before:
        doc.missing("no successful trials to plot on this machine", "single")
    elif m.several_gpus and not any(c.speedup for c in m.speedups):
        doc.missing("no speedup bars (no speedup rows on this machine)", "speedup")


register(Section(80, "Plots", render, report_only=True))
