"""Grow-then-bisect search for the largest sequence length that runs.

Double the length from ``start`` until the first failing trial, then bisect between the
last success and the first failure down to the implementation's granularity (or a coarser
resolution). Pure: trials come from the ``probe`` callable, so the
search is tested against an injected failure threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# probe(seq_len, phase) -> a status of results.STATUSES; anything but "ok" is a failure
Probe = Callable[[int, str], str]


@dataclass
class SearchResult:
    best: int  # largest length that ran (0: none did)
    first_failure: int | None  # smallest length that failed (None: none did, up to the cap)
    stop_status: str  # status of first_failure, or "cap"
    tried: list[tuple[int, str]] = field(default_factory=list)

    @property
    def stopped_by(self) -> str:
        from attnbench.results import STOPPED_BY

        return STOPPED_BY.get(self.stop_status, self.stop_status)


def grow_then_bisect(probe: Probe, start: int, granularity: int, max_len: int, resolution: int = 0) -> SearchResult:
    """Every probed length is a multiple of ``granularity``; bisection stops once the gap
    between success and failure is at most ``max(granularity, resolution)``."""
    if granularity <= 0 or start <= 0 or start % granularity:
        raise ValueError(f"start {start} must be a positive multiple of granularity {granularity}")
    stop_gap = max(granularity, resolution)
    tried: list[tuple[int, str]] = []

    def run(n: int, phase: str) -> str:
        status = probe(n, phase)
        tried.append((n, status))
        return status

    lo, hi, hi_status = 0, None, "cap"
    n = start
    while n <= max_len:
        status = run(n, "grow")
        if status != "ok":
            hi, hi_status = n, status
            break
        lo, n = n, n * 2
    if hi is None:
        return SearchResult(lo, None, "cap", tried)
    while hi - lo > stop_gap:
        mid = lo + (hi - lo) // 2 // granularity * granularity
        if mid <= lo:
            break
        status = run(mid, "bisect")
        if status == "ok":
            lo = mid
        else:
            hi, hi_status = mid, status
    return SearchResult(lo, hi, hi_status, tried)
