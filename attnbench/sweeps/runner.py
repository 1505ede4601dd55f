"""Run a plan: check it, verify each configuration against the reference, then run its
trials, appending each row to ``trials.jsonl`` the moment the trial ends.

Nothing is written until the plan has been checked and every configuration has run on the
reference check, so bad input leaves no results file behind. ``resume`` replays the rows
already in the directory instead of running those trials again.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.plan import Plan, Series
from attnbench.reference import VerifyCase
from attnbench.results import now_utc, series_key
from attnbench.runtime.supervise import pause_after_trials
from attnbench.sweeps.search import SearchResult, grow_then_bisect
from attnbench.sweeps.session import Reporter as BaseReporter
from attnbench.sweeps.session import RunSession
from attnbench.sweeps.verification import config_text as _config_text
from attnbench.trial import TrialSpec, execute, run_isolated


class Reporter(BaseReporter, Protocol):
    def series_started(self, series: Series, index: int, total: int) -> None: ...
    def trial_started(self, series: Series, seq_len: int, phase: str) -> None: ...
    def trial_done(self, series: Series, row: dict[str, Any], replayed: bool) -> None: ...
    def series_done(self, series: Series, result: SearchResult | None) -> None: ...


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
                raise AttnbenchError("--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu")
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
    if st.max_trial_seconds <= 0:
        raise AttnbenchError("--max-trial-seconds must be positive")
    if st.timing_budget_s <= 0:
        raise AttnbenchError("--timing-budget must be positive seconds, e.g. --timing-budget 30")
    if st.warmup_s is not None and st.warmup_s < 0:
        raise AttnbenchError("warmup_s must be zero or more seconds, e.g. warmup_s = 1.0")
    if st.repeat < 1:
        raise AttnbenchError("--repeat must be at least 1 (fresh processes per timed point), e.g. --repeat 3")
    if min(st.warmup, st.min_samples) < 0 or st.max_samples < max(1, st.min_samples):
        raise AttnbenchError("warmup and min_samples must be zero or more and max_samples at least min_samples (and 1)")
    impl = s.build()
    if s.distributed:
        from attnbench.sweeps import seqpar

        seqpar.check_world(st.device, s.world_size)
        seqpar.check_modes(s.impl, st.mode, st.causal, impl)
    elif st.causal and not impl.supports_causal:
        raise AttnbenchError(f"{s.impl} with this configuration runs non-causal only (a 2-D grid has no causal order); "
                             "drop --causal")
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
        cases.append(VerifyCase(s.impl, impl.config(), min(st.batch, 2), impl.verify_seq_len(), st.heads,
                                st.head_dim, st.causal, st.dtype, st.device, s.world_size, mode))
    unique = {json.dumps(asdict(c), sort_keys=True): c for c in cases}
    return list(unique.values())


@dataclass
class SeriesOutcome:
    series: Series
    verified: bool
    result: SearchResult | None


class SweepRunner(RunSession):
    def __init__(self, plan: Plan, out_dir: Path, env: dict[str, Any], resume: bool = False,
                 reporter: Reporter | None = None, speedup_reporter=None) -> None:
        super().__init__(out_dir, env, resume, reporter)
        self.plan = plan
        self._done: dict[tuple[str, int], dict[str, Any]] = {}
        self._searched: set[str] = set()  # series whose search result a resumed run already holds
        self.speedups = [self._speedup_runner(sp, speedup_reporter) for sp in plan.speedups]
        self.speedups_unverified: list[str] = []  # speedup runs whose reference check failed

    def _speedup_runner(self, settings, reporter):
        from attnbench.sweeps.speedup import SpeedupRunner

        return SpeedupRunner(settings, self.out_dir, self.env, resume=self.resume, reporter=reporter)

    # --- before anything is written ------------------------------------------------------
    def prepare(self) -> None:
        for r in self.resumed_rows():
            if r.get("kind") in ("max-seq", "points") and "series" in r:
                self._done[(r["series"], r["seq_len"])] = r
            elif r.get("kind") == "max-seq-result":
                self._searched.add(r.get("series"))

    # --- the run --------------------------------------------------------------------------
    def run(self) -> list[SeriesOutcome]:
        """Every reference check (sweeps, then speedup runs), then the sweeps' trials, then the
        speedup runs' trials; a resumed run skips every trial it finds, of every kind."""
        self.prepare()
        for sp in self.speedups:  # before anything is written: each refuses a directory it may not continue
            sp.prepare()
        # each configuration against the float64 reference before any of its trials
        verify_rows = self.run_checks(verify_cases(self.plan)) if self.plan.verify else []
        speedup_checks = [None if sp.verified else sp.verify() for sp in self.speedups]  # bad input raises here
        self.record_checks(verify_rows)
        checked = [sp.verified or sp.record_verify(rows) for sp, rows in zip(self.speedups, speedup_checks)]
        outcomes = self._run_sweeps(verify_rows)
        for sp, ok in zip(self.speedups, checked):
            if ok:
                sp.run_cases()
            else:
                self.speedups_unverified.append(sp.s.impl)
        return outcomes

    def _run_sweeps(self, verify_rows: list[dict[str, Any]]) -> list[SeriesOutcome]:
        failed = {(r["impl"], _config_text(r["config"]), r.get("world_size", 1)) for r in verify_rows if r["status"] != "pass"}
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
        return outcomes

    def _run_series(self, s: Series) -> SearchResult | None:
        if s.settings.kind == "points":
            for n in s.settings.seq_lens:
                self._probe(s, n, "point")
            return None
        result = grow_then_bisect(
            lambda n, phase: self._probe(s, n, phase),
            start=s.start(), granularity=s.granularity(), max_len=s.settings.max_seq_len,
            resolution=s.settings.resolution,
        )
        if self._key(s) in self._searched:  # replayed to the end: its result row is there already
            return result
        self.append({
            "kind": "max-seq-result", "run": self.run_id, "series": self._key(s), "label": s.name,
            **_workload_fields(s.workload(result.best or s.start())), "seq_len": result.best,
            "first_failure": result.first_failure, "stop_status": result.stop_status,
            "stopped_by": result.stopped_by, "granularity": s.granularity(), **_parallelism(s),
            "resolution": s.settings.resolution, "start": s.start(), "max_seq_len": s.settings.max_seq_len,
            "trials": len(result.tried), "env": self.env,
        })
        return result

    def _key(self, s: Series) -> str:
        return series_key(_workload_fields(s.workload(0)), kind=s.settings.kind, **_parallelism(s))

    def _probe(self, s: Series, seq_len: int, phase: str) -> str:
        key = (self._key(s), seq_len)
        if key in self._done:
            row = self._done[key]
            self.reporter.trial_done(s, row, True)
            return row["status"]
        pause_after_trials(len(self._done))
        self.reporter.trial_started(s, seq_len, phase)
        st = s.settings
        spec = TrialSpec(
            workload=s.workload(seq_len).to_dict(), max_trial_seconds=st.max_trial_seconds,
            memory_limit=st.memory_limit,
            timing={"warmup": st.warmup, "warmup_s": st.warmup_s, "min_samples": st.min_samples,
                    "max_samples": st.max_samples, "target_ms": st.target_ms,
                    # sequence-parallel ranks are supervised per phase at the per-call limit
                    "budget_s": st.max_trial_seconds if s.distributed else st.timing_budget_s},
            seed=seq_len,
        )
        # a timed point in several fresh processes: the gate's unit is the process
        repeats = st.repeat if st.kind == "points" else 1
        for process in range(repeats):
            row = self._measure(s, spec, seq_len, phase, key, process if repeats > 1 else None)
            if row["status"] != "ok":
                break
        return row["status"]

    def _measure(self, s: Series, spec: TrialSpec, seq_len: int, phase: str, key, process: int | None) -> dict[str, Any]:
        st = s.settings
        started, t0 = now_utc(), time.monotonic()
        if s.distributed:  # one process per rank under torchrun, whatever --in-process says
            from attnbench.sweeps import seqpar

            measured = seqpar.run_trial(spec, s.world_size)
        else:
            measured = run_isolated(spec) if st.isolate else execute(spec)
        row = {
            "kind": st.kind, "run": self.run_id, "trial": uuid.uuid4().hex[:12], "series": key[0],
            "label": s.name, "phase": phase, **_workload_fields(s.workload(seq_len)),
            **_parallelism(s), "isolate": st.isolate or s.distributed,
            "max_trial_seconds": st.max_trial_seconds, "memory_limit": st.memory_limit,
            **({"process": process} if process is not None else {}),
            **measured, "started_at": started, "duration_s": round(time.monotonic() - t0, 3), "env": self.env,
        }
        self.append(row)
        self._done[key] = row
        self.reporter.trial_done(s, row, False)
        return row


def _workload_fields(wl) -> dict[str, Any]:
    return asdict(wl)


def _parallelism(s: Series) -> dict[str, Any]:
    """How the work is spread: a sequence-parallel implementation's ranks, or one device."""
    if s.distributed:
        from attnbench.sweeps.seqpar import STRATEGY

        return {"world_size": s.world_size, "strategy": STRATEGY}
    return {"world_size": 1, "strategy": "single"}

