"""Multi-GPU quantities derived from rows of one machine: speedup over a single GPU,
memory per GPU, ring (sequence-parallel) runs against their single-GPU counterpart, and
measured max-seq per GPU count.

Rows read here: ``Speedup`` rows (``strategy`` single, dp, mp; ``world_size``, ``module``,
the workload, times, ``output_match``, ``note``, per-GPU memory) and sequence-parallel
``Trial`` rows (``world_size > 1``, ``strategy: ring``, the slowest rank's time, per-GPU
memory, ``ranks`` with ``compute_ms`` and ``comm_wait_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnbench.measure.stats import Interval
from attnbench.report.data import (
    config_id,
    config_text,
    configs_agree,
    gpus,
    ok,
    settings_key,
    speedup_rows,
    trials,
    world_size,
)
from attnbench.report.intervals import DATA_PARALLEL_TIMER, divided, speedup_interval, time_interval
from attnbench.report.tables.sweep import MaxSeqSummary, max_seq_summary
from attnbench.results.schema import Row, Speedup, Trial, Workload

STRATEGY_NAMES = {
    "single": "Single GPU",
    "dp": "DataParallel",
    "mp": "Multi-process data parallel (DDP)",
    "ring": "Ring (sequence parallel)",
}


def _case_key(r: Speedup) -> tuple:
    return (r.impl, config_id(r.config), r.seq_len, r.module or "attention", settings_key(r))


def single_runs(found: list[Speedup]) -> dict[tuple, list[Speedup]]:
    """The single-GPU rows by case: what ``baseline`` picks from."""
    singles: dict[tuple, list[Speedup]] = {}
    for r in found:
        if r.strategy == "single":
            singles.setdefault(_case_key(r), []).append(r)
    return singles


def baseline(row: Speedup, singles: dict[tuple, list[Speedup]]) -> Speedup | None:
    """A speedup row's single-GPU baseline, by the one rule (``_pick``) the report's and a
    results directory's tables share."""
    return _pick(singles.get(_case_key(row), []), row)


def _pick(candidates: list[Any], row: Row) -> Any:
    """The baseline for ``row``: one from the same run if there is one, else the latest; never an average."""
    if not candidates:
        return None
    same_run = [c for c in candidates if _run_of(c) == row.run]
    return (same_run or candidates)[-1]


def _run_of(c: Any) -> str | None:
    return c.run if isinstance(c, Row) else c.head.run


@dataclass(frozen=True)
class SpeedupCase:
    """A multi-GPU speedup row against its single-GPU baseline (None where not measured)."""

    row: Speedup
    single: Speedup | None
    strategy: str
    world_size: int
    impl: str
    seq_len: int
    batch: int | None
    timer: str
    single_ms: Interval | None
    multi_ms: Interval | None
    speedup: float | None
    speedup_ci: Interval | None
    efficiency: float | None
    efficiency_ci: Interval | None
    output_match: bool | None
    note: str


def speedup_cases(rows: list[Row]) -> list[SpeedupCase]:
    """Each multi-GPU speedup row with its single-GPU baseline (same case, same machine)."""
    found = speedup_rows(rows)
    singles = single_runs(found)
    cases = []
    for r in found:
        if r.strategy == "single":
            continue
        base = baseline(r, singles)
        ran = base is not None and base.status == "ok" and r.status == "ok"
        # GPU time where both sides have it, else eager time; the interval from both sample sets
        speedup_ci, timer = speedup_interval(base, r, DATA_PARALLEL_TIMER) if ran else (None, DATA_PARALLEL_TIMER)
        efficiency_ci = divided(speedup_ci, world_size(r))
        cases.append(
            SpeedupCase(
                row=r,
                single=base,
                strategy=r.strategy,
                world_size=world_size(r),
                impl=r.impl,
                seq_len=r.seq_len,
                batch=r.batch,
                timer=timer,
                single_ms=time_interval(base, timer),
                multi_ms=time_interval(r, timer),
                speedup=speedup_ci.value if speedup_ci else None,
                speedup_ci=speedup_ci,
                efficiency=efficiency_ci.value if efficiency_ci else None,
                efficiency_ci=efficiency_ci,
                output_match=r.output_match,
                note=r.note or "",
            )
        )
    return cases


def group_label(r: Speedup) -> str:
    cfg = config_text(r.config)
    return f"{r.impl}{f'({cfg})' if cfg else ''}, {r.module or 'attention'}, {r.mode}, {r.dtype}, {world_size(r)} GPUs"


def speedup_groups(cases: list[SpeedupCase]) -> dict[tuple, list[SpeedupCase]]:
    """Cases by strategy, then by everything but the (length, batch) case."""
    groups: dict[tuple, list[SpeedupCase]] = {}
    for c in cases:
        groups.setdefault((c.strategy, group_label(c.row)), []).append(c)
    order = list(STRATEGY_NAMES)
    return {
        k: sorted(v, key=lambda c: (c.seq_len, c.batch or 0))
        for k, v in sorted(
            groups.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else 99, kv[0][1])
        )
    }


# --- ring runs against one GPU --------------------------------------------------------------


def counterparts(impl: str) -> tuple[str, ...]:
    """Single-device implementations that compute what ``impl`` computes, preferred first."""
    from attnbench import impls

    counterpart = impls.counterpart(impl)
    return (impl, counterpart) if counterpart else (impl,)


#: which single-GPU row a multi-GPU ring row is compared with
EQUAL_WORK = (
    "equal work"  # the single-device counterpart over the whole sequence (sdpa for ring, dilated for ring-dilated)
)
SAME_SPLIT = "same split"  # the same implementation on one rank


def _same_workload(row: Workload, impl: str, candidates: list[Trial]) -> Trial | None:
    found = [
        c
        for c in candidates
        if c.impl == impl
        and c.seq_len == row.seq_len
        and settings_key(c) == settings_key(row)
        and configs_agree(c.config, row.config)
    ]
    return _pick(found, row)


def baselines(row: Workload, candidates: list[Trial]) -> dict[str, Trial | None]:
    """The single-GPU rows of the same workload and length: ``equal work`` (the best
    single-device implementation of the same key sets over the whole sequence) and ``same
    split`` (the same implementation on one rank), each None where not measured."""
    from attnbench import impls

    counterpart = impls.counterpart(row.impl)
    return {
        EQUAL_WORK: _same_workload(row, counterpart, candidates) if counterpart else None,
        SAME_SPLIT: _same_workload(row, row.impl, candidates),
    }


def preferred(found: dict[str, Trial | None]) -> tuple[Trial | None, str | None]:
    """Of ``baselines``' rows, the one a ring row is compared with, and which baseline it is:
    the equal-work one where measured, else the same implementation on one rank."""
    kind = EQUAL_WORK if found[EQUAL_WORK] else SAME_SPLIT if found[SAME_SPLIT] else None
    return (found[kind] if kind else None), kind


@dataclass(frozen=True)
class RingPair:
    """A multi-GPU ring measurement, its single-GPU baseline and which baseline that is
    (``EQUAL_WORK`` or ``SAME_SPLIT``; None where not measured)."""

    row: Workload
    single: Workload | None
    baseline: str | None


@dataclass(frozen=True)
class RankTime:
    """One rank of a ring measurement: its compute time and its wait on communication."""

    row: Workload
    rank: int
    compute_ms: float | None
    comm_wait_ms: float | None


def ring_pairs(rows: list[Row]) -> list[RingPair]:
    """Successful multi-GPU ring measurements, each with its single-GPU baseline."""
    pairs = []
    singles = [r for r in ok(trials(rows)) if world_size(r) == 1]
    for r in ok(trials(rows)):
        if world_size(r) > 1:
            pairs.append(RingPair(r, *preferred(baselines(r, singles))))
    for c in speedup_cases(rows):
        if c.strategy == "ring" and c.row.status == "ok":
            pairs.append(RingPair(c.row, c.single, SAME_SPLIT if c.single else None))
    return sorted(pairs, key=lambda p: (p.row.impl, p.row.seq_len, world_size(p.row)))


def rank_breakdown(rows: list[Row]) -> list[RankTime]:
    """Per rank: compute time and time spent waiting on communication, where rows record it."""
    return [
        RankTime(p.row, rank.get("rank", i), rank.get("compute_ms"), rank.get("comm_wait_ms"))
        for p in ring_pairs(rows)
        for i, rank in enumerate(p.row.ranks or [])
    ]


# --- max-seq per GPU count ------------------------------------------------------------------


@dataclass
class ScalingFamily:
    """Max-seq searches of one configuration over several GPUs, by GPU count, and the
    single-GPU search they are compared with (None where not measured)."""

    head: Trial
    multi: list[MaxSeqSummary] = field(default_factory=list)
    single: MaxSeqSummary | None = None


def scaling_families(rows: list[Row]) -> list[ScalingFamily]:
    """Each multi-GPU max-seq series with the single-GPU max-seq series it is compared with."""
    summaries = max_seq_summary(rows)
    singles = [s for s in summaries if s.world_size == 1]
    families: dict[tuple, ScalingFamily] = {}
    for s in summaries:
        if s.world_size == 1:
            continue
        head = s.head
        key = (head.impl, config_id(head.config), settings_key(head))
        fam = families.setdefault(key, ScalingFamily(head))
        fam.multi.append(s)
        if fam.single is None:
            for impl in counterparts(head.impl):
                found = [
                    x
                    for x in singles
                    if x.head.impl == impl
                    and settings_key(x.head) == settings_key(head)
                    and configs_agree(x.head.config, head.config)
                ]
                if found:
                    fam.single = _pick(found, head)
                    break
    for fam in families.values():
        fam.multi.sort(key=lambda s: s.world_size)
    return list(families.values())


def memory_per_gpu_cells(row: Row, n_gpus: int) -> dict[str, Any]:
    """GPU i Memory (allocator peak) and NVML GPU i (device memory used at peak), raw bytes."""
    cells: dict[str, Any] = {}
    mem = {g.index: g for g in gpus(row)}
    for i in range(n_gpus):
        cells[f"GPU {i} Memory"] = getattr(mem.get(i), "max_memory_allocated", None)
        cells[f"NVML GPU {i}"] = getattr(mem.get(i), "nvml_used_peak", None)
    return cells


def gpus_in(rows: list[Row]) -> int:
    return max((max(world_size(r), len(gpus(r))) for r in rows), default=1)
