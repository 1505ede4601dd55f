"""Run a plan: check it, verify each configuration against the reference, then run each
series by its kind (``attnbench.sweeps.kinds``), appending each row to ``trials.jsonl`` the
moment its trial ends.

Nothing is written until the plan has been checked and every configuration has run on the
reference check, so bad input leaves no results file behind. ``resume`` replays the rows
already in the directory instead of running those trials again, when they were measured
under the same limits and timing settings (their identity); any other row is measured
again, and the reporter says so; a reference check whose row is kept is not run again. The
run holds an exclusive lock on the directory.

The runner owns what every kind shares: the reference checks, the results file, resume, and
``trial`` (one measured trial of a series, in a fresh worker process unless the series says
otherwise). What a kind plans, runs and summarises is in its own module.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from attnbench import impls
from attnbench.measure.accounting import Pairs
from attnbench.measure.timing import TimingPolicy
from attnbench.plan import Plan, Series
from attnbench.results import ResultsLock, now_utc, series_key
from attnbench.results.schema import Environment, Row, Trial, Verify, join
from attnbench.runtime import nodes
from attnbench.runtime.supervise import pause_after_trials
from attnbench.runtime.worker import close_spares
from attnbench.sweeps import kinds
from attnbench.sweeps.kinds.base import parallelism
from attnbench.sweeps.session import Reporter as BaseReporter
from attnbench.sweeps.session import RunSession
from attnbench.sweeps.verification import config_text
from attnbench.trials.measured import take_pairs
from attnbench.trials.reference import VerifyCase, reduced, with_long_checks
from attnbench.trials.trial import TrialSpec, execute, run_isolated


class Reporter(BaseReporter, Protocol):
    def series_started(self, series: Series, index: int, total: int) -> None: ...
    def trial_running(self, series: Series, seq_len: int, phase: str) -> AbstractContextManager: ...
    def trial_done(self, series: Series, row: Trial, replayed: bool) -> None: ...
    def series_done(self, series: Series, result: Any) -> None: ...
    def note(self, text: str) -> None: ...


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def visible_gpus() -> int:
    """CUDA GPUs a trial may spread over: this machine's, on every node of the run."""
    import torch

    return torch.cuda.device_count() * nodes.current().count


def resolve(plan: Plan) -> Plan:
    """Resolve ``device = auto``, clip what the visible GPUs cannot hold (a profile's lists),
    and check every series by its kind before anything runs."""
    needs_cuda = any(s.settings.device in ("auto", "cuda") for s in plan.series)
    have_cuda = cuda_available() if needs_cuda else False
    gpus = visible_gpus() if have_cuda else 0
    # the most ranks first: their length rule is the strictest, so its error names lengths every series takes
    checked_first = sorted(plan.series, key=lambda s: -(s.world_size or 1))
    outcome = {id(s): kinds.get(s.settings.kind).resolve(s, have_cuda, gpus, plan.clip_ranks) for s in checked_first}
    resolved, clipped = [], []
    for s in plan.series:
        s, note = outcome[id(s)]
        clipped += [note] if note else []
        if s is not None:
            resolved.append(s)
    return replace(plan, series=tuple(resolved), clipped=tuple(clipped))


def verify_cases(plan: Plan) -> tuple[list[VerifyCase], list[str]]:
    """Every series' reference-check cases, each configuration once, with a long check where a
    sparse pattern is sparse (``reference.with_long_checks``); and the warnings of
    configurations dense at every length checked."""
    cases = [reduced(c) for s in plan.series for c in kinds.get(s.settings.kind).verify_cases(s)]
    unique = {json.dumps(asdict(c), sort_keys=True): c for c in cases}
    return with_long_checks(list(unique.values()), checks_memory_limit(plan))


def contention_notes(plan: Plan) -> list[str]:
    """A warning per sequence-parallel rank count whose ranks outnumber a CPU node's cores."""
    from attnbench.sweeps import seqpar

    notes = ((s.world_size, seqpar.contention(s.settings.device, s.world_size)) for s in plan.series if s.distributed)
    return [f"{world} ranks on the CPU: {why}" for world, why in dict(notes).items() if why]


def checks_memory_limit(plan: Plan) -> int | None:
    """The memory limit the reference checks run under: the largest of the series' (None where
    one has none)."""
    limits = [s.settings.memory_limit for s in plan.series]
    return None if None in limits else max(limits, default=None)


# check-row fields left out where they hold their default
UNWRITTEN = {"mode": "fwd", "twin_scale": 1}


def check_key(impl: str, config: dict[str, Any], world_size: int | None) -> tuple[str, str, int]:
    """What a reference check vouches for: an implementation configuration on its ranks."""
    return impl, config_text(config), world_size or 1


@dataclass
class SeriesOutcome:
    series: Series
    verified: bool
    result: Any  # what the kind's run returned (a max-seq search's result; None for points)


def host_load() -> float | None:
    """The host's 1-minute load average (what else ran beside a trial); None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


class SweepRunner(RunSession):
    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        env: Environment,
        resume: bool = False,
        reporter: Reporter | None = None,
        speedup_reporter=None,
    ) -> None:
        super().__init__(out_dir, env, resume, reporter)
        self.plan = plan
        self.speedup_reporter = speedup_reporter
        self.done: dict[tuple[str, int, int], Trial] = {}  # (series key, seq_len, attempt) -> latest row
        self.kept: list[Row] = []  # verify and result rows already written
        self.resumed: list[Row] = []  # every row a resumed run continues from
        self._remeasured = 0
        self.counts: dict[str, Pairs] = {}  # pairs counted after a trial, by shape: handed to the next there
        self.counting_s = 0.0  # seconds trials spent counting pairs: a search's budget leaves them out
        self._planned: list[VerifyCase] | None = None

    # --- before anything is written ------------------------------------------------------
    def prepare(self) -> None:
        """What a resumed run holds; read again under the lock (a run that just ended counts)."""
        self.done, self.kept = {}, []
        self.resumed = self.resumed_rows()
        for r in self.resumed:
            if isinstance(r, Trial) and r.kind in kinds.trial_kinds():
                self.done[(r.series, r.seq_len, r.attempt or 1)] = r
            elif r.kind == "verify" or r.kind in kinds.result_kinds():
                self.kept.append(r)

    def reference_checks(self) -> list[Verify]:
        """Each configuration against the float64 reference, in a child under the trials'
        memory limit like a trial (in this process only when every series runs in-process).
        A check whose row a resumed run already holds is not run again."""
        if not self.plan.verify:
            return []
        cases = [c for c in self.planned_checks() if self._kept_check(c) is None]
        isolate = any(s.settings.isolate for s in self.plan.series) or any(c.device == "cuda" for c in cases)
        limit = checks_memory_limit(self.plan)
        # trials in worker processes follow: the first one's process starts during the check
        warm = any(s.settings.isolate and not s.distributed and s.settings.kind != "speedup" for s in self.plan.series)
        call_limit = max(s.settings.max_trial_seconds for s in self.plan.series)
        return self.run_checks(cases, isolate, limit, warm, call_limit) if cases else []

    def planned_checks(self) -> list[VerifyCase]:
        """The plan's reference checks, planned once (their lengths are read from the key sets);
        a configuration dense at every length checked is named once, as a note."""
        if self._planned is None:
            self._planned, warnings = verify_cases(self.plan)
            for line in warnings:
                self.reporter.note(line)  # a reporter says it is a warning
        return self._planned

    def _kept_check(self, case: VerifyCase) -> Verify | None:
        # a forward-only check row names no mode (only fwd_bwd is written), a direct one no twin scale
        want = asdict(case)
        for r in self.kept:
            if isinstance(r, Verify) and all(_or_unwritten(r, k) == v for k, v in want.items()):
                return r
        return None

    # --- the run --------------------------------------------------------------------------
    def run(self) -> list[SeriesOutcome]:
        """Every reference check, then each series by its kind in plan order; a resumed run
        skips every trial it finds, of every kind."""
        try:
            return self._run()
        finally:
            close_spares()  # the next trial's process, started ahead: no trial will take it

    def _run(self) -> list[SeriesOutcome]:
        self.prepare()
        kept = [self._kept_check(c) for c in self.planned_checks()] if self.plan.verify else []
        verify_rows = self.reference_checks()  # bad input raises here, before anything is written
        with ResultsLock(self.out_dir):  # one run per directory
            self.prepare()  # again under the lock: what a run that just ended wrote counts
            for row in verify_rows:
                self.append_once(row, verify_identity)
            self.reporter.verify_done(verify_rows)
            checks = verify_rows + [r for r in kept if r is not None]
            # an unsupported shape is not a wrong output: its series runs and its trials say so
            failed = {
                check_key(r.impl, r.twin_of or r.config, r.world_size)
                for r in checks
                if r.status not in ("pass", "unsupported")
            }
            for note in contention_notes(self.plan):
                self.reporter.note(note)
            outcomes = []
            for i, s in enumerate(self.plan.series):
                kind = kinds.get(s.settings.kind)
                if check_key(s.impl, s.build().config(), s.world_size) in failed:
                    kind.unverified(s, self, i, len(self.plan.series))
                    outcomes.append(SeriesOutcome(s, False, None))
                    continue
                result = kind.run(s, self, i, len(self.plan.series))
                outcomes.append(SeriesOutcome(s, True, result))
            if self._remeasured:
                self.reporter.note(
                    f"{self._remeasured} earlier trial(s) in {self.out_dir} were measured under other limits "
                    "or timing settings and were measured again"
                )
        return outcomes

    def series_key(self, s: Series) -> str:
        spread = parallelism(s)
        return series_key(s.workload(0).to_dict(), spread.world_size, spread.strategy, kind=s.settings.kind)

    def trial(
        self, s: Series, seq_len: int, phase: str, attempt: int = 1, processes: int = 1, before: Any = None
    ) -> Trial:
        """Attempt ``attempt`` of a trial of ``s`` at ``seq_len`` (``processes`` fresh processes
        for a timed point, stopping at the first failure), or the row a resumed run already holds
        for it; ``before`` (a typed part: what a model predicted for it, say) joins the row."""
        key = (self.series_key(s), seq_len)
        spec = self.spec(s, seq_len)
        earlier = self.replayed(s, key, attempt, spec)
        if earlier is not None:
            return earlier
        pause_after_trials(len(self.done))
        for process in range(processes):
            row = self._measure(s, spec, phase, key, attempt, process if processes > 1 else None, before)
            if row.status != "ok":
                break
        return row

    def not_run(self, s: Series, seq_len: int, attempt: int, status: str, message: str, before: Any = None) -> Trial:
        """A trial decided without running it (a call predicted far over the time limit): a row
        marked ``predicted_only``, or the one a resumed run already holds."""
        key = (self.series_key(s), seq_len)
        spec = self.spec(s, seq_len)
        earlier = self.replayed(s, key, attempt, spec)
        if earlier is not None:
            return earlier
        row = self._trial_row(
            s,
            spec,
            "predicted",
            key,
            attempt,
            before,
            predicted_only=True,
            status=status,
            message=message,
            times_ms=[],
            floor_bytes=s.workload(seq_len).floor_bytes // s.world_size,
            started_at=now_utc(),
            duration_s=0.0,
        )
        self.record(row, key)
        self.reporter.trial_done(s, row, False)
        return row

    def replayed(self, s: Series, key: tuple[str, int], attempt: int, spec: TrialSpec) -> Trial | None:
        """The row a resumed run holds for this attempt, when measured under this run's limits."""
        earlier = self.done.get((*key, attempt))
        if earlier is None:
            return None
        if TrialSettings.of(earlier) == settings(spec, s):
            self.reporter.trial_done(s, earlier, True)
            return earlier
        self._remeasured += 1
        self.reporter.note(
            f"{s.name} at {key[1]:,}: the earlier trial ran under {TrialSettings.of(earlier).text()}, "
            f"this run uses {settings(spec, s).text()}: measuring again"
        )
        return None

    def _measure(self, s: Series, spec: TrialSpec, phase: str, key, attempt: int, process: int | None, before) -> Trial:
        started, t0, load = now_utc(), time.monotonic(), host_load()
        with self.reporter.trial_running(s, key[1], phase):
            if s.distributed:  # one process per rank under torchrun, whatever --in-process says
                from attnbench.sweeps import seqpar

                measured = seqpar.run_trial(spec, s.world_size)
            else:
                measured = run_isolated(spec) if s.settings.isolate else execute(spec)
                self.account(s, key[1], measured)
        row = self._trial_row(
            s,
            spec,
            phase,
            key,
            attempt,
            before,
            measured,
            process=process,
            started_at=started,
            duration_s=round(time.monotonic() - t0, 3),
            host_load=[load, host_load()] if load is not None else None,
        )
        self.record(row, key)
        self.reporter.trial_done(s, row, False)
        return row

    def account(self, s: Series, seq_len: int, measured) -> None:
        """What the sweep knows of a trial's FLOPs beyond its process: pairs it counted (after its
        measurement, ``trials.counting``) are kept for the next trial of that shape, and their
        seconds left out of a search's budget; an outside module that declares nothing is dense
        only by default: unverified, its FLOPs are unknown, never dense in disguise."""
        if measured.status != "ok" or s.distributed:
            return
        self.counting_s += measured.count_s or 0.0
        if measured.pairs_counted in ("blocks", "exact", "unknown") and measured.count_s is not None:
            self.counts[self._shape_key(s, seq_len)] = Pairs(
                measured.pairs_useful,
                measured.pairs_executed,
                measured.pairs_counted,
                measured.pairs_source,
                measured.flops_unknown,
            )
        if s.build().dense_by_default and not self.plan.verify:
            why = "declares no key sets and was not verified (--no-verify): dense is only attnbench's default"
            take_pairs(measured, Pairs.not_known(why), s.workload(seq_len))

    def _shape_key(self, s: Series, seq_len: int) -> str:
        st = s.settings
        return json.dumps([s.impl, s.config, seq_len, st.heads, st.causal], sort_keys=True, default=str)

    def _trial_row(
        self, s: Series, spec: TrialSpec, phase: str, key, attempt: int, *parts: Any, **outcome: Any
    ) -> Trial:
        """A trial's row: what it is (the trial, its workload, how it is spread, its settings,
        when it ran), then the typed parts (what it measured, what a model predicted of it)."""
        row_kind = kinds.get(s.settings.kind).row_kind
        if row_kind != s.settings.kind:
            outcome["sweep"] = s.settings.kind  # rows of another kind's shape say which sweep ran them
        outcome["verified"] = self.plan.verify  # its configuration passed the reference check first
        outcome.setdefault("impl_source", impls.recorded_source(s.impl))
        return join(
            Trial,
            *(p for p in parts if p is not None),
            kind=row_kind,
            run=self.run_id,
            trial=uuid.uuid4().hex[:12],
            series=key[0],
            label=s.name,
            phase=phase,
            attempt=attempt,
            **s.workload(key[1]).to_dict(),
            **asdict(parallelism(s)),
            **asdict(settings(spec, s)),  # null where unset: a row says it ran without a limit
            **{k: v for k, v in outcome.items() if v is not None},
            env=self.env,
        )

    def record(self, row: Trial, key: tuple[str, int]) -> None:
        """Append a trial row (measured, or decided without running) as the latest of its attempt."""
        self.append(row)
        self.done[(*key, row.attempt)] = row

    def spec(self, s: Series, seq_len: int) -> TrialSpec:
        st = s.settings
        workload = s.workload(seq_len)
        timing = st.timing(
            # sequence-parallel ranks are supervised per phase at the per-call limit
            st.max_trial_seconds if s.distributed else st.timing_budget_s,
            threads=st.threads if workload.device == "cpu" else None,
        )
        return TrialSpec(
            workload=workload,
            max_trial_seconds=st.max_trial_seconds,
            memory_limit=st.memory_limit,
            timing=timing,
            seed=seq_len,
            pairs=self.counts.get(self._shape_key(s, seq_len)),
        )

    def append_once(self, row: Row, key: Callable[[Row], Hashable]) -> None:
        """A resumed run does not repeat a reference check or a series' result it already has
        (``key``: what makes two rows of its kind the same)."""
        mine = key(row)
        if any(r.kind == row.kind and key(r) == mine for r in self.kept):
            return
        self.kept.append(row)
        self.append(row)


def verify_identity(row: Row) -> tuple[str, str | None]:
    """What makes two rows the same reference check: the call checked (its workload's
    identity) and what the check found."""
    return row.identity_key(), row.status


@dataclass(frozen=True)
class TrialSettings:
    """The settings besides the workload that can change a trial's outcome: a row measured
    under other values is not this run's trial."""

    max_trial_seconds: float | None
    memory_limit: int | None
    isolate: bool | None
    timing: dict[str, Any] | None

    @classmethod
    def of(cls, row: Trial) -> TrialSettings:
        return cls(row.max_trial_seconds, row.memory_limit, row.isolate, row.timing)

    def text(self) -> str:
        from attnbench.units import format_bytes

        limit = format_bytes(self.memory_limit) if self.memory_limit else "none"
        timing = self.timing if self.timing is not None else "unrecorded"
        how = "isolated" if self.isolate else "in-process"
        return f"memory limit {limit}, max {self.max_trial_seconds} s per call, {how}, timing {timing}"


def settings(spec: TrialSpec, s: Series) -> TrialSettings:
    """The trial settings as this run sets them."""
    timing = recorded_timing(spec.policy(), spec.workload.device)
    return TrialSettings(spec.max_trial_seconds, spec.memory_limit, s.settings.isolate or s.distributed, timing)


def recorded_timing(policy: TimingPolicy, device: str) -> dict[str, int | float | None]:
    """A timing plan as its trial's row records it: every field, its thread count only on the
    CPU (a CPU time means something only at a stated thread count; a GPU's does not depend on it)."""
    timing = asdict(policy)
    if device != "cpu":
        del timing["threads"]
    return timing


def _values(row: Row, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(getattr(row, k, None) for k in names)


def _or_unwritten(row: Verify, name: str) -> Any:
    value = getattr(row, name)
    return UNWRITTEN.get(name) if value is None else value
