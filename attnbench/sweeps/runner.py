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
from attnbench.results import ResultsWriter, clean_floats, now_utc, rows_to_resume, series_key
from attnbench.sweeps.search import SearchResult, grow_then_bisect
from attnbench.trial import TrialSpec, execute, run_isolated, run_verify_isolated


class Reporter(Protocol):
    def verify_done(self, rows: list[dict[str, Any]]) -> None: ...
    def series_started(self, series: Series, index: int, total: int) -> None: ...
    def trial_started(self, series: Series, seq_len: int, phase: str) -> None: ...
    def trial_done(self, series: Series, row: dict[str, Any], replayed: bool) -> None: ...
    def series_done(self, series: Series, result: SearchResult | None) -> None: ...


class SilentReporter:
    def __getattr__(self, name):
        return lambda *a, **k: None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(plan: Plan) -> Plan:
    """Resolve ``device = auto`` and check every series before anything runs."""
    have_cuda = None
    resolved = []
    for s in plan.series:
        device = s.settings.device
        if device in ("auto", "cuda"):
            have_cuda = cuda_available() if have_cuda is None else have_cuda
            if device == "cuda" and not have_cuda:
                raise AttnbenchError("--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu")
            device = "cuda" if have_cuda else "cpu"
        s = replace(s, settings=replace(s.settings, device=device))
        check_series(s)
        resolved.append(s)
    return replace(plan, series=tuple(resolved))


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
        cases.append(VerifyCase(s.impl, impl.config(), min(st.batch, 2), impl.verify_seq_len(), st.heads,
                                st.head_dim, st.causal, st.dtype, st.device, s.world_size))
    unique = {json.dumps(asdict(c), sort_keys=True): c for c in cases}
    return list(unique.values())


@dataclass
class SeriesOutcome:
    series: Series
    verified: bool
    result: SearchResult | None


class SweepRunner:
    def __init__(self, plan: Plan, out_dir: Path, env: dict[str, Any], resume: bool = False,
                 reporter: Reporter | None = None) -> None:
        self.plan = plan
        self.out_dir = Path(out_dir)
        self.env = env
        self.resume = resume
        self.reporter = reporter or SilentReporter()
        self.writer = ResultsWriter(self.out_dir)
        self.run_id = self.out_dir.name
        self._done: dict[tuple[str, int], dict[str, Any]] = {}

    # --- before anything is written ------------------------------------------------------
    def prepare(self) -> None:
        for r in rows_to_resume(self.out_dir, self.resume, self.env["machine"]):
            if r.get("kind") in ("max-seq", "points") and "series" in r:
                self._done[(r["series"], r["seq_len"])] = r

    def verify(self) -> list[dict[str, Any]]:
        """Check each configuration against the float64 reference; a case that cannot run
        at all is bad input (wrong dtype for a backend, say) and stops here."""
        if not self.plan.verify:
            return []
        cases = verify_cases(self.plan)
        distributed = [c for c in cases if impls.spec(c.impl).distributed]
        cases = [c for c in cases if not impls.spec(c.impl).distributed]
        on_cuda = any(c.device == "cuda" for c in cases)
        # On the GPU in a child, so this process never holds a CUDA context during trials.
        rows = run_verify_isolated(cases) if on_cuda else [_run_case(c) for c in cases]
        if distributed:  # across ranks under torchrun, against the reference and the single-device output
            from attnbench.sweeps import seqpar

            rows += seqpar.verify(distributed)
        for row in rows:
            if row["status"] == "error":
                raise AttnbenchError(
                    f"{row['impl']} {_config_text(row['config'])} cannot run {row['dtype']} on {row['device']}: "
                    f"{row['message']}; choose another --dtype, backend or configuration"
                )
        return rows

    # --- the run --------------------------------------------------------------------------
    def run(self) -> list[SeriesOutcome]:
        self.prepare()
        verify_rows = self.verify()
        for row in verify_rows:
            self._append({**row, "run": self.run_id, "env": self.env})
        self.reporter.verify_done(verify_rows)
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
        self._append({
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
        self._append(row)
        self._done[key] = row
        self.reporter.trial_done(s, row, False)
        return row

    def _append(self, row: dict[str, Any]) -> None:
        self.writer.append(clean_floats(row))


def _workload_fields(wl) -> dict[str, Any]:
    return asdict(wl)


def _parallelism(s: Series) -> dict[str, Any]:
    """How the work is spread: a sequence-parallel implementation's ranks, or one device."""
    if s.distributed:
        from attnbench.sweeps.seqpar import STRATEGY

        return {"world_size": s.world_size, "strategy": STRATEGY}
    return {"world_size": 1, "strategy": "single"}


def _config_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def _run_case(case: VerifyCase) -> dict[str, Any]:
    from attnbench.reference import run_case

    return run_case(case)
