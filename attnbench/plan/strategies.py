"""How a run spreads work over GPUs, declared without torch: each strategy's name, how tables
name it, and what it does, in the order tables list them. The command line's help lists them
and the report names and orders rows by them; each one's code is a module of
``attnbench/trials/strategies/`` (``ring``, the sequence-parallel trials', is ``sequence``).

A new strategy is one entry here and one module there: its place in this list is its place in
every table, and a ``batch_column`` puts it in the first screen's table of a second GPU for a batch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchColumn:
    """A strategy's columns in the first screen's table of a second GPU for a batch."""

    place: int  # left to right among the strategies' columns
    heading: str  # its fixed cost per call's column
    speedup: bool = True  # its speedup at the largest case follows (a probe that explains another's cost: none)


@dataclass(frozen=True)
class Declared:
    name: str
    label: str  # how tables and headings name it
    summary: str  # what it does, in one line
    speedup: bool = True  # `--strategy` takes it (single always runs, as the baseline)
    batch_column: BatchColumn | None = None  # None: not in the first screen's batch table


DECLARED = (
    Declared("single", "Single GPU", "the implementation on GPU 0 (the baseline every speedup divides)", False),
    Declared(
        "dp",
        "DataParallel",
        "torch.nn.DataParallel over the GPUs in one process: the batch is scattered from GPU 0, outputs gathered back",
        batch_column=BatchColumn(0, "DataParallel: fixed cost per call"),
    ),
    Declared(
        "mp",
        "Multi-process data parallel (DDP)",
        "multi-process data parallel: torchrun, one process per GPU, the batch split across ranks "
        "(multihead fwd_bwd: DistributedDataParallel)",
        batch_column=BatchColumn(2, "Multi-process: fixed cost per call"),
    ),
    Declared(
        "ring",
        "Ring (sequence parallel)",
        "one sequence over the GPUs: each rank holds its shard of the tokens (the sequence-parallel implementations)",
        False,
    ),
    Declared(
        "thread",
        "New thread alone",
        "the single-GPU call made from a new thread each time, as DataParallel makes each replica's: "
        "what a new thread costs the kernel library",
        batch_column=BatchColumn(1, "New thread alone", speedup=False),  # beside DataParallel: it explains its cost
    ),
)
BY_NAME = {d.name: d for d in DECLARED}


def label(name: str) -> str:
    """How a table names strategy ``name`` (an undeclared one by its name)."""
    found = BY_NAME.get(name)
    return found.label if found else name


def order(name: str) -> int:
    """Its place in a table's list (an undeclared one last)."""
    return next((i for i, d in enumerate(DECLARED) if d.name == name), len(DECLARED))


def speedup_names() -> tuple[str, ...]:
    """What ``--strategy`` takes."""
    return tuple(d.name for d in DECLARED if d.speedup)
