"""Where a run's trial seconds go, and how many trials each search took, as markdown tables
from the runs' rows alone.

    python scripts/trial_time.py RUN_DIR [RUN_DIR ...]

The first table has one line per run (and per device): the trials, their wall time in all,
and the seconds of each phase summed over the trials, from each row's ``phase_s`` (the
trial's process timed by its parent: ``start`` is the wait for python and the imports, zero
where a spare worker was ready). Rows written before ``phase_s`` existed give what they
recorded (first call, warm-up, timed calls); the rest of their time is one column, ``start,
setup, inputs, exit``. The second has one line per max-seq search: its trials (every row,
retries and the confirmation included), their wall time, its answer and the peak (bytes, as
the row's ``peak_counter`` counts them) of the last trial at the answer.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

PHASES = (
    "start",
    "setup",
    "device",
    "inputs",
    "compile",
    "first-call",
    "warm-call",
    "warm-up",
    "timing",
    "gpu-timing",
    "accounting",
    "exit",
)
UNSPLIT = "start, setup, inputs, exit"
TRIAL_KINDS = ("max-seq", "points")


def phases_of(row: dict) -> dict[str, float]:
    """Seconds per phase of one trial; ``parent`` is what its duration holds beyond them."""
    if row.get("phase_s"):
        out = dict(row["phase_s"])
    else:  # recorded before phases were timed: what the row itself says
        times = sum(row.get("times_ms") or []) / 1e3
        first = (row.get("first_call_ms") or 0) / 1e3
        warm = row.get("warmup_s") or 0.0
        out = {"first-call": first, "warm-up": warm, "timing": times}
        out[UNSPLIT] = max(0.0, (row.get("duration_s") or 0.0) - first - warm - times)
    out["parent"] = max(0.0, (row.get("duration_s") or 0.0) - sum(out.values()))
    return out


def table(run_dirs: list[Path]) -> str:
    lines: list[tuple[str, int, float, dict[str, float]]] = []
    columns: list[str] = []
    for run in run_dirs:
        rows = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines() if line.strip()]
        by_device: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r.get("kind") in TRIAL_KINDS:
                by_device[r.get("device", "?")].append(r)
        for device, trials in sorted(by_device.items()):
            total: dict[str, float] = defaultdict(float)
            for r in trials:
                for phase, seconds in phases_of(r).items():
                    total[phase] += seconds
            columns += [p for p in total if p not in columns]
            wall = sum(r.get("duration_s") or 0.0 for r in trials)
            lines.append((f"{run.name} ({device})", len(trials), wall, total))
    order = [p for p in (*PHASES, UNSPLIT, "parent") if p in columns]
    head = "| run | trials | trial wall s | " + " | ".join(order) + " |"
    out = [head, "|" + "---|" * (3 + len(order))]
    for name, n, wall, total in lines:
        cells = [f"{total.get(p, 0.0):.1f}" for p in order]
        out.append(f"| {name} | {n} | {wall:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def searches(run_dirs: list[Path]) -> str:
    out = [
        "| run | search | trials | trial wall s | largest length | stopped by | at | confirmed | peak there |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in run_dirs:
        rows = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines() if line.strip()]
        for result in (r for r in rows if r.get("kind") == "max-seq-result"):
            trials = [r for r in rows if r.get("kind") == "max-seq" and r.get("series") == result["series"]]
            wall = sum(r.get("duration_s") or 0.0 for r in trials)
            confirmed = {True: "yes", False: "no"}.get(result.get("confirmed"), "-")
            there = [r["peak_bytes"] for r in trials if r["seq_len"] == result["seq_len"] and r.get("peak_bytes")]
            peak = f"{there[-1]:,}" if there else "-"
            out.append(
                f"| {run.name} | {result['label']} | {len(trials)} | {wall:.1f} | {result['seq_len']:,} | "
                f"{result.get('stopped_by')} | {result.get('first_failure') or 0:,} | {confirmed} | {peak} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/trial_time.py RUN_DIR [RUN_DIR ...]")
    runs = [Path(a) for a in sys.argv[1:]]
    print(table(runs) + "\n\n" + searches(runs))
