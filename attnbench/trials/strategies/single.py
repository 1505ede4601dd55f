"""``single``: the baseline on GPU 0, every speedup's denominator."""

from __future__ import annotations

from attnbench.trials.strategies import Prepared, RankContext, Strategy, register
from attnbench.trials.strategies.work import build_model, make_inputs, plan_work


def prepare_single(ctx: RankContext) -> Prepared:
    device = ctx.device(0)
    model, impl = build_model(ctx, device)
    batch = range(ctx.workload.batch)
    return plan_work(ctx, model, model, impl, make_inputs(ctx, batch, device), batch, device)


register(
    Strategy(
        name="single",
        processes=lambda gpus: 1,
        devices=lambda ctx: [0] if ctx.cuda else [],
        prepare=prepare_single,
        world_size=lambda gpus: 1,
        min_gpus=1,
    )
)
