"""Multi-GPU speedup tables from ``kind: speedup`` rows (reads rows only).

Report 001's layout, one table per strategy:

    Sequence Length | Batch Size | Single GPU Time | Multi-GPU Time | Speedup | Notes

and report 000's memory distribution (what each GPU held), per case and strategy. Speedup
is the single row's median time over the strategy row's, matched within the same run and
workload; scaling efficiency is speedup / GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.measure.stats import Interval
from attnbench.report.data import config_text, speedup_rows
from attnbench.report.intervals import (
    DATA_PARALLEL_TIMER,
    divided,
    ms_cell,
    ratio_cell,
    speedup_interval,
    time_interval,
)
from attnbench.report.markdown import record_table, result_text
from attnbench.report.tables.multigpu import baseline, single_runs
from attnbench.results import load_rows, write_text_atomic
from attnbench.results.schema import GpuMemory, Row, Speedup
from attnbench.units import format_bytes

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


def _ident(row: Speedup, *but: str) -> str:
    """The question a row answers, whatever GPUs answered it: the workload's identity without
    how it was spread, with its run and the model around attention; ``but`` leaves more out."""
    import json

    ident = {**row.identity(), "run": row.run, "module": row.module}
    for name in ("strategy", "world_size", *but):
        ident.pop(name, None)
    return json.dumps(ident, sort_keys=True, default=str)


@dataclass(frozen=True)
class SpeedupRecord:
    """A speedup row (a single one too) against the single row of its run and workload: None
    where either side has no time."""

    row: Speedup
    single: Speedup | None
    speedup_ci: Interval | None
    timer: str

    @property
    def speedup(self) -> float | None:
        return self.speedup_ci.value if self.speedup_ci else None

    @property
    def efficiency(self) -> float | None:
        return self.speedup / self.row.world_size if self.speedup and self.row.world_size else None


def speedup_records(rows: list[Row]) -> list[SpeedupRecord]:
    """Speedup rows, the last of each trial key kept, each with its single-GPU baseline (the
    report's rule, ``multigpu.baseline``)."""
    latest: dict[str, Speedup] = {}
    for r in speedup_rows(rows):
        latest[r.key or str(len(latest))] = r
    found = list(latest.values())
    singles = single_runs(found)
    out = []
    for r in found:
        base = baseline(r, singles)
        ran = base is not None and base.status == "ok" and r.status == "ok"
        # GPU time where both sides have it, else eager; the interval resamples both sides
        ci, timer = speedup_interval(base, r, DATA_PARALLEL_TIMER) if ran else (None, DATA_PARALLEL_TIMER)
        out.append(SpeedupRecord(r, base if ran else None, ci, timer))
    return out


def groups(records: list[SpeedupRecord]) -> dict[str, list[SpeedupRecord]]:
    """Records of one run and one workload family (everything but the case), in run order."""
    out: dict[str, list[SpeedupRecord]] = {}
    for rec in records:
        out.setdefault(_ident(rec.row, "batch", "seq_len"), []).append(rec)
    return out


def _strategy_notes(rec: SpeedupRecord) -> str:
    r, notes = rec.row, []
    if r.status == "ok" and rec.efficiency:
        eff = ratio_cell(divided(rec.speedup_ci, r.world_size), anomaly_above_one=True)
        notes.append(f"efficiency {eff} on {_units(r, r.world_size)}; {rec.timer} time")
    elif r.status != "ok":
        notes.append(f"{result_text(r.status)}: {r.message or ''}".strip())
    if r.dispatch_share is not None:
        notes.append(f"dispatch {r.dispatch_share:.0%} of eager time{' (host-bound)' if r.host_bound else ''}")
    if r.note and r.status != "skipped":
        notes.append(r.note)
    return "; ".join(notes)


STRATEGY_COLUMNS = {
    "Sequence Length": lambda rec: f"{rec.row.seq_len:,} tokens",
    "Batch Size": lambda rec: rec.row.batch,
    "Single GPU Time": lambda rec: ms_cell(time_interval(rec.single, rec.timer)),
    "Multi-GPU Time": lambda rec: (
        ms_cell(time_interval(rec.row, rec.timer)) if rec.row.status == "ok" else result_text(rec.row.status)
    ),
    "Speedup": lambda rec: ratio_cell(rec.speedup_ci),
    "Notes": _strategy_notes,
}


def strategy_table(records: list[SpeedupRecord], strategy: str) -> str:
    """Report 001's table for one strategy (records from ``speedup_records`` of one group)."""
    return record_table(STRATEGY_COLUMNS, [rec for rec in records if rec.row.strategy == strategy])


def _units(row: Speedup, count) -> str:
    """GPUs, or on the CPU the processes that stand in for them."""
    plural = "" if str(count) == "1" else ("s" if row.device == "cuda" else "es")
    return f"{count} GPU{plural}" if row.device == "cuda" else f"{count} CPU process{plural}"


def _gpu_cell(g: GpuMemory) -> str:
    alloc, nvml = g.max_memory_allocated, g.nvml_used_peak
    bits = [f"{format_bytes(alloc)} allocated" if alloc is not None else "not used by this process"]
    if nvml is not None:
        bits.append(f"{format_bytes(nvml)} NVML")
    return ", ".join(bits)


def memory_table(rows: list[Speedup]) -> str:
    """Report 000's memory distribution: per case and strategy, what each GPU held."""
    width = max((len(r.gpus or []) for r in rows), default=0)
    if width == 0:
        return ""
    columns = {
        "Sequence Length": lambda r: f"{r.seq_len:,} tokens",
        "Batch Size": lambda r: r.batch,
        "Strategy": lambda r: r.strategy,
        "Result": lambda r: result_text(r.status),
    }
    for i in range(width):
        columns[f"GPU {i} Memory"] = lambda r, i=i: _gpu_cell(r.gpus[i]) if i < len(r.gpus) else "-"
    return record_table(columns, [r for r in rows if r.gpus])


def _title(r: Speedup) -> str:
    config = config_text(r.config)
    module = "multi-head module (q/k/v/out projections)" if r.module == "multihead" else "attention"
    return (
        f"{r.impl}{f' ({config})' if config else ''}: {module}, {r.dtype}, H={r.heads}, D={r.head_dim}, "
        f"{r.mode}{', causal' if r.causal else ''}, {r.device}"
    )


def _environment(r: Speedup) -> str:
    env = r.env
    gpus = (env.gpus if env else None) or []
    links = (env.gpu_links if env else None) or []
    bits = [f"machine {env.machine if env else '?'}"]
    if gpus:
        bits.append("NVLinks active per GPU: " + ", ".join(str(g.get("nvlinks_active")) for g in gpus))
    for link in links:
        bits.append(
            f"GPU {link['gpus'][0]}-{link['gpus'][1]}: {link.get('topology')}, P2P over NVLink {link.get('p2p_nvlink')}"
        )
    for key in ("driver", "cuda", "nccl", "torch"):
        if env is not None and getattr(env, key):
            bits.append(f"{key} {getattr(env, key)}")
    return "; ".join(bits)


def speedup_markdown(rows: list[Row]) -> str:
    parts = []
    for members in groups(speedup_records(rows)).values():
        head = members[0].row
        parts.append(f"\n## {_title(head)}\n\nRun `{head.run}`: {_environment(head)}\n")
        for strategy in dict.fromkeys(m.row.strategy for m in members if m.row.strategy != "single"):
            mine = [m.row for m in members if m.row.strategy == strategy]
            worlds = sorted({r.world_size for r in mine})
            compression = {r.grad_compression for r in mine} - {None}
            extra = f", gradient compression {', '.join(sorted(compression))}" if compression else ""
            parts += [
                f"\n### {strategy} on {_units(head, ', '.join(map(str, worlds)))}{extra}\n\n",
                strategy_table(members, strategy),
            ]
        mem = memory_table([m.row for m in members])
        if mem:
            parts += ["\n### Memory per GPU\n\n", mem]
    if parts:
        parts.append(
            "\nTimes: median over repeated calls after warm-up (spread in speedup.csv); multi-process (mp) iterations "
            "start together after a barrier and take the slowest rank's time. Speedup = single-GPU time / multi-GPU "
            "time; efficiency = speedup / GPUs. Memory: `torch.cuda.max_memory_allocated` of the process that used the "
            "GPU, and NVML device memory used at peak (which also counts CUDA contexts, NCCL buffers and other "
            "processes). GB = 10^9 bytes, MB = 10^6 bytes.\n"
        )
    return "".join(parts)


def speedup_csv(rows: list[Row]) -> str:
    flat = []
    for rec in speedup_records(rows):
        r = rec.row
        computed = {
            "machine": r.env.machine if r.env else None,
            "samples": len(r.times_ms or []),
            "single_time_ms": rec.single.time_ms if rec.single else None,
            "speedup": rec.speedup,
            "speedup_ci_low": getattr(rec.speedup_ci, "low", None),
            "speedup_ci_high": getattr(rec.speedup_ci, "high", None),
            "timer": rec.timer,
            "efficiency": rec.efficiency,
        }
        flat.append({c: computed[c] if c in computed else getattr(r, c) for c in CSV_COLUMNS})
    return pd.DataFrame(flat, columns=CSV_COLUMNS).to_csv(index=False)


def memory_csv(rows: list[Row]) -> str:
    flat = []
    for rec in speedup_records(rows):
        r = rec.row
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


def write_speedup_tables(out_dir: Path) -> list[Path]:
    """``speedup.md``, ``speedup.csv`` and ``speedup_memory.csv`` next to ``trials.jsonl``."""
    out_dir = Path(out_dir)
    rows, _ = load_rows(out_dir)
    if not speedup_rows(rows):
        return []
    files = {
        "speedup.md": speedup_markdown(rows),
        "speedup.csv": speedup_csv(rows),
        "speedup_memory.csv": memory_csv(rows),
    }
    for name, text in files.items():
        write_text_atomic(out_dir / name, text)
    return [out_dir / name for name in files]
