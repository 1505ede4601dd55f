"""What every rank of a speedup trial does, whatever the strategy: prepare its share, time
it, read its memory, and check its output against the single-GPU output.

Runs under ``attnbench.runtime.distributed.launch`` as the rank job ``speedup_rank`` (one process
for single and DataParallel, one per GPU for mp). ``measure`` is the whole of it and also runs
in-process.

- Time and memory: through the measurement core (``attnbench.measure.core``), all ranks
  agreeing on the plan; before each call every rank waits at a barrier, so iteration i starts
  together on all ranks and the parent takes the slowest rank's time for it. Local rank 0
  samples NVML on every GPU in the background (the other ranks' work included); each rank
  reads the allocator peaks of the devices it used.
- Output: the single run saves its output per batch element; any other strategy compares
  its share with it, in float32, and returns the squared error and reference norms.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.measure.core import MemoryProbe, Ranks, Timer, measure_step
from attnbench.measure.memory import NvmlBackend, NvmlSampler
from attnbench.measure.timing import TimingPolicy
from attnbench.results.schema import GpuMemory
from attnbench.runtime.jobs import Place, job
from attnbench.sweeps.kinds.speedup import strategies
from attnbench.sweeps.kinds.speedup.result import Compared, RankResult, RankSpec
from attnbench.sweeps.kinds.speedup.strategies import Prepared, RankContext, Strategy
from attnbench.trials.ranks import ALONE, agreement, phase_reporter

# float32 elements compared at once, so the check never holds a second full output
COMPARE_CHUNK = 1 << 24


@job
def speedup_rank(spec: RankSpec, place: Place) -> RankResult:
    """This rank's trial of ``spec.strategy``."""
    importlib.import_module(spec.strategy_module)  # registers strategies defined elsewhere
    strategy = strategies.get(spec.strategy)
    ctx = context(spec, place.rank, place.world, place.local_rank)
    made = single_output_here(spec, ctx) if spec.remake_reference and ctx.local_rank == 0 else None
    try:
        result = _measured(strategy, ctx, spec, place)
        if spec.remake_reference:
            agreement(place).barrier()  # every rank of this node compared with it before it goes
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    return result


def single_output_here(spec: RankSpec, ctx: RankContext) -> Path | None:
    """On a node other than the single run's, before its ranks time anything: the single-GPU
    output they compare with, made here by the single strategy from the same seeded inputs
    (the single run's own stays on its node's disk). The directory it made, or None where
    the single run's output is already here."""
    ref = Path(spec.reference_dir)
    if ref.exists():
        return None
    single = context(spec, local_rank=ctx.local_rank)
    prepared = strategies.get("single").prepare(single)
    save_reference(prepared, ref, single)
    del prepared
    if ctx.cuda:
        torch.cuda.empty_cache()
    return ref


def _measured(strategy: Strategy, ctx: RankContext, spec: RankSpec, place: Place) -> RankResult:
    nvml, nvml_note = (None, "")
    if ctx.cuda and ctx.local_rank == 0:
        from attnbench.measure.memory import open_nvml

        nvml, nvml_note = open_nvml()
    result = measure(strategy, ctx, spec, nvml, phase_reporter(place), agreement(place))
    result.nvml_note = nvml_note or None
    return result


def context(spec: RankSpec, rank: int = 0, world: int = 1, local_rank: int = 0) -> RankContext:
    return RankContext(
        workload=spec.workload,
        module=spec.module,
        grad_compression=spec.grad_compression,
        gpus=spec.gpus,
        rank=rank,
        world=world,
        local_rank=local_rank,
        seed=spec.seed,
    )


def measure(
    strategy: Strategy,
    ctx: RankContext,
    spec: RankSpec,
    nvml: NvmlBackend | None,
    phase: Callable[..., None] = lambda name, limit_s=None: None,
    ranks: Ranks = ALONE,
) -> RankResult:
    """One rank's trial, timed or not as its ``spec.role`` says (``ranks``: how it agrees with
    the trial's other ranks)."""
    role = spec.role
    devices = strategy.devices(ctx)
    result = RankResult(status="ok", devices=devices, times_ms=[])
    policy = spec.timing
    sampler = NvmlSampler(nvml)
    probe = MemoryProbe(devices if ctx.cuda else [])
    with sampler:
        ranks.barrier()
        probe.start(None)
        prepared = strategy.prepare(ctx)
        if role != "reference-only":
            _time(result, prepared, ctx, policy, probe, phase, ranks, strategy.gpu_timed)
        ranks.barrier()  # the sampler on local rank 0 must see every rank's work
    result.nvml = [GpuMemory(**g) for g in sampler.per_gpu()] if nvml is not None else None
    result.allocator = probe.allocator()
    if not ctx.cuda:
        result.cpu_peak_rss = probe.peaks().cpu_peak_rss
    result.backend = prepared.backend()
    result.replica_batches = prepared.replica_batches
    if result.status != "ok":
        return result
    phase("compare")
    ref = Path(spec.reference_dir)
    if role in ("reference", "reference-only"):
        save_reference(prepared, ref, ctx)
    else:
        result.compare = compare(prepared.output(), prepared, ref)
        grads = prepared.grads()  # on every rank: a data-parallel step all-reduces
        if ctx.rank == 0:
            result.grad_compare = compare_grads(grads, ref)
    return result


def _time(
    result: RankResult,
    prepared: Prepared,
    ctx: RankContext,
    policy: TimingPolicy,
    probe: MemoryProbe,
    phase,
    ranks: Ranks,
    gpu_timed: bool = True,
) -> None:
    """``result``'s times: the strategy's step through the measurement core, every rank planning
    the same calls; one process on a GPU also takes GPU time where its strategy launches on the
    caller's stream."""
    m = measure_step(
        prepared.step,
        policy,
        Timer(ctx.workload.device),
        policy.budget_s,
        probe=probe,
        ranks=ranks,
        gpu_timing=gpu_timed and ctx.cuda and ctx.world == 1,
        phase=phase,
    )
    result.status, result.times_ms = m.status, m.times_ms
    result.first_call_ms, result.rank_first_call_ms = m.slowest_first_call_ms, m.first_call_ms
    if m.status != "ok":
        result.message = m.message
    if m.gpu_times_ms is not None:
        result.gpu_times_ms, result.gpu_timer = m.gpu_times_ms, m.gpu_timer


# ---------------------------------------------------------------------------------------
# Output equality with the single-GPU run
# ---------------------------------------------------------------------------------------


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
