"""``max-seq``: the largest sequence length a series runs, by a search over lengths
(``attnbench.sweeps.search``), summarised in one ``max-seq-result`` row.

A failed probe is retried once in a fresh process before the search accepts it (both
attempts are rows): one flaky kill or OOM must not set a capacity.
"""

from __future__ import annotations

from dataclasses import asdict

from attnbench.errors import AttnbenchError
from attnbench.plan import Series
from attnbench.sweeps.kinds import register
from attnbench.sweeps.kinds.base import TrialKind, parallelism
from attnbench.sweeps.search import SearchResult, grow_then_bisect

# What makes two max-seq-result rows the same search result (a resumed run does not repeat one).
RESULT_IDENTITY = ("series", "seq_len", "first_failure", "stop_status", "max_seq_len", "resolution", "start")


class MaxSeq(TrialKind):
    name = row_kind = "max-seq"
    result_kinds = ("max-seq-result",)

    def check(self, s: Series) -> None:
        if s.start() > s.settings.max_seq_len:
            raise AttnbenchError(
                f"{s.name}: --max-seq-len {s.settings.max_seq_len:,} is below the first length {s.start():,}: "
                "raise --max-seq-len or lower --start"
            )

    def lengths(self, s: Series) -> list[int]:
        return [s.start()]

    def trials(self, s: Series, runner) -> SearchResult:
        def probe(n: int, phase: str) -> str:
            row = runner.trial(s, n, phase, attempt=1)
            if row["status"] != "ok" and row.get("attempt", 1) < 2:
                row = runner.trial(s, n, phase, attempt=2)
            return row["status"]

        return grow_then_bisect(
            probe,
            start=s.start(),
            granularity=s.granularity(),
            max_len=s.settings.max_seq_len,
            resolution=s.settings.resolution,
        )

    def summarise(self, s: Series, result: SearchResult, runner) -> None:
        runner.append_once(
            {
                "kind": "max-seq-result",
                "run": runner.run_id,
                "series": runner.series_key(s),
                "label": s.name,
                **asdict(s.workload(result.best or s.start())),
                "seq_len": result.best,
                "first_failure": result.first_failure,
                "stop_status": result.stop_status,
                "stopped_by": result.stopped_by,
                "granularity": s.granularity(),
                **parallelism(s),
                "resolution": s.settings.resolution,
                "start": s.start(),
                "max_seq_len": s.settings.max_seq_len,
                "trials": len(result.tried),
                "env": runner.env,
            },
            RESULT_IDENTITY,
        )


MAX_SEQ = register(MaxSeq())
