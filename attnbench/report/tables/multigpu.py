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
from functools import cached_property
from typing import Any

from attnbench.measure.stats import Interval
from attnbench.plan import strategies
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
from attnbench.results.series import is_superseded


def _case_key(r: Speedup) -> str:
    """A speedup case: the workload's identity but how it is spread, and the module timed."""
    return r.identity_key(without=("world_size", "strategy"), module=r.module or "attention")


@dataclass
class Candidates:
    """Baseline candidates for ``_pick`` in constant time, added in order: the latest of them
    and the latest of each run (with its place in that order)."""

    last: tuple[int, Any] | None = None
    by_run: dict[str | None, tuple[int, Any]] = field(default_factory=dict)

    def add(self, place: int, candidate: Any) -> None:
        self.last = (place, candidate)
        self.by_run[_run_of(candidate)] = (place, candidate)

    def pick(self, row: Row) -> tuple[int, Any] | None:
        """``_pick`` of the candidates for ``row``, with its place."""
        return self.by_run.get(row.run) or self.last


def single_runs(found: list[Speedup]) -> dict[tuple, Candidates]:
    """The single-GPU rows by case: what ``baseline`` picks from."""
    singles: dict[tuple, Candidates] = {}
    for i, r in enumerate(found):
        if r.strategy == "single":
            singles.setdefault(_case_key(r), Candidates()).add(i, r)
    return singles


def baseline(row: Speedup, singles: dict[tuple, Candidates]) -> Speedup | None:
    """A speedup row's single-GPU baseline, by the one rule (``_pick``) the report's and a
    results directory's tables share."""
    picked = singles[_case_key(row)].pick(row) if _case_key(row) in singles else None
    return picked[1] if picked else None


def _pick(candidates: list[Any], row: Row) -> Any:
    """The baseline for ``row``: one from the same run if there is one, else the latest; never an average."""
    if not candidates:
        return None
    same_run = [c for c in candidates if _run_of(c) == row.run]
    return (same_run or candidates)[-1]


def _run_of(c: Any) -> str | None:
    return c.run if isinstance(c, Row) else c.head.run


@dataclass(frozen=True)
class AgainstOneDevice:
    """A multi-GPU measurement against its baseline on one device (None where not measured):
    the ratio and both times read with one timer (``speedup_ci`` and ``timer`` are the kind's)."""

    row: Workload
    single: Workload | None

    @property
    def world_size(self) -> int:
        return world_size(self.row)

    @property
    def speedup(self) -> float | None:
        return self.speedup_ci.value if self.speedup_ci else None

    @property
    def efficiency_ci(self) -> Interval | None:
        return divided(self.speedup_ci, self.world_size)

    @property
    def efficiency(self) -> float | None:
        return self.efficiency_ci.value if self.efficiency_ci else None

    @property
    def base_ci(self) -> Interval | None:
        return time_interval(self.single, self.timer)

    @property
    def time_ci(self) -> Interval | None:
        return time_interval(self.row, self.timer)


@dataclass(frozen=True)
class SpeedupCase(AgainstOneDevice):
    """A data-parallel speedup row against its single-GPU row, both read in eager time
    (``DATA_PARALLEL_TIMER`` says why)."""

    speedup_ci: Interval | None  # single time / multi-GPU time, resampling both sides; None unless both ran
    timer: str = DATA_PARALLEL_TIMER


def latest_speedup_rows(rows: list[Row]) -> list[Speedup]:
    """Speedup rows, the last of each trial key of a run kept (a trial run again replaces its row)."""
    latest: dict[tuple, Speedup] = {}
    for r in speedup_rows(rows):
        latest[(r.run, r.key or len(latest))] = r
    return list(latest.values())


def speedup_cases(rows: list[Row]) -> list[SpeedupCase]:
    """Each multi-GPU speedup row with its single-GPU baseline (same case, same machine)."""
    found = latest_speedup_rows(rows)
    singles = single_runs(found)
    cases = []
    for r in found:
        if r.strategy == "single":
            continue
        base = baseline(r, singles)
        ran = base is not None and base.status == "ok" and r.status == "ok"
        cases.append(SpeedupCase(r, base, speedup_interval(base, r, DATA_PARALLEL_TIMER)[0] if ran else None))
    return cases


def group_label(r: Speedup) -> str:
    cfg = config_text(r.config)
    return f"{r.impl}{f'({cfg})' if cfg else ''}, {r.module or 'attention'}, {r.mode}, {r.dtype}, {ranks_text(r)}"


def ranks_text(r: Workload) -> str:
    """`2 GPUs`, `1 GPU`; on the CPU the processes that stand in for GPUs: `2 CPU processes`."""
    n = world_size(r)
    return f"{n} GPU{'s' * (n != 1)}" if r.device != "cpu" else f"{n} CPU process{'es' * (n != 1)}"


def speedup_groups(cases: list[SpeedupCase]) -> dict[tuple, list[SpeedupCase]]:
    """Cases by strategy, then by everything but the (length, batch) case."""
    groups: dict[tuple, list[SpeedupCase]] = {}
    for c in cases:
        groups.setdefault((c.row.strategy, group_label(c.row)), []).append(c)
    return {
        k: sorted(v, key=lambda c: (c.row.seq_len, c.row.batch or 0))
        for k, v in sorted(groups.items(), key=lambda kv: (strategies.order(kv[0][0]), kv[0][1]))
    }


# --- ring runs against one GPU --------------------------------------------------------------


def counterparts(impl: str, source: dict | None = None) -> tuple[str, ...]:
    """Single-device implementations that compute what ``impl`` computes, preferred first
    (``source``: an outside implementation's ``impl_source``, which names its counterpart)."""
    from attnbench import impls

    counterpart = impls.counterpart(impl, source)
    return (impl, counterpart) if counterpart else (impl,)


#: which single-GPU row a multi-GPU ring row is compared with
EQUAL_WORK = (
    "equal work"  # the single-device counterpart over the whole sequence (sdpa for ring, dilated for ring-dilated)
)
SAME_SPLIT = "same split"  # the same implementation on one rank


class OneDevice:
    """Single-device rows by implementation, length, settings and configuration, so that each
    multi-GPU row finds its baselines in time independent of the rows' number."""

    def __init__(self, rows: list[Trial]) -> None:
        self.groups: dict[tuple, dict[str, Candidates]] = {}
        for i, c in enumerate(rows):
            configs = self.groups.setdefault((c.impl, c.seq_len, settings_key(c)), {})
            configs.setdefault(config_id(c.config), Candidates()).add(i, c)

    def same_workload(self, row: Workload, impl: str) -> Trial | None:
        """``_pick`` of the rows of ``impl`` at ``row``'s workload and length whose
        configuration agrees with its own."""
        agreeing = [
            g
            for g in self.groups.get((impl, row.seq_len, settings_key(row)), {}).values()
            if configs_agree(g.last[1].config, row.config)
        ]
        same_run = [g.by_run[row.run] for g in agreeing if row.run in g.by_run]
        picked = max(same_run or [g.last for g in agreeing], default=None, key=lambda p: p[0])
        return picked[1] if picked else None


def baselines(row: Workload, singles: OneDevice) -> dict[str, Trial | None]:
    """The single-GPU rows of the same workload and length: ``equal work`` (the best
    single-device implementation of the same key sets over the whole sequence) and ``same
    split`` (the same implementation on one rank), each None where not measured."""
    from attnbench import impls

    counterpart = impls.counterpart(row.impl, getattr(row, "impl_source", None))
    return {
        EQUAL_WORK: singles.same_workload(row, counterpart) if counterpart else None,
        SAME_SPLIT: singles.same_workload(row, row.impl),
    }


def preferred(found: dict[str, Trial | None]) -> tuple[Trial | None, str | None]:
    """Of ``baselines``' rows, the one a ring row is compared with, and which baseline it is:
    the equal-work one where measured, else the same implementation on one rank."""
    kind = EQUAL_WORK if found[EQUAL_WORK] else SAME_SPLIT if found[SAME_SPLIT] else None
    return (found[kind] if kind else None), kind


@dataclass(frozen=True)
class RingPair(AgainstOneDevice):
    """A sequence-parallel measurement against one device: which baseline ``single`` is
    (``EQUAL_WORK`` or ``SAME_SPLIT``; None where not measured), and the same implementation on
    one rank beside an equal-work baseline."""

    baseline: str | None
    same_split: Workload | None = None

    @cached_property
    def timer(self) -> str:
        """GPU time where both rows have it, else eager time."""
        return speedup_interval(self.single, self.row)[1]

    @cached_property
    def speedup_ci(self) -> Interval | None:
        """T(baseline) / T(ring); the interval resamples both sides."""
        return speedup_interval(self.single, self.row)[0]

    @property
    def efficiency_same_split(self) -> float | None:
        ci = speedup_interval(self.same_split, self.row)[0]
        return ci.value / self.world_size if ci else None

    @property
    def sent_bytes(self) -> int | None:
        """Bytes the busiest rank sends per call (rows before the row-level field: per rank only)."""
        r = self.row
        if getattr(r, "sent_bytes", None) is not None:
            return r.sent_bytes
        return max((x.sent_bytes or 0 for x in r.ranks or []), default=0) or None

    @property
    def eager_efficiency(self) -> float | None:
        """Efficiency in eager time, host included: what a caller of the ring sees on this host
        (beside the GPU-time efficiency where both rows have GPU time)."""
        ci = speedup_interval(self.single, self.row, "eager")[0]
        return ci.value / self.world_size if ci else None

    @property
    def tflops_per_gpu(self) -> float | None:
        """Executed FLOPs of the whole call over its time (the pair's timer) and its GPUs."""
        flops, time = getattr(self.row, "flops_executed", None), self.time_ci
        return flops / (time.value * 1e9) / self.world_size if flops and time and time.value else None

    @property
    def baseline_text(self) -> str | None:
        """`equal work: sdpa`: which baseline, and its implementation."""
        return f"{self.baseline}: {self.single.impl}" if self.single else None


@dataclass(frozen=True)
class RankTime:
    """One rank of a ring measurement: its compute time and its wait on communication."""

    row: Workload
    rank: int
    compute_ms: float | None
    comm_wait_ms: float | None


def ring_pairs(rows: list[Row]) -> list[RingPair]:
    """Successful sequence-parallel measurements (several ranks, or a ring on one), each with
    its baseline on one device: the equal-work one where measured, else the same
    implementation on one rank (for a ring on several)."""
    pairs = []
    points = ok(trials(rows))
    singles = OneDevice([r for r in points if world_size(r) == 1])
    for r in points:
        if world_size(r) > 1 or r.strategy == "ring":
            found = baselines(r, singles)
            if world_size(r) == 1:  # a ring on one rank: only another implementation is a baseline
                found[SAME_SPLIT] = None
            base, kind = preferred(found)
            pairs.append(RingPair(r, base, kind, found[SAME_SPLIT] if kind == EQUAL_WORK else None))
    for c in speedup_cases(rows):
        if c.row.strategy == "ring" and c.row.status == "ok":
            pairs.append(RingPair(c.row, c.single, SAME_SPLIT if c.single else None))
    return sorted(pairs, key=lambda p: (p.row.impl, config_id(p.row.config), p.row.seq_len, p.world_size))


def rank_breakdown(rows: list[Row]) -> list[RankTime]:
    """Per rank: compute time and time spent waiting on communication, where rows record it."""
    return [
        RankTime(p.row, i if rank.rank is None else rank.rank, rank.compute_ms, rank.comm_wait_ms)
        for p in ring_pairs(rows)
        if p.world_size > 1
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
            for impl in counterparts(head.impl, getattr(head, "impl_source", None)):
                found = [
                    x
                    for x in singles
                    if x.head.impl == impl
                    and settings_key(x.head) == settings_key(head)
                    and configs_agree(x.head.config, head.config)
                ]
                if found:  # the newest code's, under the same memory limit where one was searched so
                    found = [x for x in found if not is_superseded(x.head.label)] or found
                    same_limit = [x for x in found if x.head.memory_limit == head.memory_limit]
                    fam.single = _pick(same_limit or found, head)
                    break
    for fam in families.values():
        fam.multi.sort(key=lambda s: s.world_size)
    return list(families.values())


def gpu_peak(row: Row, index: int, counter: str = "max_memory_allocated") -> int | None:
    """One GPU's peak of a multi-GPU row: the allocator's (``max_memory_allocated``) or the
    device memory NVML saw used (``nvml_used_peak``); None where the row has no such GPU."""
    return next((getattr(g, counter) for g in gpus(row) if g.index == index), None)


def gpus_in(rows: list[Row]) -> int:
    return max((max(world_size(r), len(gpus(r))) for r in rows), default=1)
