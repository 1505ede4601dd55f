"""The tables a report and a results directory hold, each from rows alone: a sweep's maximum,
memory and time tables (``sweep``; ``sweep_files`` writes them beside the rows), the training
table (``training``), block-sparse sparsity (``sparsity``), multi-GPU speedup (``speedup``),
quantities derived across GPUs (``multigpu``), sequence-parallel scaling (``scaling``), where
a data-parallel call's time goes (``call_cost``) and the first screen's "does a second GPU
help?" (``second_gpu``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attnbench.report.markdown import Table


def build(name: str, columns: dict[str, Callable | tuple[Callable, Callable]], items: Iterable[Any]) -> Table:
    """The one table builder: ``columns`` maps each header to the raw value of an item (what the
    CSV holds), or to (raw value, its markdown cell), so a column is named once, not once in its
    records and again in its formats."""
    getters = {h: c[0] if isinstance(c, tuple) else c for h, c in columns.items()}
    formats = {h: c[1] for h, c in columns.items() if isinstance(c, tuple)}
    return Table(name, list(columns), [{h: get(x) for h, get in getters.items()} for x in items], formats)
