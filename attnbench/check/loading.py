"""One side of a check: its result rows read and keyed for matching (trials by identity and
device model, reference checks, max-seq searches)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.check.identity import capacity_identity, device_model, trial_identity
from attnbench.errors import AttnbenchError
from attnbench.report.sweep_tables import TRIAL_KINDS, max_seq_summary
from attnbench.results import read_rows, result_files
from attnbench.schema import row_from_json


@dataclass
class Side:
    """One side's rows, keyed for matching."""

    label: str
    path: str
    rows: int
    models: list[str]
    trials: dict[tuple[str, str], list[dict[str, Any]]]
    verify: list[dict[str, Any]]
    capacity: dict[tuple[str, str], dict[str, Any]]


def load_side(path: Path, label: str, any_cpu: bool = False, skip_unreadable: bool = False) -> tuple[Side, list[str]]:
    """Read a results directory or trials.jsonl; anything unusable is one AttnbenchError."""
    path = Path(path)
    files = result_files(path)
    if not files:
        raise AttnbenchError(f"{label} {path} holds no trials.jsonl: give a results directory or a trials.jsonl file")
    rows, problems = read_rows(files)
    # read_rows skips what is not JSON or not a valid row (a field's type, a missing key)
    problems = [p.replace(" line skipped (", " line (").replace(" row skipped (", " row (") for p in problems]
    if problems and not skip_unreadable:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise AttnbenchError(
            f"{label} {problems[0]}{more}: repair or delete the line, or pass --skip-unreadable to compare the rest"
        )
    warnings = [f"{label} {p}: skipped" for p in problems]
    rows = [r for r in rows if r.get("kind") in TRIAL_KINDS + ("verify", "max-seq-result")]
    if not rows:
        raise AttnbenchError(f"{label} {path} holds no result rows (trials or reference checks)")
    trials: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] in TRIAL_KINDS:
            trials[(trial_identity(r), device_model(r, any_cpu))].append(r)
    side = Side(
        label,
        str(path),
        len(rows),
        sorted({device_model(r, any_cpu) for r in rows if r["kind"] != "verify"}),
        dict(trials),
        [r for r in rows if r["kind"] == "verify"],
        capacities(rows, any_cpu),
    )
    return side, warnings


def capacities(rows: list[dict[str, Any]], any_cpu: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    """Per max-seq series and device model: the largest length that ran (from the trials,
    as the sweep tables derive it) and whether the search finished."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "max-seq" and "series" in r:
            groups[(capacity_identity(r), device_model(r, any_cpu))].append(r)
    finished = [r for r in rows if r["kind"] == "max-seq-result"]
    out = {}
    for (ident, model), group in groups.items():
        series = {r["series"] for r in group}
        done = [r for r in finished if r.get("series") in series and device_model(r, any_cpu) == model]
        # one summary per group, whatever series keys its rows were written with
        summary = max_seq_summary([row_from_json({**r, "series": ident}) for r in group + done])[0]
        out[(ident, model)] = {**summary, "row": group[0]}
    return out


def contents(side: Side) -> str:
    names = sorted({json.loads(k[0])["impl"] for k in side.trials} | {r["impl"] for r in side.verify})
    return f"{side.rows} rows of {', '.join(names) or 'nothing'} on {', '.join(side.models) or '?'}"
