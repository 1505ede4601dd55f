"""What every rank of a placed trial does, whatever the strategy: prepare its share, time it,
read its memory, and check its output where the trial has one to check against.

Runs under ``attnbench.runtime.distributed.launch`` as the rank job ``rank_job``, one process
per rank as the strategy says; ``measure`` is the whole of it, and also measures a trial alone
(``trials.trial``: its call placed on one device), so every row's time and memory come from here.

- Time and memory: through the measurement core (``attnbench.measure.core``), all ranks
  agreeing on the plan; before each call every rank waits at a barrier, so call i starts
  together on all ranks and the parent takes the slowest rank's time for it. Each rank reads
  NVML and the allocator peaks of the devices it uses, and on the CPU its resident set, under
  the trial's memory limit.
- Output (speedup trials): the single run saves its output per batch element; any other
  strategy compares its share with it, in float32, and returns the squared error and
  reference norms.
"""

from __future__ import annotations

import importlib
import shutil
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnbench.measure import oom
from attnbench.measure.core import Measurement, MemoryProbe, Ranks, Timer, measure_step
from attnbench.measure.memory import CpuMemoryLimit, NvmlBackend, NvmlSampler, gpus_nvml
from attnbench.results.convert import fill
from attnbench.results.schema import GpuMemory
from attnbench.runtime.jobs import Place, job
from attnbench.trials import strategies
from attnbench.trials.measured import MEASUREMENT_FIELDS
from attnbench.trials.placed import Compared, OutputCheck, PlacedSpec, RankResult
from attnbench.trials.ranks import ALONE, agreement, phase_reporter
from attnbench.trials.strategies import Prepared, RankContext, Strategy

# float32 elements compared at once, so the check never holds a second full output
COMPARE_CHUNK = 1 << 24


@job
def rank_job(spec: PlacedSpec, place: Place) -> RankResult:
    """This rank's share of ``spec.strategy``'s trial."""
    importlib.import_module(spec.strategy_module)  # registers strategies defined elsewhere
    strategy = strategies.get(spec.strategy)
    ctx = context(spec, place.rank, place.world, place.local_rank)
    out = spec.output
    remake = out is not None and out.remake_reference
    made = single_output_here(spec, out, ctx) if remake and ctx.local_rank == 0 else None
    try:
        result = measure(strategy, ctx, spec, phase_reporter(place), agreement(place))
        if remake:
            agreement(place).barrier()  # every rank of this node compared with it before it goes
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    return result


def context(spec: PlacedSpec, rank: int = 0, world: int = 1, local_rank: int = 0) -> RankContext:
    return RankContext(
        workload=spec.workload,
        module=spec.module,
        grad_compression=spec.grad_compression,
        gpus=spec.gpus,
        rank=rank,
        world=world,
        local_rank=local_rank,
        seed=spec.seed,
        fail_rank=spec.fail_rank,
    )


def single_output_here(spec: PlacedSpec, out: OutputCheck, ctx: RankContext) -> Path | None:
    """On a node other than the single run's, before its ranks time anything: the single-GPU
    output they compare with, made here by the single strategy from the same seeded inputs
    (the single run's own stays on its node's disk). The directory it made, or None where
    the single run's output is already here."""
    ref = Path(out.reference_dir)
    if ref.exists():
        return None
    single = context(replace(spec, fail_rank=None), local_rank=ctx.local_rank)
    prepared = strategies.get("single").prepare(single)
    save_reference(prepared, ref, single)
    del prepared
    if ctx.cuda:
        torch.cuda.empty_cache()
    return ref


def measure(
    strategy: Strategy,
    ctx: RankContext,
    spec: PlacedSpec,
    phase: Callable[..., None] = lambda name, limit_s=None: None,
    ranks: Ranks | None = ALONE,
    nvml: NvmlBackend | None = None,
) -> RankResult:
    """One rank's trial, timed or not as its output check's role says (``ranks``: how it
    agrees with the trial's other ranks; ``nvml``: the GPUs to sample, else its own devices'
    on a GPU).

    ``ranks`` None is a trial alone (``trials.trial``): timed as one process is (warm-up until
    the clock settles, each call's CPU time, the CPU's tensor count), and a failure of its step
    is its result, with the memory it reached. A rank lets a failure end its process, since the
    other ranks wait on it and the launcher says how it ended."""
    devices = strategy.devices(ctx)
    link = strategy.link(ctx)  # before anything is allocated or sampled, freed after
    nvml_note = ""
    if nvml is None and ctx.cuda:
        nvml, nvml_note = gpus_nvml(devices)
    result = RankResult(status="ok", devices=devices, times_ms=[], link_gbps=link, nvml_note=nvml_note or None)
    sampler = NvmlSampler(nvml)  # its baseline is read before the trial's CUDA context
    probe = MemoryProbe(devices if ctx.cuda else [])
    out = spec.output
    prepared = None
    barrier = ranks.barrier if ranks else lambda: None
    try:
        with sampler:
            barrier()
            phase("device")  # on a GPU: the CUDA context, where nothing made it before
            probe.start(spec.memory_limit)
            with CpuMemoryLimit(spec.memory_limit if not ctx.cuda else None):
                phase("inputs")
                prepared = strategy.prepare(ctx)
                result.inputs_bytes = probe.in_use()
                if out is None or out.role != "reference-only":
                    _take_calls(result, _timed(strategy, prepared, ctx, spec, probe, sampler, ranks, phase))
            barrier()
            result.backend, result.kv_layout = prepared.backend(), prepared.kv_layout()
    except Exception as exc:
        if ranks is not None:
            raise
        result.status, result.message = oom.classify(exc), oom.one_line(exc)
    result.nvml = [GpuMemory(**g) for g in sampler.per_gpu()] if nvml is not None else None
    fill(result, probe.peaks())
    result.allocator = probe.allocator()
    if prepared is None:
        return result
    result.replica_batches = prepared.replica_batches
    if result.status == "ok" and out is not None:
        phase("compare")
        _check_output(result, prepared, out, ctx)
    return result


def _timed(
    strategy: Strategy,
    prepared: Prepared,
    ctx: RankContext,
    spec: PlacedSpec,
    probe: MemoryProbe,
    sampler: NvmlSampler,
    ranks: Ranks | None,
    phase,
) -> Measurement:
    """The share's step through the measurement core, every rank planning the same calls. GPU
    time where the step launches on the caller's stream and, unless it says otherwise, runs
    in one process."""
    gpu_timed = ctx.world == 1 if prepared.gpu_timed is None else prepared.gpu_timed
    return measure_step(
        prepared.step,
        spec.timing,
        Timer(ctx.workload.device),
        spec.limit_s,
        probe=probe,
        sampler=sampler,
        ranks=ranks,
        compiles=prepared.compiles,
        gpu_timing=strategy.gpu_timed and ctx.cuda and gpu_timed,
        after_call=prepared.after_call,
        phase=phase,
    )


def _take_calls(result: RankResult, m: Measurement) -> None:
    """The calls of ``result`` as the measurement core timed them, what decided them, and the
    step's split of a call where it gave one (a ring's compute and waiting, what it sent)."""
    for name in MEASUREMENT_FIELDS:
        if getattr(m, name) is not None:
            setattr(result, name, getattr(m, name))
    result.message = m.message or None
    result.clocks, result.clocks_moved = m.clocks.get("clocks"), m.clocks.get("clocks_moved")
    _breakdown(result, m.per_call)


def _breakdown(r: RankResult, per_call: list[dict[str, Any]]) -> None:
    """The median split of a timed call into compute and communication wait, and what the
    last call sent."""
    if not per_call:
        return
    r.compute_ms = statistics.median(b.get("compute_ms", 0.0) for b in per_call)
    r.comm_wait_ms = statistics.median(b.get("comm_wait_ms", 0.0) for b in per_call)
    r.sent_bytes = per_call[-1].get("sent_bytes")
    r.comm_steps = per_call[-1].get("comm_steps")


# ---------------------------------------------------------------------------------------
# Output equality with the single-GPU run
# ---------------------------------------------------------------------------------------


def _check_output(result: RankResult, prepared: Prepared, out: OutputCheck, ctx: RankContext) -> None:
    ref = Path(out.reference_dir)
    if out.role in ("reference", "reference-only"):
        save_reference(prepared, ref, ctx)
        return
    result.compare = compare(prepared.output(), prepared, ref)
    grads = prepared.grads()  # on every rank: a data-parallel step all-reduces
    if ctx.rank == 0:
        result.grad_compare = compare_grads(grads, ref)


def save_reference(prepared: Prepared, ref: Path, ctx: RankContext) -> None:
    ref.mkdir(parents=True, exist_ok=True)
    out = prepared.output()
    for i, b in enumerate(prepared.batch):
        torch.save(out[i].detach().to("cpu", copy=True), ref / f"out{b}.pt")  # this element only
    del out
    grads = prepared.grads()
    if grads is not None and ctx.rank == 0:
        torch.save(grads.cpu(), ref / "grads.pt")


def compare(out: torch.Tensor, prepared: Prepared, ref: Path) -> Compared | None:
    """Squared error and squared reference norm of this rank's share, or None without a
    reference (the single run failed)."""
    sq_err = sq_ref = 0.0
    elements = 0
    for i, b in enumerate(prepared.batch):
        path = ref / f"out{b}.pt"
        if not path.exists():
            return None
        expected = torch.load(path, mmap=True)[prepared.tokens].reshape(-1)
        got = out[i].reshape(-1)
        if got.numel() != expected.numel():
            raise RuntimeError(
                f"output of batch element {b} has {got.numel()} elements, the single run's {expected.numel()}"
            )
        for s in range(0, got.numel(), COMPARE_CHUNK):
            e = expected[s : s + COMPARE_CHUNK].to(got.device, torch.float32)
            g = got[s : s + COMPARE_CHUNK].float()
            sq_err += float((g - e).square().sum())
            sq_ref += float(e.square().sum())
        elements += got.numel()
    return Compared(sq_err=sq_err, sq_ref=sq_ref, elements=elements, nonfinite=not bool(torch.isfinite(out).all()))


def compare_grads(grads: torch.Tensor | None, ref: Path) -> Compared | None:
    path = ref / "grads.pt"
    if grads is None or not path.exists():
        return None
    expected = torch.load(path).to(grads.device)
    return Compared(
        sq_err=float((grads - expected).square().sum()),
        sq_ref=float(expected.square().sum()),
        elements=grads.numel(),
    )
