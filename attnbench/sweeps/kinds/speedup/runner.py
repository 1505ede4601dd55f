"""Does a second GPU help? One implementation at (sequence length x batch) cases, on one GPU
and spread over P GPUs by each strategy (``attnbench.trials.strategies``), every trial in
fresh processes under ``attnbench.runtime.distributed.launch``, one row per (case, strategy).

Per case, ``single`` runs first and leaves its output in a scratch directory; every other
strategy's output is compared with it (relative L2 error within the dtype's tolerance, or
the row fails). Speedup and scaling efficiency are not stored: tables compute them from the
rows (``attnbench.report.tables.speedup``), matching each row to the single row of its run.

A speedup series is a plan's series of kind ``speedup`` (its settings: ``cases``,
``strategies``, ``module``, ``grad_compression``, ``gpus``); ``attnbench.sweeps.kinds.speedup.kind``
plans and runs it through ``SpeedupRunner``. Its trials run on the one executor of multi-rank
trials, ``attnbench.trials.placed``.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.measure.timing import TimingPolicy
from attnbench.plan import Case, Series
from attnbench.plan.strategies import BY_NAME, speedup_names
from attnbench.results import now_utc
from attnbench.results.schema import Speedup, StepMeasured, digest, join, workload_identity
from attnbench.runtime import nodes
from attnbench.runtime.jobs import RankEnded
from attnbench.runtime.worker import owned_temp_dir
from attnbench.sweeps.kinds.base import check_call, check_fits_device, check_runs_on
from attnbench.sweeps.kinds.speedup.rows import gpus_of, merge_ranks, notes_for
from attnbench.sweeps.session import Reporter as BaseReporter
from attnbench.sweeps.session import SilentReporter
from attnbench.trials import strategies
from attnbench.trials.placed import OutputCheck, PlacedSpec
from attnbench.trials.placed import run as placed_trial
from attnbench.trials.strategies import GRAD_COMPRESSION, MODULES, Strategy
from attnbench.trials.workload import Workload, check_workload_fields
from attnbench.units import brief

KIND = "speedup"


def check_strategies(names: tuple[str, ...]) -> None:
    """Each name a strategy ``--strategy`` takes (``ring`` is bench's and max-seq's ``--gpus``)."""
    for n in names:
        declared = BY_NAME.get(n)
        choices = ", ".join(speedup_names())
        if declared is not None and not declared.speedup and n != "single":
            raise AttnbenchError(
                f"--strategy {n} ({declared.summary}) runs as bench or max-seq --gpus N; speedup takes {choices}"
            )
        if n not in strategies.STRATEGIES.entries():
            raise AttnbenchError(f"unknown strategy {n!r}: choose from {choices}")


def order(s: Series) -> tuple[str, ...]:
    return ("single", *s.settings.speedup.strategies)


def workload(s: Series, case: Case) -> Workload:
    return s.workload(case.seq_len, case.batch)


def timing(s: Series) -> TimingPolicy:
    """The timing plan of a speedup trial (its budget is the per-call limit): settings the
    ranks receive in their spec, not a row's fields."""
    # torch's own thread count: the thread strategy spreads the batch over threads itself
    return s.settings.timing(s.settings.max_trial_seconds)


def check_settings(s: Series, cuda_devices: int, cases_given: bool = True) -> Series:
    """Every bad input, before anything runs or is written; returns the settings with the
    implementation's configuration filled in. A case a strategy cannot run (mp and batch 1) is
    bad input when the user named the cases; with the seeds' default cases that strategy
    records the case as skipped, with its reason, and the rest of the table still runs."""
    check_workload_fields(s.settings.dtype, s.settings.mode, s.settings.device)
    check_runs_on(s)
    for key, value in (("gpus", gpus_of(s)), ("heads", s.settings.heads), ("head_dim", s.settings.head_dim)):
        if value < 1:
            raise AttnbenchError(f"--{key.replace('_', '-')} must be at least 1")
    check_strategies(s.settings.speedup.strategies)
    if not (math.isfinite(s.settings.max_trial_seconds) and s.settings.max_trial_seconds > 0):
        raise AttnbenchError("--max-trial-seconds must be a positive number of seconds")
    cores = (os.cpu_count() or 1) * nodes.current().count  # each node as this one
    if s.settings.device == "cpu" and gpus_of(s) > cores:
        raise AttnbenchError(
            f"--gpus {gpus_of(s)} on the CPU starts {gpus_of(s)} processes but {cores} cores run them: "
            f"use --gpus {cores} or fewer"
        )
    if s.settings.device == "cuda" and gpus_of(s) > cuda_devices:
        raise AttnbenchError(
            f"--gpus {gpus_of(s)} but this machine has {cuda_devices} CUDA GPU{'s' if cuda_devices != 1 else ''}: "
            f"ask for at most {cuda_devices}"
        )
    if s.settings.speedup.module not in MODULES:
        raise AttnbenchError(f"unknown module {brief(s.settings.speedup.module)}: choose {' or '.join(MODULES)}")
    _check_compression(s)
    try:
        config = impls.normalize_config(s.impl, s.config)
        impl = impls.build(s.impl, **config)
        for case in s.settings.speedup.cases:
            impl.check_shape(case.seq_len, s.settings.heads)
    except ConfigError as exc:
        raise AttnbenchError(str(exc)) from None
    check_call(s, impl)
    for case in s.settings.speedup.cases:
        check_fits_device(s, case.seq_len, case.batch)
    s = replace(s, config=impl.config())
    if cases_given:
        for name in s.settings.speedup.strategies:
            for case in s.settings.speedup.cases:
                strategies.get(name).check(workload(s, case), gpus_of(s))
    return s


def refusal(s: Series, case: Case, strategy: Strategy) -> str | None:
    """Why ``strategy`` cannot run ``case`` on this device, or None."""
    reason = strategy.skip(s.settings.device)
    if reason:
        return reason
    try:
        strategy.check(workload(s, case), gpus_of(s))
    except AttnbenchError as exc:
        return str(exc)
    return None


def _check_compression(s: Series) -> None:
    if s.settings.speedup.grad_compression is None:
        return
    if s.settings.speedup.grad_compression not in GRAD_COMPRESSION:
        raise AttnbenchError(
            f"unknown --grad-compression {s.settings.speedup.grad_compression!r}: choose {' or '.join(GRAD_COMPRESSION)}"
        )
    if (
        s.settings.speedup.module != "multihead"
        or s.settings.mode != "fwd_bwd"
        or "mp" not in s.settings.speedup.strategies
    ):
        raise AttnbenchError(
            "--grad-compression compresses DistributedDataParallel's gradient all-reduce: "
            "use it with --module multihead --mode fwd_bwd --strategy mp"
        )
    if s.settings.speedup.grad_compression == "bf16" and s.settings.device != "cuda":
        raise AttnbenchError(
            "bf16 gradient compression needs CUDA and NCCL (torch's hook refuses gloo): "
            "use --grad-compression fp16 on the CPU"
        )


def trial_key(row: Mapping[str, Any]) -> str:
    """The ``key`` a speedup row stores, from a planned trial's or a row's fields by name: the
    workload's identity and the module the strategy ran (resume skips a trial it finds)."""
    return digest(
        {**workload_identity(row), "module": row.get("module"), "grad_compression": row.get("grad_compression")}, 16
    )


@dataclass(frozen=True, kw_only=True)
class Planned(Workload):
    """One trial as planned: the workload, the case and how a strategy spreads it. Everything
    its row holds that is known before it runs, beside the run; what resume finds it by."""

    case: str  # the case's label
    strategy: str
    world_size: int  # GPUs the strategy spans
    module: str  # the model wrapped around attention
    grad_compression: str | None  # mp only
    max_trial_seconds: float

    @property
    def key(self) -> str:
        return trial_key(vars(self))


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


class Reporter(BaseReporter, Protocol):
    def trial_running(self, case: Case, strategy: str) -> AbstractContextManager: ...
    def trial_done(self, row: Speedup, replayed: bool) -> None: ...


Launcher = Callable[..., list[RankEnded]]


class SpeedupRunner:
    """The cases of one speedup series, every strategy, on behalf of a sweep runner (whose
    results file, environment and resumed rows it shares): a resumed run skips every trial
    it finds."""

    def __init__(
        self, series: Series, session, reporter: Reporter | None = None, launcher: Launcher | None = None
    ) -> None:
        from attnbench.runtime.distributed import launch

        self.s = series
        self.session = session
        self.reporter = reporter or SilentReporter()
        self.launch = launcher or launch
        rows = session.resumed
        self.done: dict[str, Speedup] = {r.key: r for r in rows if isinstance(r, Speedup)}
        self.run_id = next((r.run for r in rows if isinstance(r, Speedup)), session.run_id)

    def run_cases(self) -> None:
        for case in self.s.settings.speedup.cases:
            with owned_temp_dir("speedup") as scratch:
                self._run_case(case, Path(scratch))

    def _run_case(self, case: Case, reference: Path) -> None:
        have_reference = False
        for name in order(self.s):
            strategy = strategies.get(name)
            planned = self._planned(case, strategy)
            if planned.key in self.done:
                self.reporter.trial_done(self.done[planned.key], True)
                continue
            reason = refusal(self.s, case, strategy)
            if reason:
                skipped = StepMeasured(status="skipped", message=reason, times_ms=[], gpus=[])
                self._finish(self._row(planned, skipped, time.monotonic(), now_utc(), note=reason))
                continue
            started, t0 = now_utc(), time.monotonic()
            with self.reporter.trial_running(case, name):
                if name != "single" and not have_reference:
                    have_reference = self._replay_reference(case, reference)
                role = "reference" if name == "single" else "measure"
                # across nodes the single output stays on node 0's disk: the other nodes make their own
                remake = have_reference and nodes.current().multi and strategy.processes(gpus_of(self.s)) > 1
                ended = self._launch(case, strategy, reference, role, remake)
            measured = merge_ranks(ended, self.s, case, strategy)
            if name == "single":
                have_reference = measured.status == "ok"
            elif not have_reference and measured.status == "ok":
                single = self.done.get(self._planned(case, strategies.get("single")).key)
                measured.output_message = (
                    f"no single-GPU output to compare with (single: {single.status if single else 'not run'})"
                )
            row = self._row(planned, measured, t0, started)
            self._finish(replace(row, note=notes_for(row, strategy)))

    def _replay_reference(self, case: Case, reference: Path) -> bool:
        """A resumed run lost the single output with its scratch directory: compute it again
        (untimed) if the single trial succeeded."""
        single = strategies.get("single")
        row = self.done.get(self._planned(case, single).key)
        if not row or row.status != "ok":
            return False
        ended = self._launch(case, single, reference, "reference-only")
        return all(r.status == "ok" for r in ended)

    def _launch(
        self, case: Case, strategy: Strategy, reference: Path, role: str, remake: bool = False
    ) -> list[RankEnded]:
        s = self.s
        spec = PlacedSpec(
            strategy=strategy.name,
            strategy_module=strategy.module_name,
            workload=workload(s, case),
            seed=case.seq_len * 131 + case.batch,
            timing=timing(s),
            limit_s=s.settings.max_trial_seconds,
            module=s.settings.speedup.module,
            gpus=gpus_of(s),
            grad_compression=s.settings.speedup.grad_compression if strategy.name == "mp" else None,
            output=OutputCheck(reference_dir=str(reference), role=role, remake_reference=remake),
        )
        return placed_trial(spec, s.settings.device, self.launch, phase_limit_s=s.settings.max_trial_seconds)

    def _planned(self, case: Case, strategy: Strategy) -> Planned:
        s = self.s
        return Planned(
            **vars(workload(s, case)),
            case=case.label,
            strategy=strategy.name,
            world_size=strategy.world_size(gpus_of(s)),
            module=s.settings.speedup.module,
            grad_compression=s.settings.speedup.grad_compression if strategy.name == "mp" else None,
            max_trial_seconds=s.settings.max_trial_seconds,
        )

    def _row(
        self, planned: Planned, measured: StepMeasured, t0: float, started: str, note: str | None = None
    ) -> Speedup:
        """The trial's row from its parts and when it ran; ``note`` is set once the row can say it."""
        when = {"trial": uuid.uuid4().hex[:12], "started_at": started, "duration_s": round(time.monotonic() - t0, 3)}
        return join(
            Speedup,
            planned,
            measured,
            kind=KIND,
            run=self.run_id,
            key=planned.key,
            note=note,
            **when,
            env=self.session.env,
        )

    def _finish(self, row: Speedup) -> None:
        """The trial's row appended, and done for a resumed run."""
        self.session.append(row)
        self.done[row.key] = row
        self.reporter.trial_done(row, False)
