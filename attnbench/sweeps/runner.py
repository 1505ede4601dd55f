"""Run a plan: check it, verify each configuration against the reference, then run its
trials, appending each row to ``trials.jsonl`` the moment the trial ends.

Nothing is written until the plan has been checked and every configuration has run on the
reference check, so bad input leaves no results file behind. ``resume`` replays the rows
already in the directory instead of running those trials again, when they were measured
under the same limits and timing settings (their identity); any other row is measured
again, and the reporter says so. The run holds an exclusive lock on the directory.

Over 400 lines (formatted) because a sweep's order of events (plan check, reference
checks, resume, trials, the max-seq search's probes and retries) reads best in one place.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.plan import Plan, Series
from attnbench.reference import VerifyCase
from attnbench.results import ResultsLock, now_utc, series_key
from attnbench.runtime.supervise import pause_after_trials
from attnbench.sweeps.search import SearchResult, grow_then_bisect
from attnbench.sweeps.session import Reporter as BaseReporter
from attnbench.sweeps.session import RunSession
from attnbench.sweeps.verification import config_text as _config_text
from attnbench.trial import TrialSpec, execute, run_isolated
from attnbench.workload import check_heads


class Reporter(BaseReporter, Protocol):
    def series_started(self, series: Series, index: int, total: int) -> None: ...
    def trial_started(self, series: Series, seq_len: int, phase: str) -> None: ...
    def trial_done(self, series: Series, row: dict[str, Any], replayed: bool) -> None: ...
    def series_done(self, series: Series, result: SearchResult | None) -> None: ...
    def note(self, text: str) -> None: ...


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(plan: Plan) -> Plan:
    """Resolve ``device = auto`` and check every series before anything runs."""
    have_cuda = None
    resolved, clipped = [], []
    for s in plan.series:
        device = s.settings.device
        if device in ("auto", "cuda"):
            have_cuda = cuda_available() if have_cuda is None else have_cuda
            if device == "cuda" and not have_cuda:
                raise AttnbenchError(
                    "--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu"
                )
            device = "cuda" if have_cuda else "cpu"
        s = replace(s, settings=replace(s.settings, device=device))
        if plan.clip_ranks and s.distributed and device == "cuda" and s.world_size > _visible_gpus():
            clipped.append(f"{s.name}: {s.world_size} GPUs asked, {_visible_gpus()} visible; not run")
            continue
        check_series(s)
        resolved.append(s)
    speedups = []
    if plan.speedups:
        from attnbench.sweeps import profile_speedup

        have_cuda = cuda_available() if have_cuda is None else have_cuda
        for sp in plan.speedups:
            sp, note = profile_speedup.resolve(sp, have_cuda, _visible_gpus() if have_cuda else 0)
            speedups.append(sp)
            clipped += [note] if note else []
    return replace(plan, series=tuple(resolved), speedups=tuple(speedups), clipped=tuple(clipped))


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def check_series(s: Series) -> None:
    spec = impls.spec(s.impl)
    st = s.settings
    if st.device not in spec.devices:
        raise AttnbenchError(f"{s.impl} does not run on {st.device}: it runs on {', '.join(spec.devices)}")
    if st.dtype not in spec.dtypes:
        raise AttnbenchError(f"{s.impl} does not run {st.dtype}: choose --dtype from {', '.join(spec.dtypes)}")
    for key in ("batch", "heads", "head_dim"):
        if getattr(st, key) <= 0:
            raise AttnbenchError(f"--{key.replace('_', '-')} must be positive")
    check_heads(st.heads, st.kv_heads)
    if not (math.isfinite(st.max_trial_seconds) and st.max_trial_seconds > 0):
        raise AttnbenchError("--max-trial-seconds must be a positive number of seconds")
    if not (math.isfinite(st.timing_budget_s) and st.timing_budget_s > 0):
        raise AttnbenchError("--timing-budget must be positive seconds, e.g. --timing-budget 30")
    if st.warmup_s is not None and st.warmup_s < 0:
        raise AttnbenchError("warmup_s must be zero or more seconds, e.g. warmup_s = 1.0")
    if st.repeat < 1:
        raise AttnbenchError("--repeat must be at least 1 (fresh processes per timed point), e.g. --repeat 3")
    if min(st.warmup, st.min_samples) < 0:
        raise AttnbenchError("warmup and min_samples must be zero or more")
    if st.max_samples < max(1, st.min_samples):
        raise AttnbenchError(f"{s.name}: max_samples {st.max_samples} is below min_samples {st.min_samples}")
    if st.kind == "max-seq" and s.start() > st.max_seq_len:
        raise AttnbenchError(
            f"{s.name}: --max-seq-len {st.max_seq_len:,} is below the first length {s.start():,}: "
            "raise --max-seq-len or lower --start"
        )
    impl = s.build()
    if s.distributed:
        from attnbench.sweeps import seqpar

        seqpar.check_world(st.device, s.world_size)
        seqpar.check_modes(s.impl, st.mode, st.causal, impl)
    elif st.causal and not impl.supports_causal:
        raise AttnbenchError(
            f"{s.impl} with this configuration runs non-causal only (a 2-D grid has no causal order); drop --causal"
        )
    lengths = list(st.seq_lens) if st.kind == "points" else [s.start()]
    if st.kind == "points" and not lengths:
        raise AttnbenchError(f"{s.name}: a points sweep needs seq_lens, e.g. --seq-lens 65536,131072")
    try:
        for n in lengths:
            impl.check_shape(n, st.heads)
    except ConfigError as exc:
        raise AttnbenchError(str(exc)) from None


def verify_cases(plan: Plan) -> list[VerifyCase]:
    """The exact configuration, dtype, device, head layout and causality of each series, at a
    small length where the float64 reference is cheap."""
    cases = []
    for s in plan.series:
        impl = s.build()
        st = s.settings
        # a training series checks its gradients too (sequence-parallel ones run forward only)
        mode = st.mode if s.world_size == 1 and not impls.spec(s.impl).distributed else "fwd"
        cases.append(
            VerifyCase(
                s.impl,
                impl.config(),
                min(st.batch, 2),
                impl.verify_seq_len(),
                st.heads,
                st.head_dim,
                st.causal,
                st.dtype,
                st.device,
                s.world_size,
                mode,
                st.kv_heads,
            )
        )
    unique = {json.dumps(asdict(c), sort_keys=True): c for c in cases}
    return list(unique.values())


@dataclass
class SeriesOutcome:
    series: Series
    verified: bool
    result: SearchResult | None


class SweepRunner(RunSession):
    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        env: dict[str, Any],
        resume: bool = False,
        reporter: Reporter | None = None,
        speedup_reporter=None,
    ) -> None:
        super().__init__(out_dir, env, resume, reporter)
        self.plan = plan
        self._done: dict[tuple[str, int], dict[str, Any]] = {}
        self._kept: list[dict[str, Any]] = []  # verify and max-seq-result rows already written
        self._remeasured = 0
        self.speedups = [self._speedup_runner(sp, speedup_reporter) for sp in plan.speedups]
        self.speedups_unverified: list[str] = []  # speedup runs whose reference check failed

    def _speedup_runner(self, settings, reporter):
        from attnbench.sweeps.speedup import SpeedupRunner

        return SpeedupRunner(settings, self.out_dir, self.env, resume=self.resume, reporter=reporter)

    # --- before anything is written ------------------------------------------------------
    def prepare(self) -> None:
        """What a resumed run holds; read again under the lock (a run that just ended counts)."""
        self._done, self._kept = {}, []
        for r in self.resumed_rows():
            if r.get("kind") in ("max-seq", "points") and "series" in r and "seq_len" in r:
                self._done[(r["series"], r["seq_len"])] = r
            elif r.get("kind") in ("verify", "max-seq-result"):
                self._kept.append(r)

    def reference_checks(self) -> list[dict[str, Any]]:
        """Each configuration against the float64 reference, in a child under the trials'
        memory limit like a trial (in this process only when every series runs in-process)."""
        if not self.plan.verify:
            return []
        cases = verify_cases(self.plan)
        isolate = any(s.settings.isolate for s in self.plan.series) or any(c.device == "cuda" for c in cases)
        limits = [s.settings.memory_limit for s in self.plan.series]
        limit = None if None in limits else max(limits)
        return self.run_checks(cases, isolate=isolate, memory_limit=limit)

    # --- the run --------------------------------------------------------------------------
    def run(self) -> list[SeriesOutcome]:
        """Every reference check (sweeps, then speedup runs), then the sweeps' trials, then the
        speedup runs' trials; a resumed run skips every trial it finds, of every kind."""
        self.prepare()
        for sp in self.speedups:  # before anything is written: each refuses a directory it may not continue
            sp.prepare()
        verify_rows = self.reference_checks()
        speedup_checks = [None if sp.verified else sp.verify() for sp in self.speedups]  # bad input raises here
        with ResultsLock(self.out_dir):  # one run per directory
            self.prepare()  # again under the lock: what a run that just ended wrote counts
            for row in verify_rows:
                self._append_once({**row, "run": self.run_id, "env": self.env}, VERIFY_IDENTITY)
            self.reporter.verify_done(verify_rows)
            checked = [sp.verified or sp.record_verify(rows) for sp, rows in zip(self.speedups, speedup_checks)]
            outcomes = self._run_sweeps(verify_rows)
            for sp, ok in zip(self.speedups, checked):
                if ok:
                    sp.run_cases()
                else:
                    self.speedups_unverified.append(sp.s.impl)
        return outcomes

    def _run_sweeps(self, verify_rows: list[dict[str, Any]]) -> list[SeriesOutcome]:
        # an unsupported shape is not a wrong output: its series runs and its trials say so
        failed = {
            (r["impl"], _config_text(r["config"]), r.get("world_size", 1))
            for r in verify_rows
            if r["status"] not in ("pass", "unsupported")
        }
        outcomes = []
        for i, s in enumerate(self.plan.series):
            self.reporter.series_started(s, i, len(self.plan.series))
            if (s.impl, _config_text(s.build().config()), s.world_size) in failed:
                outcomes.append(SeriesOutcome(s, False, None))
                self.reporter.series_done(s, None)
                continue
            result = self._run_series(s)
            outcomes.append(SeriesOutcome(s, True, result))
            self.reporter.series_done(s, result)
        if self._remeasured:
            self.reporter.note(
                f"{self._remeasured} earlier trial(s) in {self.out_dir} were measured under other limits "
                "or timing settings and were measured again"
            )
        return outcomes

    def _run_series(self, s: Series) -> SearchResult | None:
        if s.settings.kind == "points":
            for n in s.settings.seq_lens:
                self._probe(s, n, "point")
            return None
        result = grow_then_bisect(
            lambda n, phase: self._probe(s, n, phase),
            start=s.start(),
            granularity=s.granularity(),
            max_len=s.settings.max_seq_len,
            resolution=s.settings.resolution,
        )
        self._append_once(
            {
                "kind": "max-seq-result",
                "run": self.run_id,
                "series": self._key(s),
                "label": s.name,
                **_workload_fields(s.workload(result.best or s.start())),
                "seq_len": result.best,
                "first_failure": result.first_failure,
                "stop_status": result.stop_status,
                "stopped_by": result.stopped_by,
                "granularity": s.granularity(),
                **_parallelism(s),
                "resolution": s.settings.resolution,
                "start": s.start(),
                "max_seq_len": s.settings.max_seq_len,
                "trials": len(result.tried),
                "env": self.env,
            },
            RESULT_IDENTITY,
        )
        return result

    def _key(self, s: Series) -> str:
        return series_key(_workload_fields(s.workload(0)), kind=s.settings.kind, **_parallelism(s))

    def _probe(self, s: Series, seq_len: int, phase: str) -> str:
        """One point of the search. A failed search probe is retried once in a fresh process
        before the search accepts it (both attempts are rows): one flaky kill or OOM must not
        set a capacity."""
        row = self._trial(s, seq_len, phase, attempt=1)
        if row["status"] != "ok" and phase in ("grow", "bisect") and row.get("attempt", 1) < 2:
            row = self._trial(s, seq_len, phase, attempt=2)
        return row["status"]

    def _trial(self, s: Series, seq_len: int, phase: str, attempt: int) -> dict[str, Any]:
        key = (self._key(s), seq_len)
        spec = self._spec(s, seq_len)
        earlier = self._done.get(key)
        if earlier is not None and earlier.get("attempt", 1) >= attempt:
            if trial_identity(earlier) == trial_identity(spec_fields(spec, s)):
                self.reporter.trial_done(s, earlier, True)
                return earlier
            self._remeasured += 1
            self.reporter.note(
                f"{s.name} at {seq_len:,}: the earlier trial ran under "
                f"{_identity_text(earlier)}, this run uses {_identity_text(spec_fields(spec, s))}: "
                "measuring again"
            )
        pause_after_trials(len(self._done))
        # a timed point in several fresh processes: the gate's unit is the process
        repeats = s.settings.repeat if s.settings.kind == "points" else 1
        for process in range(repeats):
            row = self._measure(s, spec, seq_len, phase, key, attempt, process if repeats > 1 else None)
            if row["status"] != "ok":
                break
        return row

    def _measure(
        self, s: Series, spec: TrialSpec, seq_len: int, phase: str, key, attempt: int, process: int | None
    ) -> dict[str, Any]:
        self.reporter.trial_started(s, seq_len, phase)
        started, t0 = now_utc(), time.monotonic()
        if s.distributed:  # one process per rank under torchrun, whatever --in-process says
            from attnbench.sweeps import seqpar

            measured = seqpar.run_trial(spec, s.world_size)
        else:
            measured = run_isolated(spec) if s.settings.isolate else execute(spec)
        row = {
            "kind": s.settings.kind,
            "run": self.run_id,
            "trial": uuid.uuid4().hex[:12],
            "series": key[0],
            "label": s.name,
            "phase": phase,
            "attempt": attempt,
            **_workload_fields(s.workload(seq_len)),
            **_parallelism(s),
            **spec_fields(spec, s),
            **({"process": process} if process is not None else {}),
            **measured,
            "started_at": started,
            "duration_s": round(time.monotonic() - t0, 3),
            "env": self.env,
        }
        self.append(row)
        self._done[key] = row
        self.reporter.trial_done(s, row, False)
        return row

    def _spec(self, s: Series, seq_len: int) -> TrialSpec:
        st = s.settings
        return TrialSpec(
            workload=s.workload(seq_len).to_dict(),
            max_trial_seconds=st.max_trial_seconds,
            memory_limit=st.memory_limit,
            timing={
                "warmup": st.warmup,
                "warmup_s": st.warmup_s,
                "min_samples": st.min_samples,
                "max_samples": st.max_samples,
                "target_ms": st.target_ms,
                # sequence-parallel ranks are supervised per phase at the per-call limit
                "budget_s": st.max_trial_seconds if s.distributed else st.timing_budget_s,
            },
            seed=seq_len,
        )

    def _append_once(self, row: dict[str, Any], identity: tuple[str, ...]) -> None:
        """A resumed run does not repeat a reference check or a search result it already has."""
        ident = {k: row.get(k) for k in identity}
        if any(r.get("kind") == row["kind"] and {k: r.get(k) for k in identity} == ident for r in self._kept):
            return
        self._kept.append(row)
        self.append(row)


# What makes two rows the same reference check, or the same search result.
VERIFY_IDENTITY = (
    "impl",
    "config",
    "batch",
    "seq_len",
    "heads",
    "head_dim",
    "causal",
    "dtype",
    "device",
    "world_size",
    "status",
    "kv_heads",
)
RESULT_IDENTITY = ("series", "seq_len", "first_failure", "stop_status", "max_seq_len", "resolution", "start")
# The settings besides the workload that can change a trial's outcome: a row measured under
# other values is not this run's trial.
TRIAL_SETTINGS = ("max_trial_seconds", "memory_limit", "isolate", "timing")


def spec_fields(spec: TrialSpec, s: Series) -> dict[str, Any]:
    return {
        "max_trial_seconds": spec.max_trial_seconds,
        "memory_limit": spec.memory_limit,
        "isolate": s.settings.isolate or s.distributed,
        "timing": spec.timing,
    }


def trial_identity(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in TRIAL_SETTINGS}


def _identity_text(fields: dict[str, Any]) -> str:
    from attnbench.units import format_bytes

    limit = fields.get("memory_limit")
    timing = fields.get("timing")
    return (
        f"memory limit {format_bytes(limit) if limit else 'none'}, max {fields.get('max_trial_seconds')} s per call, "
        f"{'isolated' if fields.get('isolate') else 'in-process'}, timing {timing if timing is not None else 'unrecorded'}"
    )


def _workload_fields(wl) -> dict[str, Any]:
    return wl.to_dict()


def _parallelism(s: Series) -> dict[str, Any]:
    """How the work is spread: a sequence-parallel implementation's ranks, or one device."""
    if s.distributed:
        from attnbench.sweeps.seqpar import STRATEGY

        return {"world_size": s.world_size, "strategy": STRATEGY}
    return {"world_size": 1, "strategy": "single"}
