"""``mp``: one process per GPU under torchrun, the batch split across ranks
(DistributedDataParallel for a multi-head training step)."""

from __future__ import annotations

from attnbench.errors import AttnbenchError
from attnbench.results.schema import Speedup
from attnbench.trials.strategies import Prepared, RankContext, Strategy, register
from attnbench.trials.strategies.work import build_model, make_inputs, plan_work
from attnbench.trials.workload import Workload


def _check_mp(wl: Workload, gpus: int) -> None:
    if wl.batch % gpus:
        raise AttnbenchError(
            f"mp splits the batch across {gpus} ranks (one per GPU): case {wl.seq_len}x{wl.batch} has batch {wl.batch}, not a multiple "
            f"of {gpus}; choose a batch that {gpus} divides (dp runs such a case, with a note)"
        )


def _prepare_mp(ctx: RankContext) -> Prepared:
    device = ctx.device()
    model, impl = build_model(ctx, device)
    share = ctx.workload.batch // ctx.world
    batch = range(ctx.rank * share, (ctx.rank + 1) * share)
    wrapped = model
    if ctx.module == "multihead" and ctx.workload.mode == "fwd_bwd" and ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if ctx.cuda else None)
        if ctx.grad_compression:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
            wrapped.register_comm_hook(None, hook[ctx.grad_compression])
    return plan_work(ctx, wrapped, model, impl, make_inputs(ctx, batch, device), batch, device)


def _mp_notes(row: Speedup) -> list[str]:
    notes = [f"{row.batch // row.world_size} per rank; time = slowest rank per iteration"]
    if row.mode == "fwd_bwd" and row.module == "attention":
        notes.append("attention alone has no parameters: no gradient all-reduce, ranks run independently")
    if row.mode == "fwd_bwd" and row.module == "multihead" and row.world_size > 1:
        notes.append(f"DistributedDataParallel, gradient all-reduce {row.grad_compression or 'fp32'}")
    return notes


register(
    Strategy(
        name="mp",
        processes=lambda gpus: gpus,
        devices=lambda ctx: [ctx.local_rank] if ctx.cuda else [],
        prepare=_prepare_mp,
        check=_check_mp,
        notes=_mp_notes,
    )
)
