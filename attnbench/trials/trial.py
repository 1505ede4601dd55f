"""One trial: build the implementation, allocate inputs, run it once for memory, then time it.

``execute`` runs a trial in this process: its call placed on one device and measured by the
one measure of every trial (``trials.placed_job.measure``), then its FLOPs accounted.
``run_isolated`` runs it in a worker process of its own (the default; see
``attnbench.runtime``), so an OOM, a crash or allocator fragmentation cannot change later
trials, and a trial over its time limit can be killed; the process was started (python and
torch imported, no CUDA context) while the previous trial ran. The phases it announces
(setup, device, inputs, compile, first-call, warm-call, warm-up, timing, gpu-timing,
accounting, counting) are timed by the parent into the row's ``phase_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.measure import oom
from attnbench.measure.accounting import Pairs
from attnbench.measure.core import tensor_peak_bytes
from attnbench.measure.memory import CpuMemoryLimit, NvmlBackend, open_nvml
from attnbench.measure.timing import COLD_CALL_FACTOR, TimingPolicy
from attnbench.results.schema import GpuMemory, Measured
from attnbench.runtime.jobs import Ended, job
from attnbench.runtime.supervise import announce_phase
from attnbench.runtime.worker import leave_partial, run_in_child
from attnbench.trials import counting
from attnbench.trials.counting import COUNT_LIMIT_S
from attnbench.trials.measured import set_peak, take_accounting, take_pairs, take_rank
from attnbench.trials.placed import PlacedSpec, RankResult
from attnbench.trials.placed_job import measure
from attnbench.trials.reference import Check, VerifyCase, reference_bytes, run_case
from attnbench.trials.strategies import RankContext
from attnbench.trials.strategies.device import on_device
from attnbench.trials.workload import Workload


@dataclass
class TrialSpec:
    workload: Workload  # the call it times
    max_trial_seconds: float = 60.0  # one call longer than this is a time-limit
    memory_limit: int | None = None  # bytes the trial may allocate
    timing: TimingPolicy | None = None  # None: the default plan, its budget the per-call limit
    seed: int = 0
    pairs: Pairs | None = None  # pairs counted before at this shape: not again
    count_limit_s: float = COUNT_LIMIT_S  # seconds counting pairs may take, after the measurement

    def policy(self) -> TimingPolicy:
        """The timing plan: as given, else the default one within the per-call limit."""
        return self.timing or TimingPolicy(budget_s=self.max_trial_seconds)


# ---------------------------------------------------------------------------------------
# In-process execution
# ---------------------------------------------------------------------------------------


def execute(
    spec: TrialSpec,
    phase: Callable[..., None] = lambda name, limit_s=None: None,
    leave: Callable[[Measured], None] = lambda m: None,
) -> Measured:
    """Run one trial here; never raises for a failing trial, returns what it measured. Its
    call is placed on one device (``strategies.device``) and measured as every placed trial is
    (``placed_job.measure``). Pairs counted from declared key sets are counted after the
    measurement is complete, ``leave`` given it first (a worker writes it, in case the count
    is stopped)."""
    wl = spec.workload
    cuda = wl.device == "cuda"
    m = Measured(status="error", message="", times_ms=[])
    phase("setup")
    try:
        impl = _built(wl, spec, phase)
        m.impl_source = impls.recorded_source(wl.impl)
    except Exception as exc:  # a failing trial is data, not a crash
        m.status, m.message, m.gpus = oom.classify(exc), oom.one_line(exc), []
        set_peak(m, cuda, wl.floor_bytes)
        return m
    ran = measure(on_device(impl), _alone(spec), _placed(spec), phase, ranks=None, nvml=_every_gpu(cuda))
    phase("accounting")
    take_rank(m, ran)  # statistics outside the memory limit (bootstrap imports numpy.random)
    m.gpus = _per_gpu(ran, cuda)
    set_peak(m, cuda, wl.floor_bytes)
    if m.status not in ("ok", "time-limit"):  # the step raised: no call to account for
        return m
    try:
        take_accounting(m, impl, wl)  # pairs counted from key sets: by the sweep, outside the trial
    except Exception as exc:
        m.status, m.message = oom.classify(exc), oom.one_line(exc)
        return m
    if m.status == "ok" and impl.counted_pairs:
        _count_pairs(m, impl, wl, spec, phase, leave)
    return m


def _built(wl: Workload, spec: TrialSpec, phase):
    """The implementation, its shape checked: before the trial's memory is watched."""
    if impls.names_outside_code(wl.impl, wl.config):  # held to a cold call's limit from its import on
        phase("outside", COLD_CALL_FACTOR * spec.max_trial_seconds)
    impl = impls.build(wl.impl, **wl.config)
    impl.check_shape(wl.seq_len, wl.heads)
    return impl


def _alone(spec: TrialSpec) -> RankContext:
    return RankContext(workload=spec.workload, module="attention", grad_compression=None, gpus=1, seed=spec.seed)


def _placed(spec: TrialSpec) -> PlacedSpec:
    return PlacedSpec(
        strategy="device",
        strategy_module=on_device.__module__,
        workload=spec.workload,
        seed=spec.seed,
        timing=spec.policy(),
        limit_s=spec.max_trial_seconds,
        memory_limit=spec.memory_limit,
    )


def _every_gpu(cuda: bool) -> NvmlBackend | None:
    """NVML over every GPU of the machine (another process's memory on one shows in the row);
    without it, ``measure`` says why."""
    return open_nvml()[0] if cuda else None


def _count_pairs(m: Measured, impl, wl: Workload, spec: TrialSpec, phase, leave) -> None:
    """The pairs of a trial whose measurement is complete (its time, its peaks, its memory
    limit lifted): handed from an earlier count at this shape, or counted now under a limit of
    their own (``trials.counting``), after ``leave`` keeps the measurement."""
    if spec.pairs is not None:
        take_pairs(m, spec.pairs, wl)
        return
    leave(m)
    phase("counting", spec.count_limit_s)
    started = time.monotonic()
    take_pairs(m, counting.count(impl, wl.seq_len, wl.heads, wl.causal, spec.count_limit_s), wl)
    m.count_s = round(time.monotonic() - started, 3)


def _per_gpu(ran: RankResult, cuda: bool) -> list[GpuMemory]:
    """NVML's reading of each GPU, with the allocator's peaks on the trial's own (index 0)."""
    gpus = list(ran.nvml or [])
    for g in gpus:
        if g.index == 0 and cuda:
            g.max_memory_allocated, g.max_memory_reserved = ran.max_memory_allocated, ran.max_memory_reserved
    return gpus


# ---------------------------------------------------------------------------------------
# Isolated execution: one fresh process per trial
# ---------------------------------------------------------------------------------------


# Phases of a CPU trial during which the spare worker (the next trial's, importing torch) is
# stopped: on a machine of few cores its imports would share the CPU with the timed calls and
# the warm call that decides the time limit (the cold first call and the warm-up decide
# nothing a slower call could make wrong). On a GPU the measured work is the device's, and
# the host has cores to spare.
CPU_HELD_PHASES = ("warm-call", "timing")
# Spare workers ahead of a GPU trial: an import of torch can take longer than a short trial
# (6-7 s on some GPU hosts), so the next two are started, each with two trials' time to get ready.
GPU_SPARES = 2


def spares_ahead(device: str) -> int:
    """Worker processes a trial on ``device`` keeps started ahead of it."""
    return 1 if device == "cpu" else GPU_SPARES


def run_isolated(spec: TrialSpec) -> Measured:
    """Run the trial in a worker process of its own, started while the previous trial ran;
    returns what it measured (with ``phase_s``), or how a kill or crash ended it."""
    cpu = spec.workload.device == "cpu"
    ran = run_in_child(
        trial_job,
        spec,
        spec.max_trial_seconds,
        memory_limit=spec.memory_limit,
        warm=PRELOAD,
        hold_phases=CPU_HELD_PHASES if cpu else (),
        spares=spares_ahead(spec.workload.device),
    )
    m = ran.result or ended_trial(ran.ended)
    if ran.partial:  # stopped while it counted pairs: its measurement stands
        take_pairs(m, counting.stopped(ran.ended.message or ran.ended.status), spec.workload)
    m.phase_s = ran.phase_s
    return m


def ended_trial(ended: Ended) -> Measured:
    """A trial whose process ended before it measured anything: how it ended."""
    return Measured(status=ended.status, message=ended.message, times_ms=[])


# The per-call limit of a reference check's calls where the command names none: a trial's default.
VERIFY_CALL_LIMIT_S = 60.0


def run_verify_isolated(
    cases: list[VerifyCase],
    memory_limit: int | None = None,
    call_limit_s: float | None = None,
    warm: bool = False,
) -> list[Check]:
    """Reference checks in a worker process, like a trial: inputs and the float64 reference
    never live in the calling process (nor CUDA), and the trial's memory and time limits apply
    (each case's build and call: a cold call's limit, COLD_CALL_FACTOR x ``call_limit_s``).
    ``warm``: trials follow, so their first processes start now (as many as a trial keeps ahead
    on the device: on a GPU the second trial's import would otherwise start with the first).
    One check per case, in order."""
    if not cases:
        return []
    limit = COLD_CALL_FACTOR * (call_limit_s or VERIFY_CALL_LIMIT_S)
    ran = run_in_child(
        verify_job,
        VerifySpec(cases, memory_limit, limit),
        limit,
        memory_limit=memory_limit,
        warm=PRELOAD if warm else False,
        spares=max(spares_ahead(c.device) for c in cases),
    )
    if ran.result is None:
        raise AttnbenchError(_unchecked(cases, ran.ended, memory_limit))
    return ran.result.checks


def _unchecked(cases: list[VerifyCase], ended: Ended, memory_limit: int | None) -> str:
    """Why the reference checks did not run, naming the largest: what it is and needs."""
    from attnbench.units import clip_text, format_gib

    big = max(cases, key=reference_bytes)
    why = clip_text(f"{ended.status}: {ended.message}", 160)
    shape = f"{big.impl} at N={big.seq_len} (B={big.batch}, H={big.heads})"
    if ended.status not in ("oom", "host-oom"):
        return f"the reference check could not run ({why}); its largest case is {shape}"
    limit = f" under --memory-limit {format_gib(memory_limit)}" if memory_limit else ""
    return (
        f"the reference check ran out of memory{limit}: its largest case, {shape}, holds about "
        f"{format_gib(reference_bytes(big))} in its float64 reference; raise --memory-limit above that "
        f"or choose a smaller configuration ({why})"
    )


def run_contract_isolated(checks: list[tuple[str, dict[str, Any], str]], device: str) -> list[str]:
    """The implementation contract (``attnbench.trials.contract``) of each (name, configuration,
    dtype) on ``device``, checked in a worker process, each call under a cold call's limit:
    one line per violation, the check's own end (a hang, an exit) included."""
    if not checks:
        return []
    limit = COLD_CALL_FACTOR * VERIFY_CALL_LIMIT_S
    cases = [ContractCase(name, config, dtype) for name, config, dtype in checks]
    ran = run_in_child(contract_job, ContractSpec(cases, device, limit), limit)
    if ran.result is None:
        names = ", ".join(dict.fromkeys(n for n, _, _ in checks))
        return [f"{names}: the contract check ended before it finished ({ran.ended.status}: {ran.ended.message})"]
    return ran.result.violations


@dataclass
class ContractCase:
    name: str
    config: dict[str, Any]
    dtype: str


@dataclass
class ContractSpec:
    checks: list[ContractCase]
    device: str
    call_limit_s: float


@dataclass
class Violations:
    violations: list[str]  # one line each, naming the implementation and dtype


@job
def contract_job(spec: ContractSpec) -> Violations:
    """Worker side of ``run_contract_isolated``."""
    from attnbench.trials.contract import violations

    def phase(name: str) -> None:
        announce_phase(name, spec.call_limit_s if name == "verify-call" else None)

    found = [
        f"{c.name} [{c.dtype}]: {v}"
        for c in spec.checks
        for v in violations(c.name, c.config, spec.device, c.dtype, phase=phase)
    ]
    return Violations(found)


def preload() -> None:
    """What a spare worker does before its trial: every implementation module imported (the
    registry; FlexAttention's brings torch's compiler), no CUDA context, and the CPU's tensor
    count run once (its first use imports torch's compiler, tens of MiB no trial should count)."""
    impls.import_code()
    tensor_peak_bytes(lambda: torch.ones(2) + 1)


PRELOAD = "attnbench.trials.trial:preload"


@job
def trial_job(spec: TrialSpec) -> Measured:
    """Worker side of ``run_isolated``: what the trial measured (left early, before its pairs
    are counted)."""
    return execute(spec, announce_phase, leave_partial)


@dataclass
class VerifySpec:
    cases: list[VerifyCase]
    memory_limit: int | None = None  # bytes, on the CPU
    call_limit_s: float | None = None  # each case's build and call


@dataclass
class Checks:
    checks: list[Check]  # one per case, in order


@job
def verify_job(spec: VerifySpec) -> Checks:
    """Worker side of ``run_verify_isolated``: each case's check; CPU cases under the memory
    limit, each case's build and call under its time limit (the float64 reference is
    attnbench's own: untimed)."""
    on_cpu = all(c.device == "cpu" for c in spec.cases)

    def phase(name: str) -> None:
        announce_phase(name, spec.call_limit_s if name == "verify-call" else None)

    with CpuMemoryLimit(spec.memory_limit if on_cpu else None):
        return Checks([run_case(c, phase=phase) for c in spec.cases])
