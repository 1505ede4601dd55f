"""One trial: build the implementation, allocate inputs, run it once for memory, then time it.

``execute`` runs a trial in this process. ``run_isolated`` runs it in a fresh worker process
(the default; see ``attnbench.runtime``), so an OOM, a crash or allocator fragmentation cannot
change later trials, and a trial over its time limit can be killed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from attnbench import impls
from attnbench.measure import oom
from attnbench.measure.accounting import accounting
from attnbench.measure.memory import CpuMemoryLimit, NvmlSampler, open_nvml
from attnbench.measure.probe import MemoryProbe
from attnbench.measure.timing import Timer, TimingPolicy, collect, summarize
from attnbench.reference import VerifyCase, run_case
from attnbench.runtime.supervise import STARTUP_ALLOWANCE_S, announce_phase
from attnbench.runtime.worker import run_in_child
from attnbench.workload import Workload


@dataclass
class TrialSpec:
    workload: dict[str, Any]           # Workload fields
    max_trial_seconds: float = 60.0    # one call longer than this is a time-limit
    memory_limit: int | None = None    # bytes the trial may allocate
    timing: dict[str, Any] = field(default_factory=dict)  # TimingPolicy fields
    seed: int = 0

    def policy(self) -> TimingPolicy:
        return TimingPolicy(**{**self.timing, "budget_s": self.max_trial_seconds})


# ---------------------------------------------------------------------------------------
# In-process execution
# ---------------------------------------------------------------------------------------

def execute(spec: TrialSpec, phase: Callable[[str], None] = lambda name: None) -> dict[str, Any]:
    """Run one trial here; never raises for a failing trial, returns its row fields."""
    wl = Workload(**spec.workload)
    cuda = wl.device == "cuda"
    row: dict[str, Any] = {"status": "error", "message": "", "times_ms": []}
    nvml, nvml_note = open_nvml() if cuda else (None, "")
    if nvml_note:
        row["nvml_note"] = nvml_note
    sampler = NvmlSampler(nvml)
    mem = MemoryProbe(cuda)
    try:
        impl = impls.build(wl.impl, **wl.config)
        impl.check_shape(wl.seq_len, wl.heads)
        timer = Timer(wl.device)
        row["timer"] = timer.name
        limit = spec.memory_limit
        mem.start(limit)
        with sampler, CpuMemoryLimit(limit if not cuda else None):
            q, k, v = wl.make_inputs(torch.Generator(device=wl.device).manual_seed(spec.seed))
            row["inputs_bytes"] = mem.in_use()
            step = _step(impl, wl, q, k, v)
            if impl.compiles:
                # a compiled kernel's first call pays for compilation: record it apart
                phase("compile")
                row["compile_ms"] = timer(step)
            phase("first-call")
            first_ms = timer(step)
            row["first_call_ms"] = first_ms
            if first_ms > spec.max_trial_seconds * 1e3:
                row.update(status="time-limit", message=f"one call took {first_ms / 1e3:.1f} s > {spec.max_trial_seconds:g} s")
            else:
                phase("timing")
                row["times_ms"] = collect(step, timer, first_ms, spec.policy())
                row.update(status="ok")
        row["backend"] = impl.last_backend
        row.update(summarize(row["times_ms"]))
        row.update(accounting(impl, wl, row.get("time_ms")))
    except Exception as exc:  # a failing trial is data, not a crash
        row.update(status=oom.classify(exc), message=oom.one_line(exc))
    row.update(mem.peaks())
    row["gpus"] = _per_gpu(sampler, mem)
    row["floor_bytes"] = wl.floor_bytes
    peak = row.get("max_memory_allocated") if cuda else row.get("cpu_peak_rss_delta")
    row["peak_bytes"] = peak
    row["peak_counter"] = "cuda.max_memory_allocated" if cuda else "cpu.peak_rss_delta"
    row["peak_over_floor"] = peak / wl.floor_bytes if peak else None
    return row


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


def _per_gpu(sampler, mem: MemoryProbe) -> list[dict[str, Any]]:
    gpus = sampler.per_gpu()
    peaks = mem.peaks() if mem.cuda else {}
    for g in gpus:
        if g["index"] == 0 and peaks:
            g["max_memory_allocated"] = peaks["max_memory_allocated"]
            g["max_memory_reserved"] = peaks["max_memory_reserved"]
    return gpus


# ---------------------------------------------------------------------------------------
# Isolated execution: one fresh process per trial
# ---------------------------------------------------------------------------------------

def run_isolated(spec: TrialSpec) -> dict[str, Any]:
    """Run the trial in a worker process; returns its row fields, classifying a kill or crash."""
    return run_in_child(trial_job, {"spec": asdict(spec)}, spec.max_trial_seconds)


def run_verify_isolated(cases: list[VerifyCase]) -> list[dict[str, Any]]:
    """Reference checks in a worker process (keeps CUDA out of the calling process)."""
    result = run_in_child(verify_job, {"cases": [asdict(c) for c in cases]}, STARTUP_ALLOWANCE_S)
    if "rows" not in result:
        raise RuntimeError(f"reference check process failed: {result.get('message')}")
    return result["rows"]


def trial_job(args: dict[str, Any]) -> dict[str, Any]:
    """Worker side of ``run_isolated``."""
    return execute(TrialSpec(**args["spec"]), announce_phase)


def verify_job(args: dict[str, Any]) -> dict[str, Any]:
    """Worker side of ``run_verify_isolated``."""
    return {"rows": [run_case(VerifyCase(**c)) for c in args["cases"]]}
