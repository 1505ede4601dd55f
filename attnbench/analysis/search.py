"""How a max-seq search ended: one rule for the report, the check and the command line.

A finished search wrote a ``max-seq-result`` row: its answer is that row's, which sits below a
length that ran once where the fresh-process confirmation there failed. An interrupted search
has only its trials: its answer is the longest length that ran below every length that failed
(a length that ran once and failed in another trial is not an answer), and it is a lower bound.
A search its time budget stopped is a lower bound too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from attnbench.results import BUDGET, STOPPED_BY
from attnbench.results.schema import MaxSeqResult, Trial
from attnbench.results.series import row_date

S = TypeVar("S")

INTERRUPTED = "search interrupted"


@dataclass(frozen=True)
class SearchOutcome:
    """A search's answer and what bounds it."""

    max_seq_len: int  # the longest length that ran, as the search answers it (0: none ran)
    first_failure: int | None  # the shortest length above it that failed
    stop: Trial | None  # that failed trial (its status and message)
    stopped_by: str  # what stopped the search, in words (STOPPED_BY, or INTERRUPTED)
    complete: bool  # the search finished by itself: not interrupted, not stopped by its budget
    best_row: Trial | None  # a trial that ran at the answer's length
    unstable: tuple[int, ...] = ()  # lengths that ran in one trial and failed in another
    confirmed: bool | None = None  # the answer ran again in a fresh process (None: not said)
    promised_gap: int | None = None  # the widest bracket the search promised: 1% of the answer, its grid or resolution

    @property
    def wider_than_promised(self) -> bool:
        gap = self.first_failure - self.max_seq_len if self.first_failure and self.max_seq_len else None
        return self.complete and gap is not None and self.promised_gap is not None and gap > self.promised_gap


def search_outcome(trials: list[Trial], result: MaxSeqResult | None) -> SearchOutcome:
    """The outcome of one search from its trials (any order) and its result row, if written."""
    ran = {r.seq_len for r in trials if r.status == "ok"}
    failed = {r.seq_len for r in trials if r.status != "ok"}
    if result is not None:
        best = result.seq_len or 0
    else:
        below = min(failed, default=None)
        best = max((n for n in ran if below is None or n < below), default=0)
    above = [r for r in trials if r.status != "ok" and r.seq_len > best]
    stop = min(above, key=lambda r: r.seq_len) if above else None
    return SearchOutcome(
        max_seq_len=best,
        first_failure=stop.seq_len if stop else None,
        stop=stop,
        stopped_by=_stopped_by(result, stop),
        complete=result is not None and result.stop_status != BUDGET,
        best_row=next((r for r in trials if r.status == "ok" and r.seq_len == best), None),
        unstable=tuple(sorted(ran & failed)),
        confirmed=result.confirmed if result is not None else None,
        promised_gap=_promised_gap(result, best),
    )


def _promised_gap(result: MaxSeqResult | None, best: int) -> int | None:
    """A finished search brackets its answer to 1% of it, or to its resolution or grid where those are wider."""
    if result is None or not best or (result.resolution is None and result.granularity is None):
        return None  # a row that does not say what the search was asked for is not judged
    return max(int(0.01 * best), result.resolution or 0, result.granularity or 0)


def _stopped_by(result: MaxSeqResult | None, stop: Trial | None) -> str:
    if result is None:  # without its max-seq-result row the search never finished
        return INTERRUPTED
    if result.stop_status == BUDGET:
        return STOPPED_BY[BUDGET]
    return STOPPED_BY.get(stop.status, stop.status) if stop else STOPPED_BY["cap"]


def answering(searches: Iterable[S], head: Callable[[S], Trial], limit: int | None = None) -> S | None:
    """Of several searches of one configuration, the one that answers: one under ``limit`` (None:
    on the whole device) before any other, then the newest (its first trial's date, then its
    series). ``head`` gives a search's first trial."""
    return max(searches, key=lambda s: (head(s).memory_limit == limit, row_date(head(s)), head(s).series), default=None)
