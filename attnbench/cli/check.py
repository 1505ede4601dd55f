"""`attnbench check`: compare result files with a baseline (reads result files only)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from attnbench.cli.base import app, err_console
from attnbench.errors import AttnbenchError
from attnbench.units import brief


@app.command(order=90)
def check(
    baseline: Annotated[
        list[Path],
        typer.Option(
            "--baseline",
            metavar="PATH",
            help="results directory or trials.jsonl before the change (repeatable: rows together)",
        ),
    ],
    current: Annotated[
        list[Path],
        typer.Option(
            "--current",
            metavar="PATH",
            help="results directory or trials.jsonl after the change (repeatable: rows together)",
        ),
    ],
    time_factor: Annotated[
        Optional[float],
        typer.Option(
            "--time-factor",
            help="a median slower than this factor may be a regression \\[default: 1.10 on a GPU, 1.8 on a CPU]",
            show_default=False,
        ),
    ] = None,
    memory_factor: Annotated[
        float, typer.Option("--memory-factor", help="peak memory above this factor is a regression")
    ] = 1.02,
    only: Annotated[
        Optional[str],
        typer.Option("--only", help="aspects to check: time,memory,capacity,correctness,bytes \\[default: all]"),
    ] = None,
    deterministic: Annotated[
        bool,
        typer.Option(
            "--deterministic",
            help="only correctness, capacity and bytes, which do not depend on the clock or the CPU model (CPU results of different CPU models compare)",
        ),
    ] = False,
    fmt: Annotated[str, typer.Option("--format", help="text | markdown (a pull-request comment) | json")] = "text",
    skip_unreadable: Annotated[
        bool,
        typer.Option("--skip-unreadable", help="skip unreadable lines (reported with file:line) instead of stopping"),
    ] = False,
    allow_missing: Annotated[
        bool,
        typer.Option(
            "--allow-missing",
            help="pass although trials or reference checks of the baseline are missing from the current results",
        ),
    ] = False,
) -> None:
    """Compare results with a baseline: exit 0 when clean, 1 on any regression, 2 on unusable input."""
    from attnbench.check import ASPECTS, DETERMINISTIC_ASPECTS, FORMATS, Thresholds, render, run_check

    if fmt not in FORMATS:
        raise AttnbenchError(f"--format {brief(fmt)}: choose text, markdown or json")
    default = DETERMINISTIC_ASPECTS if deterministic else ASPECTS
    aspects = tuple(a.strip() for a in only.split(",") if a.strip()) if only else default
    thresholds = Thresholds(time_factor, memory_factor, aspects, deterministic, allow_missing=allow_missing)
    report = run_check(baseline, current, thresholds, skip_unreadable=skip_unreadable)
    for w in report.warnings:
        err_console.print(f"warning: {escape(w)}")
    sys.stdout.write(render(report, fmt))
    sys.stdout.flush()
    raise typer.Exit(report.exit_code)
