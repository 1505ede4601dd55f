"""One side of a check: its typed result rows (``results.load_rows``) keyed for matching:
trials by identity and device model, reference checks, max-seq searches."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.analysis import search_outcome
from attnbench.check.identity import capacity_identity, device_model
from attnbench.errors import AttnbenchError
from attnbench.results import load_rows
from attnbench.results.read import distinct_paths, files_of, paths_text
from attnbench.results.schema import MaxSeqResult, Trial, Verify


@dataclass
class Search:
    """How a max-seq search ended, derived from its trials (an interrupted one has no
    ``max-seq-result`` row and is not complete)."""

    row: Trial  # one of its trials, to name it
    max_seq_len: int  # the largest length that ran (0: none)
    first_failure: int | None  # the shortest failed length above it
    stopped_by: str  # what stopped it, in words (STOPPED_BY)
    complete: bool


@dataclass
class Side:
    """One side's rows, keyed for matching."""

    label: str
    path: str
    rows: int
    models: list[str]
    trials: dict[tuple[str, str], list[Trial]]
    verify: list[Verify]
    capacity: dict[tuple[str, str], Search]


def load_side(
    paths: Path | Sequence[Path], label: str, any_cpu: bool = False, skip_unreadable: bool = False
) -> tuple[Side, list[str]]:
    """Read one side's results directories or trials.jsonl files, their rows together;
    anything unusable is one AttnbenchError."""
    sources = distinct_paths(paths)
    path = paths_text(sources)
    files = files_of(
        sources, lambda p: f"{label} {p} holds no trials.jsonl: give a results directory or a trials.jsonl file"
    )
    rows, problems = load_rows(files)
    # the loader skips what is not JSON, not a valid or possible row, or a trial read before
    problems = [p.replace(" line skipped (", " line (").replace(" row skipped (", " row (") for p in problems]
    if problems and not skip_unreadable:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise AttnbenchError(
            f"{label} {problems[0]}{more}: repair or delete the line, or pass --skip-unreadable to compare the rest"
        )
    warnings = [f"{label} {p}: skipped" for p in problems]
    trials = [r for r in rows if isinstance(r, Trial)]
    verify = [r for r in rows if isinstance(r, Verify)]
    results = [r for r in rows if isinstance(r, MaxSeqResult)]
    if not (trials or verify or results):
        raise AttnbenchError(f"{label} {path} holds no result rows (trials or reference checks)")
    keyed: dict[tuple[str, str], list[Trial]] = defaultdict(list)
    for r in trials:
        keyed[(r.identity_key(), device_model(r, any_cpu))].append(r)
    side = Side(
        label,
        path,
        len(trials) + len(verify) + len(results),
        sorted({device_model(r, any_cpu) for r in trials + results}),
        dict(keyed),
        verify,
        searches(trials, results, any_cpu),
    )
    return side, warnings


def searches(trials: list[Trial], results: list[MaxSeqResult], any_cpu: bool = False) -> dict[tuple[str, str], Search]:
    """Per max-seq search (workload and limits) and device model: how it ended
    (``analysis.search_outcome``, the rule the report shares)."""
    groups: dict[tuple[str, str], list[Trial]] = defaultdict(list)
    for r in trials:
        if r.kind == "max-seq":
            groups[(capacity_identity(r), device_model(r, any_cpu))].append(r)
    out = {}
    for (ident, model), group in groups.items():
        series = {r.series for r in group}  # one search, whatever series keys its rows were written with
        done = [r for r in results if r.series in series and device_model(r, any_cpu) == model]
        found = search_outcome(group, done[-1] if done else None)
        out[(ident, model)] = Search(group[0], found.max_seq_len, found.first_failure, found.stopped_by, found.complete)
    return out


def contents(side: Side) -> str:
    names = sorted({json.loads(k[0])["impl"] for k in side.trials} | {r.impl for r in side.verify})
    return f"{side.rows} rows of {', '.join(names) or 'nothing'} on {', '.join(side.models) or '?'}"
