"""`attnbench report` and `attnbench predict`: read result files only, never run a benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from attnbench.cli.base import app, console, err_console


@app.command(order=70)
def report(
    results: Annotated[Path, typer.Argument(help="results directory (searched for trials.jsonl) or one trials.jsonl")],
    out: Annotated[
        Optional[Path],
        typer.Option("--out", help="where report.md, csv/ and the plots go \\[default: RESULTS/report]"),
    ] = None,
) -> None:
    """Write report.md (the five seed reports' tables, capacity prediction, plots) and CSV tables from result files."""
    from attnbench.report.build import write_report

    written = write_report(results, out)
    for line in written.problems:
        err_console.print(f"warning: {escape(line)}")
    console.print(
        f"{len(written.files) - 1} tables and plots, {len(written.machines)} machine(s): "
        f"{escape(', '.join(written.machines))}"
    )
    console.print(f"report: {written.report}")


@app.command(order=80)
def predict(
    impl: Annotated[str, typer.Option("--impl", help="implementation whose measured series to extrapolate")],
    gpu_memory: Annotated[str, typer.Option("--gpu-memory", help="device memory, e.g. 80GiB or 24GB")],
    source: Annotated[Path, typer.Option("--from", help="results directory or trials.jsonl")],
    label: Annotated[Optional[str], typer.Option("--label", help="only the series with this label")] = None,
) -> None:
    """Predict the longest sequence IMPL runs on a GPU of the given memory, from its measured peaks."""
    from attnbench.report.fit import predict_lines

    for line in predict_lines(impl, gpu_memory, source, label):
        (err_console if line.startswith("warning: ") else console).print(escape(line))
