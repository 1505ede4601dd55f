"""Pairs counted apart from the measurement: never part of a trial's time or memory.

An implementation whose pairs come from counting its declared key sets (a ``mask_mod`` or a
``key_mask`` and no closed form: ``AttentionImpl.counted_pairs``) is counted after its trial's
measurement is complete: its timed calls are over, its peak memory read and frozen and the
trial's memory limit lifted. The count has a time limit of its own (``COUNT_LIMIT_S``, checked
between its steps), and the process leaves what it measured before it starts counting
(``runtime.worker.leave_partial``), so a count that cannot finish (too long to start, past its
limit, a process stopped while counting) leaves the row's time and memory as measured, with
FLOPs unknown and the reason. A sweep counts each configuration and length once: a later
trial at the same shape is handed the count (``TrialSpec.pairs``).
"""

from __future__ import annotations

from attnbench.masks.bounds import CountRefused, time_limit
from attnbench.measure.accounting import Pairs, pairs_of

# Seconds one count may take (a window or a document mask takes seconds at 10M tokens; this
# stops one that bounds cannot follow and that was not refused outright).
COUNT_LIMIT_S = 600.0


def count(impl, seq_len: int, heads: int, causal: bool, limit_s: float = COUNT_LIMIT_S) -> Pairs:
    """The pairs of ``impl`` at this shape, counted within ``limit_s`` seconds; why not, where not."""
    with time_limit(limit_s):
        try:
            return pairs_of(impl, seq_len, heads, causal)
        except CountRefused as exc:
            return Pairs.not_known(f"{exc} ({limit_s:g} s)" if "time limit" in str(exc) else str(exc))


def stopped(why: str) -> Pairs:
    """The pairs of a trial whose process was stopped while it counted them."""
    why = (why or "no reason").splitlines()[0]
    return Pairs.not_known(f"counting the pairs was stopped ({why}); the measurement before it is kept")
