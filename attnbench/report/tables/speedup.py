"""A results directory's speedup rows as CSV (reads rows only): ``speedup.csv``, a row per
trial with its single-GPU baseline, speedup and efficiency (``multigpu.speedup_cases``), and
``speedup_memory.csv``, what each GPU held. The tables in markdown are the report's section
(``report.sections.data_parallel``)."""

from __future__ import annotations

import pandas as pd

from attnbench.report.intervals import DATA_PARALLEL_TIMER
from attnbench.report.tables.multigpu import latest_speedup_rows, speedup_cases
from attnbench.results.schema import Row

CSV_COLUMNS = (
    "run machine impl config module grad_compression strategy world_size seq_len batch heads head_dim "
    "dtype device mode causal status time_ms time_iqr_ms time_min_ms time_max_ms samples single_time_ms "
    "speedup speedup_ci_low speedup_ci_high timer efficiency output_match output_rel_err grad_rel_err "
    "backend note message"
).split()
MEMORY_COLUMNS = (
    "run machine impl strategy world_size seq_len batch gpu nvml_index nvml_used_before nvml_used_peak "
    "max_memory_allocated max_memory_reserved"
).split()


def speedup_csv(rows: list[Row]) -> str:
    flat = []
    cases = {id(c.row): c for c in speedup_cases(rows)}
    for r in latest_speedup_rows(rows):
        c = cases.get(id(r))  # none for a single row
        computed = {
            "machine": r.env.machine if r.env else None,
            "samples": len(r.times_ms or []),
            "single_time_ms": c.single.time_ms if c and c.single else None,
            "speedup": c.speedup if c else None,
            "speedup_ci_low": getattr(c and c.speedup_ci, "low", None),
            "speedup_ci_high": getattr(c and c.speedup_ci, "high", None),
            "timer": c.timer if c else DATA_PARALLEL_TIMER,
            "efficiency": c.efficiency if c else None,
        }
        flat.append({c: computed[c] if c in computed else getattr(r, c) for c in CSV_COLUMNS})
    return pd.DataFrame(flat, columns=CSV_COLUMNS).to_csv(index=False)


def memory_csv(rows: list[Row]) -> str:
    flat = []
    for r in latest_speedup_rows(rows):
        for g in r.gpus or []:
            flat.append(
                {
                    "run": r.run,
                    "machine": r.env.machine if r.env else None,
                    "impl": r.impl,
                    "strategy": r.strategy,
                    "world_size": r.world_size,
                    "seq_len": r.seq_len,
                    "batch": r.batch,
                    "gpu": g.index,
                    **{k: getattr(g, k) for k in MEMORY_COLUMNS[8:]},
                }
            )
    return pd.DataFrame(flat, columns=MEMORY_COLUMNS).to_csv(index=False)
