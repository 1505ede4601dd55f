"""`attnbench report`: reads result files only, never runs a benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from attnbench.cli.base import app, console, err_console


@app.command(order=70)
def report(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="results directories (searched for trials.jsonl) or trials.jsonl files, one or several",
            metavar="RESULTS",
        ),
    ],
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            help="where report.md, csv/ and the plots go \\[default: RESULTS/report; several RESULTS: required]",
        ),
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
