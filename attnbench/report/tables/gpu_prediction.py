"""What P GPUs would give a sequence-parallel implementation, predicted from the GPU counts
measured on one machine, and each prediction held against every count that was measured.

Two models, each as simple as what the rows can support:

- Longest sequence. A rank holds N / P tokens, so what a rank can hold is the measure of
  capacity: a search on w GPUs that reached N_w (or, for another GPU size, the memory fit of its
  series solved for that size) gives N_w / w tokens per rank, and P GPUs N_w / w x P. Fixed
  per-rank costs (receive buffers, the merge) are part of N_w / w, as measured.
- Time at a fixed length N. The call on w GPUs takes the one-GPU equal-work time over w plus a
  cost per peer (a ring step's, or a gathered exchange's share): T_w = T_1 / w + h (w - 1). h
  is fitted from the counts measured (the median over them); P GPUs then take
  T_1 / P + h (P - 1), an efficiency of T_1 / (P T_P).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from attnbench.report.tables.multigpu import EQUAL_WORK, ring_pairs, scaling_families


@dataclass(frozen=True)
class LongestPrediction:
    gpus: int  # the count predicted for
    source: int  # the count measured it is predicted from
    per_rank: float  # tokens one rank holds at the source's longest sequence
    predicted: float
    measured: int | None  # the search's answer on ``gpus``, where one ran


@dataclass(frozen=True)
class TimePrediction:
    gpus: int
    seq_len: int
    one_gpu_ms: float  # the equal-work baseline's time at seq_len
    per_peer_ms: float  # h, fitted on ``fitted_on``
    fitted_on: tuple[int, ...]
    predicted_ms: float
    measured_ms: float | None

    @property
    def efficiency(self) -> float:
        return self.one_gpu_ms / (self.gpus * self.predicted_ms)


def longest(rows: list, impl: str, gpus: int) -> list[LongestPrediction]:
    """From every finished search of ``impl`` on w GPUs: P GPUs hold w's tokens per rank, P
    times; with every other measured count held against the same rule."""
    measured = {}
    for fam in scaling_families(rows):
        for s in [fam.single, *fam.multi]:
            if s is not None and s.impl == impl and s.complete and s.max_seq_len:
                measured[s.world_size] = s.max_seq_len
    out = []
    for source, n in sorted(measured.items()):
        for target in sorted({gpus, *measured} - {source}):
            per_rank = n / source
            out.append(LongestPrediction(target, source, per_rank, per_rank * target, measured.get(target)))
    return out


def time_at(rows: list, impl: str, gpus: int, seq_len: int | None = None) -> list[TimePrediction]:
    """T_P = T_1 / P + h (P - 1) at the longest length every measured count ran (or
    ``seq_len``), h the median over the measured counts; each measured count predicted from
    the others (from itself where it is the only one)."""
    by_count: dict[int, dict[int, tuple[float, float]]] = {}
    for p in ring_pairs(rows):
        if p.row.impl == impl and p.baseline == EQUAL_WORK and p.world_size > 1 and p.time_ci and p.base_ci:
            by_count.setdefault(p.world_size, {})[p.row.seq_len] = (p.base_ci.value, p.time_ci.value)
    if not by_count:
        return []
    common = set.intersection(*(set(v) for v in by_count.values()))
    n = seq_len if seq_len in common else (max(common) if common else None)
    if n is None:
        return []
    per_peer = {w: (ring - base / w) / (w - 1) for w, at in by_count.items() for base, ring in [at[n]]}
    base = statistics.median(at[n][0] for at in by_count.values())
    out = []
    for target in sorted({gpus, *per_peer}):
        others = tuple(sorted(w for w in per_peer if w != target)) or (target,)
        h = statistics.median(per_peer[w] for w in others)
        measured = by_count.get(target, {}).get(n)
        out.append(
            TimePrediction(target, n, base, h, others, base / target + h * (target - 1), measured and measured[1])
        )
    return out
