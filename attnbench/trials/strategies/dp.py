"""``dp``: torch.nn.DataParallel over the GPUs in one process, as the seeds used it."""

from __future__ import annotations

from torch import nn

from attnbench.results.schema import GpuMemory, Speedup
from attnbench.trials.strategies import Prepared, RankContext, Strategy, register
from attnbench.trials.strategies.work import build_model, make_inputs, plan_work


def _prepare_dp(ctx: RankContext) -> Prepared:
    device = ctx.device(0)
    model, impl = build_model(ctx, device)
    replicas: list[tuple[int, int]] = []
    # every replica calls the module's pre-hooks with its own chunk: record what each GPU got
    model.register_forward_pre_hook(
        lambda m, args: replicas.append((args[0].device.index, args[0].shape[0])) if args else None
    )
    dp = nn.DataParallel(model, device_ids=list(range(ctx.gpus)))
    batch = range(ctx.workload.batch)
    prepared = plan_work(ctx, dp, dp, impl, make_inputs(ctx, batch, device), batch, device)
    inner = prepared.step

    def step() -> None:
        replicas.clear()
        inner()
        prepared.replica_batches = [list(r) for r in sorted(set(replicas))]

    prepared.step = step
    prepared.backend = lambda: None  # each replica is a copy; the original module never runs
    return prepared


def _dp_notes(row: Speedup) -> list[str]:
    gpus, batch = row.world_size, row.batch
    ran = row.replica_batches
    if not ran:
        return []
    used = {d for d, _ in ran}
    notes = []
    if len(used) < gpus:
        idle = [g for g in row.gpus or [] if g.index not in used]
        what = "; ".join(f"GPU {g.index} idle ({_idle_text(g)})" for g in idle) or ", ".join(
            f"GPU {i} idle" for i in range(gpus) if i not in used
        )
        notes.append(
            f"batch {batch} < {gpus} GPUs: DataParallel ran {len(used)} replica{'s' if len(used) > 1 else ''}; {what}"
            if batch < gpus
            else f"DataParallel ran {len(used)} of {gpus} replicas; {what}"
        )
    sizes = sorted({b for _, b in ran})
    if len(sizes) > 1:
        notes.append("uneven split: " + ", ".join(f"GPU {d} got {b}" for d, b in ran))
    return notes


def _idle_text(gpu: GpuMemory) -> str:
    from attnbench.units import format_bytes

    alloc = gpu.max_memory_allocated
    bits = [f"allocator peak {format_bytes(alloc) if alloc else '0 B'}"]
    if gpu.nvml_used_peak is not None:
        bits.append(f"NVML {gpu.nvml_used_peak / 2**30:.2f} GiB used at peak")
        if gpu.nvml_used_before is not None:
            rise = gpu.nvml_used_peak - gpu.nvml_used_before
            bits.append(
                f"+{rise / 2**30:.2f} GiB during the run" + (" = CUDA context" if rise > 0 and not alloc else "")
            )
    return ", ".join(bits)


register(
    Strategy(
        name="dp",
        processes=lambda gpus: 1,
        devices=lambda ctx: list(range(ctx.gpus)),
        prepare=_prepare_dp,
        skip=lambda device: (
            None
            if device == "cuda"
            else "DataParallel splits a batch over CUDA GPUs; on the CPU it runs the module once, so there is nothing to compare"
        ),
        notes=_dp_notes,
        gpu_timed=False,
    )
)
