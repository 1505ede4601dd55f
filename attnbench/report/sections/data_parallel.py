"""Whether data parallelism helps: one GPU against each multi-GPU strategy (DataParallel, one
process per GPU) at the same cases, with efficiency, output match and memory per GPU."""

from __future__ import annotations

from attnbench.measure.stats import Interval
from attnbench.plan import strategies
from attnbench.report.data import gpus
from attnbench.report.document import Doc, Machine, memory, tokens_cell, yes_no
from attnbench.report.intervals import ms_cell, ratio_cell
from attnbench.report.markdown import Columns, Table, result_text, short_message
from attnbench.report.sections import Section, register
from attnbench.report.tables.multigpu import SpeedupCase, gpu_peak, gpus_in, speedup_groups


def _time_or_result(v: Interval | str) -> str:
    """A multi-GPU time, or what kept the trial from one (skipped, OOM)."""
    return ms_cell(v) if isinstance(v, Interval) else result_text(v)


def run_column(cases: list[SpeedupCase]) -> Columns:
    """The run a row came from, where its table mixes runs (the same case measured twice)."""
    return {"Run": lambda c: c.row.run} if len({o.row.run for o in cases}) > 1 else {}


def memory_distribution(doc: Doc, cases: list[SpeedupCase], name: str) -> None:
    """What each GPU held: allocator peak per GPU, then NVML device memory used at the peak."""
    if not any(gpus(c.row) for c in cases):  # CPU processes: no device memory to show
        return
    n = gpus_in([c.row for c in cases])
    columns = {
        "Strategy": lambda c: c.row.strategy,
        "Sequence Length": (lambda c: c.row.seq_len, tokens_cell),
        "Batch Size": lambda c: c.row.batch,
        **run_column(cases),
    }
    for header, counter in (("GPU {} Memory", "max_memory_allocated"), ("NVML GPU {}", "nvml_used_peak")):
        for i in range(n):
            columns[header.format(i)] = (lambda c, i=i, counter=counter: gpu_peak(c.row, i, counter), memory)
    doc.add(
        "\nMemory per GPU: `max_memory_allocated` of each GPU; NVML columns: device memory used at the peak "
        "(includes the CUDA context).\n"
    )
    doc.table(Table.of(name, columns, cases))


def speedup_anomalies(c: SpeedupCase) -> list[str]:
    """What makes a speedup suspect: an interval that includes 1, an efficiency above 1."""
    iv, out = c.speedup_ci, []
    if iv is not None and iv.n > 1 and iv.low <= 1 <= iv.high:
        out.append("anomaly: interval includes 1")
    if c.efficiency and c.efficiency > 1:
        out.append(f"anomaly: efficiency {c.efficiency:.2f} above 1")
    return out


def speedup_notes(c: SpeedupCase) -> str:
    bits = speedup_anomalies(c) if c.speedup else []  # first: a cell is cut to one line
    bits += [c.row.note] if c.row.note else []
    r = c.row
    if r.status != "ok":
        bits.append(r.message or "")
    if c.single is None:
        bits.append("no single-GPU row for this case")
    if c.row.output_match is False:
        bits.append("OUTPUT DIFFERS from single GPU")
    return "; ".join(b for b in bits if b)


def call_costs(doc: Doc, m: Machine) -> None:
    """Per kernel and strategy, the line through its times against one GPU's, and in words
    where DataParallel's fixed cost comes from (its rows beside the `thread` rows)."""
    from attnbench.report.tables.call_cost import call_costs as lines
    from attnbench.report.tables.call_cost import thread_share
    from attnbench.report.tables.second_gpu import kernel_name

    costs = lines(speedup_groups(m.speedups))
    if not costs:
        return
    doc.heading(4, "What a call costs, per kernel and strategy")
    doc.add(
        "\nA straight line through each strategy's eager times against the one-GPU time of the same cases "
        "(weighted by relative error): the fixed cost per call, the cost per millisecond of one GPU's work "
        "(1/GPUs at best; 1 for `thread`, which runs on one GPU), and the one-GPU call time from which the "
        "strategy is faster than one GPU. ±: half the 95% interval from the line's residuals, n cases.\n"
    )
    columns = {
        "Kernel": lambda c: kernel_name(c.single) if c.single else c.family,
        "Strategy": lambda c: strategies.label(c.strategy),
        "Fixed cost per call": lambda c: ms_cell(c.line.fixed),
        "Per ms of one GPU's work": lambda c: ratio_cell(c.line.per_work),
        "Faster than one GPU from": (
            lambda c: None if c.strategy == "thread" else c.line.break_even_ms,
            lambda v: f"{v:,.3g} ms calls",
        ),
        "First faster case": lambda c: c.first_faster_case,
    }
    doc.table(Table.of("call-costs", columns, costs))
    pairs = list(thread_share(costs).values())
    if pairs:
        doc.add(
            "\nWhere DataParallel's fixed cost comes from: it starts a thread per replica at every call, and the "
            "`thread` rows time the same call on one GPU from a new thread, with no second GPU, scatter or gather "
            "involved. What a new thread costs is the kernel library's:\n"
        )
        for dp, thread in pairs:
            name = kernel_name(dp.single) if dp.single else dp.family
            doc.add(
                f"- {name}: DataParallel {ms_cell(dp.line.fixed)} per call; a new thread alone "
                f"{ms_cell(thread.line.fixed)}"
            )


def render(doc: Doc, m: Machine) -> None:
    if not m.speedups:
        if m.several_gpus:
            doc.missing("no speedup rows on this machine", "speedup")
        return
    call_costs(doc, m)
    for (strategy, label), cases in speedup_groups(m.speedups).items():
        doc.heading(4, f"{strategies.label(strategy)}: {label}")
        columns = {
            "Sequence Length": (lambda c: c.row.seq_len, tokens_cell),
            "Batch Size": lambda c: c.row.batch,
            **run_column(cases),
            "Single GPU Time": (lambda c: c.base_ci, ms_cell),
            "Multi-GPU Time": (lambda c: c.time_ci if c.row.status == "ok" else c.row.status, _time_or_result),
            "Speedup": (lambda c: c.speedup_ci, ratio_cell),
            "Notes": (speedup_notes, short_message),
            "Efficiency": (lambda c: c.efficiency_ci, lambda v: ratio_cell(v, anomaly_above_one=True)),
            "Output Match": (lambda c: c.row.output_match, yes_no),
            "Timer": lambda c: c.timer,
        }
        doc.table(Table.of(f"speedup-{strategy}", columns, cases))
        memory_distribution(doc, cases, f"speedup-{strategy}-memory")
    doc.add(
        "\nSpeedup = single-GPU time / multi-GPU time for the same implementation, configuration, length, "
        "batch, dtype, mode and module on this machine; efficiency = speedup / GPUs. Times are medians "
        "±half their 95% bootstrap interval (n samples); a ratio's interval resamples both sides. Timer: "
        "`gpu` where both rows have GPU time (CUDA graph or back-to-back calls), else `eager` (one "
        "synchronised call, dispatch included).\n"
    )


register(Section(50, "Data parallelism: speedup over one GPU", render))
