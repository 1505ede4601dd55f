"""The report's document model and what every section uses: ``Doc`` (markdown parts, the
tables behind them as CSV, figures as PNG, other markdown files), ``Machine`` (one machine's
rows and what several sections derive from them), the cell formatters, and the command that
produces each kind of data (named where a section has none)."""

from __future__ import annotations

from concurrent.futures import Future
from functools import cached_property
from typing import Any

from attnbench.report import data as d
from attnbench.report.fit import capacities
from attnbench.report.markdown import Table, heading_text
from attnbench.report.plots.drawing import Drawing
from attnbench.report.tables.multigpu import speedup_cases
from attnbench.report.tables.sweep import MaxSeqSummary, max_seq_summary
from attnbench.results.schema import Row, Speedup, Trial
from attnbench.units import (
    format_bytes,
    format_bytes_per_token,
    format_ms,
    format_ratio,
    format_tokens,
    format_tokens_per_s,
)

# The command that produces each kind of data on a GPU machine, named where the data is missing.
PRODUCERS = {
    "single": "attnbench run --profile auto",
    "points": "attnbench run --profile auto",
    "seed-003": "attnbench run --profile seed-003",
    "block-sparse": "attnbench bench --impl block-sparse --seq-lens 64K,128K --param pattern_type=local_window "
    "--param sparsity_ratio=0.05",
    "speedup": "attnbench speedup --impl dilated --gpus 2",  # the seeds' cases, dp and mp
    "speedup-block-sparse": "attnbench speedup --impl block-sparse --gpus 2",
    "ring-max-seq": "attnbench max-seq --impl ring-dilated --gpus 2 --segment-lengths 2048,4096 --dilation-rates 1,2",
    "ring-points": "attnbench bench --impl ring-dilated --gpus 2 --seq-lens 1M,4M --segment-lengths 2048,4096 "
    "--dilation-rates 1,2",
    "training": "attnbench run --profile gpu-fwd-bwd",
    "models": "attnbench run --profile models",
}
# ... and on a CPU machine, where it differs: the profiles' CPU twins (two gloo processes for
# what takes two GPUs).
CPU_PRODUCERS = {
    "single": "attnbench run --profile default-cpu",
    "points": "attnbench run --profile models-cpu",
    "seed-003": "attnbench max-seq --impl dilated --device cpu --dtype fp32 --memory-limit 512MiB",
    "block-sparse": "attnbench bench --impl block-sparse --device cpu --dtype fp32 --seq-lens 4K,8K "
    "--param pattern_type=local_window --param sparsity_ratio=0.05",
    "speedup": "attnbench run --profile multi-gpu-cpu",
    "speedup-block-sparse": "attnbench run --profile multi-gpu-cpu",
    "ring-max-seq": "attnbench run --profile multi-gpu-cpu",
    "ring-points": "attnbench run --profile multi-gpu-cpu",
    "training": "attnbench run --profile models-cpu",
    "models": "attnbench run --profile models-cpu",
}


# --- formatting -----------------------------------------------------------------------------


memory, ms, times, tok_s, per_token = format_bytes, format_ms, format_ratio, format_tokens_per_s, format_bytes_per_token


def pct(v: float) -> str:
    text = f"{v * 100:+.1f}%"
    return "0.0%" if text in ("+0.0%", "-0.0%") else text


def tokens_cell(v: float) -> str:
    return format_tokens(int(v))


def yes_no(v: bool) -> str:
    return "yes" if v else "no"


def distinct(values) -> list[Any]:
    """The values in first-seen order, each once, without empty ones."""
    return list(dict.fromkeys(v for v in values if v not in (None, "", [])))


class Doc:
    """Markdown parts, the tables behind them (written as CSV) and figures (written as PNG)."""

    def __init__(self, drawing: Drawing | None = None) -> None:
        self.parts: list[str] = []
        self.tables: list[tuple[str, Table]] = []  # (csv file name, table)
        # (png file name, its bytes, or a worker's promise of them until ``drawing.finish``)
        self.figures: list[tuple[str, bytes | Future]] = []
        self.files: dict[str, str] = {}  # other markdown files beside the report: name -> text
        self.drawing = drawing or Drawing()  # where the figures are drawn
        self.machine_slug = ""
        self.on_cpu = False  # the machine a part is about has no GPU: name the CPU twins
        self.run_file = False  # a results directory's sweep.md: no CSV files to name, no commands for what is missing

    def part(self, machine: Machine) -> Doc:
        """An empty document for one machine's part of a section, sharing this one's tables,
        figures and settings (so file names stay unique)."""
        part = Doc(self.drawing)
        part.tables, part.figures = self.tables, self.figures
        part.machine_slug, part.on_cpu, part.run_file = machine.slug, machine.on_cpu, self.run_file
        return part

    def add(self, text: str) -> None:
        self.parts.append(text if text.endswith("\n") else text + "\n")

    def heading(self, level: int, text: str) -> None:
        """A heading; ``text`` may hold a label from a row (kept to one line)."""
        self.add(f"\n{'#' * level} {heading_text(text)}\n")

    def table(self, t: Table) -> None:
        name = f"{t.name}-{self.machine_slug}" if self.machine_slug else t.name
        taken = {n for n, _ in self.tables}
        stem, i = name, 2
        while f"{name}.csv" in taken:
            name, i = f"{stem}-{i}", i + 1
        self.tables.append((f"{name}.csv", t))
        self.add(t.markdown())
        if not self.run_file:
            self.add(f"\n<sub>CSV: `csv/{name}.csv`</sub>\n")

    def missing(self, what: str, producer: str) -> None:
        if self.run_file:  # a run measures what it was asked to
            self.add(f"_No data: {what}._\n")
            return
        command = CPU_PRODUCERS.get(producer, PRODUCERS[producer]) if self.on_cpu else PRODUCERS[producer]
        self.add(f"_No data: {what}. `{command}` produces it._\n")

    def figure(self, name: str, fig, alt: str) -> None:
        if fig is None:
            return
        file = f"{name}-{self.machine_slug}.png"
        self.figures.append((file, self.drawing.png(fig)))
        self.add(f"![{alt}]({file})\n")

    def text(self) -> str:
        return "".join(self.parts)


class Machine:
    """The rows of one machine and what several sections derive from them."""

    def __init__(self, name: str, rows: list[Row]) -> None:
        self.name = name
        self.slug = d.slug(name)
        self.rows = rows
        self.trials = d.trials(rows)
        self.summaries = max_seq_summary(rows)
        self.capacities = capacities(rows)  # the max-seq-result rows say which searches finished
        self.speedups = speedup_cases(rows)
        self.gpu_count = max((len(r.env.gpus or []) for r in rows if r.env), default=0)

    @cached_property
    def ran(self) -> list[tuple[Trial | Speedup, dict[str, Any]]]:
        """The trials, then the speedup rows, that ran, each with its workload's identity: what
        every seed claim is matched against, worked out once, not once a claim."""
        return [(r, r.identity()) for r in d.ok(self.trials + d.speedup_rows(self.rows))]

    @cached_property
    def _ran_by_impl(self) -> dict[str, list[tuple[Trial | Speedup, dict[str, Any]]]]:
        by: dict[str, list[tuple[Trial | Speedup, dict[str, Any]]]] = {}
        for ran in self.ran:
            by.setdefault(ran[0].impl, []).append(ran)
        return by

    @cached_property
    def _ran_by_impl_length(self) -> dict[tuple[str, Any], list[tuple[Trial | Speedup, dict[str, Any]]]]:
        by: dict[tuple[str, Any], list[tuple[Trial | Speedup, dict[str, Any]]]] = {}
        for ran in self.ran:
            by.setdefault((ran[0].impl, ran[1].get("seq_len", ran[0].seq_len)), []).append(ran)
        return by

    def ran_of(self, impl: str | list[str] | None, seq_len: Any = None) -> list[tuple[Trial | Speedup, dict[str, Any]]]:
        """``ran`` of the implementation a claim names, or of any of a list of them (None: of
        all), in the order of ``ran``: a claim reads its implementation's rows, not every row;
        of those at ``seq_len`` alone where the claim names one length."""
        if isinstance(impl, str) and type(seq_len) is int:
            return self._ran_by_impl_length.get((impl, seq_len), [])
        if impl is None:
            return self.ran
        if isinstance(impl, str):
            return self._ran_by_impl.get(impl, [])
        return [ran for ran in self.ran if ran[0].impl in impl]

    @property
    def on_cpu(self) -> bool:
        """A CPU machine (its name is the CPU's, `cpu: MODEL`): no GPU, memory is resident."""
        return self.name.startswith("cpu")

    @property
    def several_gpus(self) -> bool:
        """Whether multi-GPU data can come from this machine (a missing table is worth naming)."""
        return self.gpu_count > 1

    def at_max(self, summary: MaxSeqSummary) -> Trial | None:
        """The successful trial at a max-seq series' largest length."""
        return self._ran_at.get((summary.series, summary.max_seq_len))

    @cached_property
    def _ran_at(self) -> dict[tuple[str | None, int], Trial]:
        """The first successful trial of each series at each length (a report asks for the one at
        each search's largest length, in several sections)."""
        first: dict[tuple[str | None, int], Trial] = {}
        for r in d.ok(self.trials):
            first.setdefault((r.series, r.seq_len), r)
        return first
