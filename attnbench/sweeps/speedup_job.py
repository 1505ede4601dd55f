"""What every rank of a speedup trial does, whatever the strategy: prepare its share, time
it, read its memory, and check its output against the single-GPU output.

Runs under ``attnbench.runtime.distributed.launch`` as ``speedup_rank`` (one process for single and
DataParallel, one per GPU for mp). ``measure`` is the whole of it and also runs in-process.

- Time: one untimed call, then (all ranks agreeing on the plan) warm-up and timed calls;
  before each timed call every rank waits at a barrier, so iteration i starts together on
  all ranks and the parent takes the slowest rank's time for it.
- Memory: local rank 0 samples NVML on every GPU in the background (the other ranks' work
  included); each rank reads the allocator peaks of the devices it used.
- Output: the single run saves its output per batch element; any other strategy compares
  its share with it, in float32, and returns the squared error and reference norms.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnbench.measure.memory import NvmlBackend, NvmlSampler
from attnbench.measure.timing import Timer, TimingPolicy, collect, gpu_time
from attnbench.sweeps import strategies
from attnbench.sweeps.strategies import Prepared, RankContext, Strategy
from attnbench.workload import Workload

# float32 elements compared at once, so the check never holds a second full output
COMPARE_CHUNK = 1 << 24


def speedup_rank(payload: dict[str, Any], rank: int, world: int, device: str) -> dict[str, Any]:
    importlib.import_module(payload["strategy_module"])  # registers strategies defined elsewhere
    strategy = strategies.get(payload["strategy"])
    ctx = context(payload, rank, world, int(os.environ.get("LOCAL_RANK", rank)))
    nvml, nvml_note = (None, "")
    if ctx.cuda and ctx.local_rank == 0:
        from attnbench.measure.memory import open_nvml

        nvml, nvml_note = open_nvml()

    def phase(name: str) -> None:
        if ctx.local_rank == 0:
            print(f"phase {name}", flush=True)

    result = measure(strategy, ctx, payload, nvml, phase)
    if nvml_note:
        result["nvml_note"] = nvml_note
    return result


def context(payload: dict[str, Any], rank: int = 0, world: int = 1, local_rank: int = 0) -> RankContext:
    return RankContext(
        workload=Workload(**payload["workload"]),
        module=payload["module"],
        grad_compression=payload.get("grad_compression"),
        gpus=payload["gpus"],
        rank=rank,
        world=world,
        local_rank=local_rank,
        seed=payload["seed"],
    )


def measure(
    strategy: Strategy,
    ctx: RankContext,
    payload: dict[str, Any],
    nvml: NvmlBackend | None,
    phase: Callable[[str], None] = lambda name: None,
) -> dict[str, Any]:
    """One rank's trial. ``payload``: ``timing`` (TimingPolicy fields), ``max_trial_seconds``,
    ``reference_dir``, ``role`` (``measure``, ``reference``: also save the output, or
    ``reference-only``: save the output without timing)."""
    role = payload.get("role", "measure")
    devices = strategy.devices(ctx)
    out: dict[str, Any] = {"status": "ok", "devices": devices, "times_ms": []}
    policy = TimingPolicy(**{**payload.get("timing", {}), "budget_s": payload["max_trial_seconds"]})
    sampler = NvmlSampler(nvml)
    with sampler:
        _barrier(ctx)
        for d in devices:
            torch.cuda.reset_peak_memory_stats(d)
        prepared = strategy.prepare(ctx)
        if role != "reference-only":
            out.update(_time(prepared, ctx, policy, phase))
        _barrier(ctx)  # the sampler on local rank 0 must see every rank's work
    out["nvml"] = sampler.per_gpu() if nvml is not None else None
    if nvml is not None and ctx.cuda:
        out["nvml_index"] = cuda_to_nvml(ctx.gpus)
    out["allocator"] = {
        str(d): {
            "max_memory_allocated": torch.cuda.max_memory_allocated(d),
            "max_memory_reserved": torch.cuda.max_memory_reserved(d),
        }
        for d in devices
    }
    if not ctx.cuda:
        from attnbench.measure.memory import rss_peak_bytes

        out["cpu_peak_rss"] = rss_peak_bytes()
    out["backend"] = prepared.backend()
    out.update(prepared.facts)
    if out["status"] != "ok":
        return out
    phase("compare")
    ref = Path(payload["reference_dir"])
    if role in ("reference", "reference-only"):
        save_reference(prepared, ref, ctx)
    else:
        out["compare"] = compare(prepared.output(), prepared, ref)
        grads = prepared.grads()  # on every rank: a data-parallel step all-reduces
        if ctx.rank == 0:
            out["grad_compare"] = compare_grads(grads, ref)
    return out


def _time(prepared: Prepared, ctx: RankContext, policy: TimingPolicy, phase) -> dict[str, Any]:
    timer = Timer(ctx.workload.device)
    phase("first-call")
    own_first_ms = timer(prepared.step)
    first_ms = agree_max(ctx, own_first_ms)  # every rank plans the same number of calls
    if first_ms > policy.budget_s * 1e3:
        return {
            "status": "time-limit",
            "first_call_ms": first_ms,
            "rank_first_call_ms": own_first_ms,
            "message": f"one call took {first_ms / 1e3:.1f} s > {policy.budget_s:g} s",
        }
    phase("timing")

    def after_barrier(fn):
        _barrier(ctx)
        return timer(fn)

    out = {
        "first_call_ms": first_ms,
        "rank_first_call_ms": own_first_ms,
        "times_ms": collect(prepared.step, after_barrier, first_ms, policy),
    }
    if ctx.cuda and ctx.world == 1:  # one process: its GPU time beside the eager time
        phase("gpu-timing")
        out.update(gpu_time(prepared.step, out["times_ms"]))
    return out


def _barrier(ctx: RankContext) -> None:
    if ctx.world > 1:
        import torch.distributed as dist

        dist.barrier()
        if ctx.cuda:
            torch.cuda.synchronize()


def agree_max(ctx: RankContext, value: float) -> float:
    if ctx.world == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=ctx.device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def cuda_to_nvml(count: int) -> dict[str, int]:
    """NVML index of CUDA devices 0..count-1, matched by UUID (CUDA may order or hide GPUs
    differently from NVML); the same index where a UUID cannot be read."""
    mapping = {str(i): i for i in range(count)}
    try:
        import pynvml

        pynvml.nvmlInit()
        by_uuid = {}
        for j in range(pynvml.nvmlDeviceGetCount()):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(j))
            by_uuid[(u.decode() if isinstance(u, bytes) else u).removeprefix("GPU-")] = j
        for i in range(count):
            j = by_uuid.get(str(torch.cuda.get_device_properties(i).uuid).removeprefix("GPU-"))
            if j is not None:
                mapping[str(i)] = j
    except Exception:
        pass
    return mapping


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


def compare(out: torch.Tensor, prepared: Prepared, ref: Path) -> dict[str, Any] | None:
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
    return {"sq_err": sq_err, "sq_ref": sq_ref, "elements": elements, "nonfinite": not bool(torch.isfinite(out).all())}


def compare_grads(grads: torch.Tensor | None, ref: Path) -> dict[str, Any] | None:
    path = ref / "grads.pt"
    if grads is None or not path.exists():
        return None
    expected = torch.load(path).to(grads.device)
    return {
        "sq_err": float((grads - expected).square().sum()),
        "sq_ref": float(expected.square().sum()),
        "elements": grads.numel(),
    }
