"""One trial: build the implementation, allocate inputs, run it once for memory, then time it.

``execute`` runs a trial in this process. ``run_isolated`` runs it in a worker process of
its own (the default; see ``attnbench.runtime``), so an OOM, a crash or allocator
fragmentation cannot change later trials, and a trial over its time limit can be killed;
the process was started (python and torch imported, no CUDA context) while the previous trial
ran. The phases it announces (setup, device, inputs, compile, first-call, warm-call, warm-up,
timing, gpu-timing, accounting, counting) are timed by the parent into the row's ``phase_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.measure import oom
from attnbench.measure.accounting import Pairs
from attnbench.measure.core import MemoryProbe, Timer, measure_step, tensor_peak_bytes
from attnbench.measure.memory import CpuMemoryLimit, NvmlSampler, open_nvml
from attnbench.measure.timing import COLD_CALL_FACTOR, TimingPolicy
from attnbench.results.convert import fill, to_json
from attnbench.results.schema import GpuMemory, Measured, received
from attnbench.runtime.supervise import announce_phase
from attnbench.runtime.worker import PARTIAL, leave_partial, run_in_child
from attnbench.trials import counting
from attnbench.trials.counting import COUNT_LIMIT_S
from attnbench.trials.measured import set_peak, take_accounting, take_measurement, take_pairs
from attnbench.trials.reference import Check, VerifyCase, reference_bytes, run_case
from attnbench.trials.workload import Workload


@dataclass
class TrialSpec:
    workload: dict[str, Any]  # Workload fields
    max_trial_seconds: float = 60.0  # one call longer than this is a time-limit
    memory_limit: int | None = None  # bytes the trial may allocate
    timing: dict[str, Any] = field(default_factory=dict)  # TimingPolicy fields
    seed: int = 0
    pairs: dict[str, Any] | None = None  # pairs counted before at this shape (accounting.Pairs): not again
    count_limit_s: float = COUNT_LIMIT_S  # seconds counting pairs may take, after the measurement

    def policy(self) -> TimingPolicy:
        """The timing plan; its budget is the ``timing_budget_s`` setting where one was given,
        else the per-call limit (callers that set no budget keep their old behaviour)."""
        return TimingPolicy(**{"budget_s": self.max_trial_seconds, **self.timing})


# ---------------------------------------------------------------------------------------
# In-process execution
# ---------------------------------------------------------------------------------------


def execute(
    spec: TrialSpec,
    phase: Callable[..., None] = lambda name, limit_s=None: None,
    leave: Callable[[Measured], None] = lambda m: None,
) -> Measured:
    """Run one trial here; never raises for a failing trial, returns what it measured. Pairs
    counted from declared key sets are counted after the measurement is complete, ``leave``
    given it first (a worker writes it, in case the count is stopped)."""
    wl = Workload(**spec.workload)
    cuda = wl.device == "cuda"
    m = Measured(status="error", message="", times_ms=[])
    impl = None
    phase("setup")
    nvml, nvml_note = open_nvml() if cuda else (None, "")
    m.nvml_note = nvml_note or None
    sampler = NvmlSampler(nvml)
    mem = MemoryProbe([0] if cuda else [])
    try:
        if impls.names_outside_code(wl.impl, wl.config):  # held to a cold call's limit from its import on
            phase("outside", COLD_CALL_FACTOR * spec.max_trial_seconds)
        impl = impls.build(wl.impl, **wl.config)
        m.impl_source = impls.recorded_source(wl.impl)
        impl.check_shape(wl.seq_len, wl.heads)
        timer = Timer(wl.device)
        m.timer = timer.name
        limit = spec.memory_limit
        phase("device")  # on a GPU: the CUDA context
        mem.start(limit)
        with sampler, CpuMemoryLimit(limit if not cuda else None):
            phase("inputs")
            q, k, v = wl.make_inputs(torch.Generator(device=wl.device).manual_seed(spec.seed))
            m.inputs_bytes = mem.in_use()
            step = _step(impl, wl, q, k, v)
            measured = measure_step(
                step,
                spec.policy(),
                timer,
                spec.max_trial_seconds,
                probe=mem,
                sampler=sampler,
                compiles=impl.compiles,
                gpu_timing=cuda,
                phase=phase,
            )
        phase("accounting")
        take_measurement(m, measured)  # statistics outside the memory limit (bootstrap imports numpy.random)
        m.backend = impl.last_backend
        m.kv_layout = impl.last_kv_layout or None  # grouped K/V: shared, or copied to every query head
        mem.freeze()  # a closed form allocates nothing, but nothing after the timed calls is the trial's peak
        del step, q, k, v
        take_accounting(m, impl, wl)  # pairs counted from key sets: by the sweep, outside the trial
    except Exception as exc:  # a failing trial is data, not a crash
        m.status, m.message = oom.classify(exc), oom.one_line(exc)
    fill(m, mem.peaks())
    m.gpus = _per_gpu(sampler, mem)
    set_peak(m, cuda, wl.floor_bytes)
    if m.status == "ok" and impl is not None and impl.counted_pairs:
        _count_pairs(m, impl, wl, spec, phase, leave)
    return m


def _count_pairs(m: Measured, impl, wl: Workload, spec: TrialSpec, phase, leave) -> None:
    """The pairs of a trial whose measurement is complete (its time, its frozen peaks, its memory
    limit lifted): handed from an earlier count at this shape, or counted now under a limit of
    their own (``trials.counting``), after ``leave`` keeps the measurement."""
    if spec.pairs is not None:
        take_pairs(m, Pairs(**spec.pairs), wl)
        return
    leave(m)
    phase("counting", spec.count_limit_s)
    started = time.monotonic()
    take_pairs(m, counting.count(impl, wl.seq_len, wl.heads, wl.causal, spec.count_limit_s), wl)
    m.count_s = round(time.monotonic() - started, 3)


def _step(impl, wl, q, k, v) -> Callable[[], None]:
    if wl.mode == "fwd":

        def forward():
            with torch.no_grad():
                impl(q, k, v, is_causal=wl.causal)

        return forward

    grad_out = torch.randn_like(q)

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        impl(q, k, v, is_causal=wl.causal).backward(grad_out)

    return forward_backward


def _per_gpu(sampler, mem: MemoryProbe) -> list[GpuMemory]:
    """NVML's reading of each GPU, with the allocator's peaks on the trial's own (index 0)."""
    gpus = [GpuMemory(**g) for g in sampler.per_gpu()]
    peaks = mem.peaks()
    for g in gpus:
        if g.index == 0 and mem.cuda:
            g.max_memory_allocated, g.max_memory_reserved = peaks.max_memory_allocated, peaks.max_memory_reserved
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


def run_isolated(spec: TrialSpec) -> Measured:
    """Run the trial in a worker process of its own, started while the previous trial ran;
    returns what it measured (with ``phase_s``), or how a kill or crash ended it."""
    cpu = Workload(**spec.workload).device == "cpu"
    result = run_in_child(
        trial_job,
        {"spec": asdict(spec)},
        spec.max_trial_seconds,
        memory_limit=spec.memory_limit,
        warm=PRELOAD,
        hold_phases=CPU_HELD_PHASES if cpu else (),
        spares=1 if cpu else GPU_SPARES,
    )
    ended = result.pop(PARTIAL, None)  # stopped while it counted pairs: its measurement stands
    m = received(Measured, result, "the trial's worker")
    if ended:
        take_pairs(m, counting.stopped(ended), Workload(**spec.workload))
    return m


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
    ``warm``: trials follow, so the first one's process starts now. One check per case, in order."""
    from attnbench.results.schema import received

    if not cases:
        return []
    limit = COLD_CALL_FACTOR * (call_limit_s or VERIFY_CALL_LIMIT_S)
    result = run_in_child(
        verify_job,
        {"cases": [asdict(c) for c in cases], "memory_limit": memory_limit, "call_limit_s": limit},
        limit,
        memory_limit=memory_limit,
        warm=PRELOAD if warm else False,
    )
    if "checks" not in result:
        raise AttnbenchError(_unchecked(cases, result, memory_limit))
    return [received(Check, check, "the reference check's worker") for check in result["checks"]]


def _unchecked(cases: list[VerifyCase], result: dict[str, Any], memory_limit: int | None) -> str:
    """Why the reference checks did not run, naming the largest: what it is and needs."""
    from attnbench.units import clip_text, format_gib

    big = max(cases, key=reference_bytes)
    why = clip_text(f"{result.get('status')}: {result.get('message')}", 160)
    shape = f"{big.impl} at N={big.seq_len} (B={big.batch}, H={big.heads})"
    if result.get("status") not in ("oom", "host-oom"):
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
    result = run_in_child(contract_job, {"checks": checks, "device": device, "call_limit_s": limit}, limit)
    if "violations" not in result:
        names = ", ".join(dict.fromkeys(n for n, _, _ in checks))
        return [
            f"{names}: the contract check ended before it finished ({result.get('status')}: {result.get('message')})"
        ]
    return result["violations"]


def contract_job(args: dict[str, Any]) -> dict[str, Any]:
    """Worker side of ``run_contract_isolated``."""
    from attnbench.trials.contract import violations

    limit = args["call_limit_s"]

    def phase(name: str) -> None:
        announce_phase(name, limit if name == "verify-call" else None)

    found = [
        f"{name} [{dtype}]: {v}"
        for name, config, dtype in args["checks"]
        for v in violations(name, config, args["device"], dtype, phase=phase)
    ]
    return {"violations": found}


def preload() -> None:
    """What a spare worker does before its trial: every implementation module imported (the
    registry; FlexAttention's brings torch's compiler), no CUDA context, and the CPU's tensor
    count run once (its first use imports torch's compiler, tens of MiB no trial should count)."""
    impls.import_code()
    tensor_peak_bytes(lambda: torch.ones(2) + 1)


PRELOAD = "attnbench.trials.trial:preload"


def trial_job(args: dict[str, Any]) -> dict[str, Any]:
    """Worker side of ``run_isolated``: what the trial measured, as JSON (left early, before its
    pairs are counted)."""
    return to_json(execute(TrialSpec(**args["spec"]), announce_phase, lambda m: leave_partial(to_json(m))))


def verify_job(args: dict[str, Any]) -> dict[str, Any]:
    """Worker side of ``run_verify_isolated``: each case's check as JSON (``to_json``); CPU cases
    under the memory limit, each case's build and call under its time limit (the float64
    reference is attnbench's own: untimed)."""
    from attnbench.results.convert import to_json

    cases = [VerifyCase(**c) for c in args["cases"]]
    on_cpu = all(c.device == "cpu" for c in cases)
    limit = args.get("call_limit_s")

    def phase(name: str) -> None:
        announce_phase(name, limit if name == "verify-call" else None)

    with CpuMemoryLimit(args.get("memory_limit") if on_cpu else None):
        return {"checks": [to_json(run_case(c, phase=phase)) for c in cases]}
