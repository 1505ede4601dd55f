"""``device``: one implementation's call on one device, the trial of every point and every
step of a search. ``trials.trial`` runs it in a worker process of its own through the measure
of every placed trial (``trials.placed_job.measure``), so a point, a ring's rank and a speedup's
rank are timed, read for memory and judged by the same code.

It is not registered as a speedup strategy: it runs the implementation alone, not a module,
and launches nothing. Its implementation is built before the trial's memory is watched (an
outside implementation's imports and set-up are not the trial's), so the trial hands it over.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.errors import AttnbenchError
from attnbench.trials.strategies import Prepared, RankContext, Strategy
from attnbench.trials.workload import Workload


def on_device(impl) -> Strategy:
    """The one-device placement of ``impl`` (built, its shape checked)."""
    return Strategy(
        name="device",
        processes=lambda gpus: 1,
        devices=lambda ctx: [0] if ctx.cuda else [],
        prepare=lambda ctx: prepare_device(ctx, impl),
        world_size=lambda gpus: 1,
        min_gpus=1,
    )


def prepare_device(ctx: RankContext, impl) -> Prepared:
    """q, k and v from the trial's seed, and the call the trial times on them."""
    wl = ctx.workload
    q, k, v = wl.make_inputs(torch.Generator(device=wl.device).manual_seed(ctx.seed))

    def output() -> torch.Tensor:
        raise AttnbenchError("a trial's output is checked by the reference check (verify), not here")

    return Prepared(
        step=_step(impl, wl, q, k, v),
        output=output,
        batch=range(wl.batch),
        backend=lambda: impl.last_backend,
        kv_layout=lambda: impl.last_kv_layout or None,  # grouped K/V: shared, or copied to every query head
        compiles=impl.compiles,
    )


def _step(impl, wl: Workload, q, k, v) -> Callable[[], None]:
    if wl.mode == "fwd":

        def forward():
            with torch.no_grad():
                impl(q, k, v, is_causal=wl.causal)

        return forward

    # made by the first call, so that the inputs' bytes are q, k and v as they always were
    grad_out: list[torch.Tensor] = []

    def forward_backward():
        if not grad_out:
            grad_out.append(torch.randn_like(q))
        for t in (q, k, v):
            t.grad = None
        impl(q, k, v, is_causal=wl.causal).backward(grad_out[0])

    return forward_backward
