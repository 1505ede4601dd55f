"""``max-seq``: the largest sequence length a series runs, by the predicted search
(``attnbench.sweeps.search``), summarised in one ``max-seq-result`` row that states the answer,
its bracket and margin, and whether a second fresh process confirmed it.

Each trial row records what the model predicted for it (``predicted_peak_bytes``,
``predicted_time_ms``, ``predicted_max_seq``), so the report can show how good the prediction
was; a length not run because its call was predicted over the time limit is a row marked
``predicted_only``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from operator import attrgetter

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.measure.capacity import QUADRATIC_BACKENDS, fitted_peak, measured_budget
from attnbench.plan import Series
from attnbench.results.schema import MaxSeqResult, Trial, join
from attnbench.sweeps.kinds import register
from attnbench.sweeps.kinds.base import TrialKind, parallelism
from attnbench.sweeps.search import (
    DEFAULT_RELATIVE_RESOLUTION,
    PREDICTED,
    Limits,
    Outcome,
    Prediction,
    SearchResult,
    predicted_search,
)

# A search's time budget where none is set: on the CPU a first answer in minutes (a call there
# can take the whole per-call limit); on a GPU an hour, well above any committed profile's search.
SEARCH_BUDGET_S = {"cpu": 300.0, "cuda": 3600.0}
# What makes two max-seq-result rows the same search result (a resumed run does not repeat one).
RESULT_IDENTITY = ("series", "seq_len", "first_failure", "stop_status", "max_seq_len", "resolution", "start")


class MaxSeq(TrialKind):
    name = row_kind = "max-seq"
    result_kinds = ("max-seq-result",)

    def check(self, s: Series) -> None:
        if s.start() > s.settings.search.max_seq_len:
            raise AttnbenchError(
                f"{s.name}: --max-seq-len {s.settings.search.max_seq_len:,} is below the first length {s.start():,}: "
                "raise --max-seq-len or lower --start"
            )

    def lengths(self, s: Series) -> list[int]:
        return [s.start()]

    def trials(self, s: Series, runner) -> SearchResult:
        rows: list[Trial] = []  # this search's trials: what the budget is measured from

        def probe(n: int, phase: str, attempt: int, prediction: Prediction | None) -> Outcome:
            before = Predicted.of(prediction)
            if phase == PREDICTED:
                seconds = (prediction.time_ms or 0) / 1e3
                row = runner.not_run(
                    s,
                    n,
                    attempt,
                    "time-limit",
                    f"not run: a call is predicted to take {seconds:.1f} s, over the "
                    f"{s.settings.max_trial_seconds:g} s limit",
                    before,
                )
            else:
                row = runner.trial(s, n, phase, attempt=attempt, before=before)
            rows.append(row)
            return outcome(row, rows)

        st = s.settings
        limits = Limits(
            start=s.start(),
            granularity=s.granularity(),
            max_len=st.search.max_seq_len,
            resolution=st.search.resolution,
            degree=impls.memory_order(s.impl),
            time_limit_ms=st.max_trial_seconds * 1e3,
            relative=0.0 if st.search.resolution else DEFAULT_RELATIVE_RESOLUTION,
            budget_s=search_budget_s(st),
        )
        # counting pairs is attnbench's work, not the implementation's: the budget leaves it out
        return predicted_search(probe, limits, clock=lambda: time.monotonic() - runner.counting_s)

    def summarise(self, s: Series, result: SearchResult, runner) -> None:
        row = join(
            MaxSeqResult,
            s.workload(result.best or s.start()),
            parallelism(s),
            kind="max-seq-result",
            run=runner.run_id,
            series=runner.series_key(s),
            label=s.name,
            seq_len=result.best,
            first_failure=result.first_failure,
            stop_status=result.stop_status,
            stopped_by=result.stopped_by,
            granularity=s.granularity(),
            resolution=s.settings.search.resolution,
            start=s.start(),
            max_seq_len=s.settings.search.max_seq_len,
            trials=len(result.tried),
            confirmed=result.confirmed,
            margin=result.margin,
            first_failure_predicted=result.failure_predicted or None,
            predicted_max_seq=result.predicted_max,
            verified=runner.plan.verify,
            **outside_source(s.impl),
            env=runner.env,
        )
        runner.append_once(row, attrgetter(*RESULT_IDENTITY))


def outside_source(impl: str) -> dict:
    """``impl_source`` for a row of an outside implementation, nothing for a built-in."""
    source = impls.recorded_source(impl)
    return {"impl_source": source} if source else {}


def search_budget_s(st) -> float:
    """The seconds a search has for its trials: its setting, else its device's default."""
    return st.search.search_budget_s or SEARCH_BUDGET_S.get(st.device, SEARCH_BUDGET_S["cuda"])


@dataclass(frozen=True)
class Predicted:
    """What the capacity model said of a trial before it ran, named as the row's fields."""

    predicted_peak_bytes: float | None
    predicted_time_ms: float | None
    predicted_max_seq: int | None

    @classmethod
    def of(cls, p: Prediction | None) -> Predicted | None:
        return None if p is None else cls(p.peak_bytes, p.time_ms, p.max_seq)


def outcome(row: Trial, rows: list[Trial]) -> Outcome:
    """What the search learns from a trial: its status; for a success the peak the memory model
    fits, the time of a warm call (the median timed call), its FLOPs, the budget measured so far."""
    if row.status != "ok":
        return Outcome(row.status)
    budget = measured_budget(rows)[2]
    return Outcome(
        "ok",
        peak_bytes=fitted_peak(row),
        time_ms=row.time_ms or row.warm_call_ms,  # the timed calls: warm, and taken alone
        flops=row.flops_executed,
        budget=budget,
        degree=2 if row.backend in QUADRATIC_BACKENDS else None,
        floor_bytes=row.floor_bytes,
    )


MAX_SEQ = register(MaxSeq())
