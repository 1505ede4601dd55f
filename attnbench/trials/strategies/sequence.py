"""``ring``: one sequence over the ranks, each holding its shard of the tokens: how a
sequence-parallel implementation (the built-in ring, an outside one) runs a trial.

Every rank builds its shard of the inputs from its own seeded generator and calls the
implementation, which exchanges K/V with the other ranks itself; the ranks' link is measured
before anything is allocated, and each call's split into compute and waiting on the ring is
read after it."""

from __future__ import annotations

import time

import torch

from attnbench.errors import AttnbenchError
from attnbench.trials.strategies import Prepared, RankContext, Strategy, register
from attnbench.trials.workload import Workload

# bytes a rank sends to measure the link the ring runs on: enough to be bandwidth-bound
LINK_PROBE_BYTES = {"cuda": 256 << 20, "cpu": 8 << 20}


def _prepare_sequence(ctx: RankContext) -> Prepared:
    from attnbench.impls import build_for_ranks

    wl, dev = ctx.workload, ctx.device()
    impl = build_for_ranks(wl.impl, wl.config, ctx.world)
    impl.check_shape(wl.seq_len, wl.heads)
    impl.check_causal(wl.causal)
    shard = Workload(**{**wl.to_dict(), "seq_len": wl.seq_len // ctx.world, "device": str(dev)})
    q, k, v = shard.make_inputs(torch.Generator(device=dev).manual_seed(ctx.seed * 1009 + ctx.rank))
    if ctx.fail_rank == ctx.rank:  # a test's fault: the other ranks are already inside the ring
        time.sleep(0.5)
        raise RuntimeError(f"rank {ctx.rank} was asked to fail")

    def step() -> None:
        with torch.no_grad():
            impl(q, k, v, is_causal=wl.causal)

    def output() -> torch.Tensor:
        raise AttnbenchError("a sequence shard's output is checked by the reference check (verify), not here")

    return Prepared(
        step=step,
        output=output,
        batch=range(wl.batch),
        backend=lambda: impl.last_backend,
        kv_layout=lambda: impl.last_kv_layout or None,
        compiles=impl.compiles,
        gpu_timed=ctx.cuda and impl.graph_capturable,
        after_call=impl.last_breakdown,
    )


def _link(ctx: RankContext) -> float | None:
    """The exchange bandwidth of these ranks' link (GB/s), measured before the trial."""
    if ctx.world < 2:
        return None
    from attnbench.impls.sequence_parallel.engine import link_bandwidth_gbps

    dev = ctx.device()
    gbps = link_bandwidth_gbps(dev, ctx.rank, ctx.world, LINK_PROBE_BYTES[dev.type])
    if ctx.cuda:
        torch.cuda.empty_cache()  # its buffers leave nothing reserved behind
    return gbps


register(
    Strategy(
        name="ring",
        processes=lambda gpus: gpus,
        devices=lambda ctx: [ctx.local_rank] if ctx.cuda else [],
        prepare=_prepare_sequence,
        link=_link,
        min_gpus=1,
    )
)
