"""How the ranks of one multi-rank trial make one measurement, the same for every trial that
runs on several ranks (a sequence-parallel trial, a speedup trial): a call ends when its
slowest rank ends, a one-off cost (the first call, a compile) is the slowest rank's where
every rank took it, and a rank's own line reads its median call."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


def slowest_per_call(per_rank: list[list[float]]) -> list[float]:
    """Call i ends when its slowest rank ends. Ranks that timed different numbers of calls did
    not run in step, and no call time can be read from them: ValueError."""
    if not per_rank or any(len(t) != len(per_rank[0]) for t in per_rank):
        raise ValueError("ranks timed different numbers of calls")
    return [max(call) for call in zip(*per_rank)]


def slowest_of_all(values: list[float | None], ranks: int) -> float | None:
    """The slowest of ``ranks`` ranks' values where every one of them gave one, else None."""
    given = [v for v in values if v is not None]
    return max(given) if given and len(given) == ranks else None


def own_median(times_ms: list[float] | None) -> float | None:
    """A rank's own median call."""
    return statistics.median(times_ms) if times_ms else None


@dataclass(frozen=True)
class Calls:
    """A multi-rank trial's calls: eager and GPU time per call, and how GPU time was taken."""

    times_ms: list[float]
    gpu_times_ms: list[float] | None = None
    gpu_timer: str | None = None


def calls_of(ranks: list[Any], expected: int) -> Calls:
    """The trial's calls from what its ranks sent (each with ``times_ms``, ``gpu_times_ms`` and
    ``gpu_timer``): none unless all ``expected`` ranks timed their calls; call i's time the
    slowest rank's; GPU time only where every rank took it (they replayed their calls together)."""
    if len(ranks) != expected or not ranks or not all(r.times_ms for r in ranks):
        return Calls([])
    times = slowest_per_call([r.times_ms for r in ranks])
    if not all(r.gpu_times_ms for r in ranks):
        return Calls(times)
    gpu_timer = next((r.gpu_timer for r in ranks if r.gpu_timer), None)
    return Calls(times, slowest_per_call([r.gpu_times_ms for r in ranks]), gpu_timer)
