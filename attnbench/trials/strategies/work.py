"""The module every strategy runs, and its inputs: the attention implementation alone or inside
q/k/v/out projections, inputs every rank draws alike, and the step, output and gradient
closures a strategy wraps."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnbench import impls
from attnbench.trials.strategies import Prepared, RankContext


class MultiheadSelfAttention(nn.Module):
    """q/k/v/out projections around a registered attention implementation: what a training
    step updates, so DistributedDataParallel has gradients to all-reduce."""

    def __init__(self, attention: nn.Module, heads: int, head_dim: int, compute_dtype: torch.dtype) -> None:
        super().__init__()
        embed = heads * head_dim
        self.attention, self.heads, self.head_dim, self.compute_dtype = attention, heads, head_dim, compute_dtype
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(embed, embed) for _ in range(4))

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        b, n, e = x.shape

        def heads(t):
            return t.view(b, n, self.heads, self.head_dim)

        # float32 parameters, 16-bit compute (mixed precision); entered here rather than by the
        # caller because DataParallel's replica threads would not inherit the autocast dtype
        with torch.autocast(x.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32):
            out = self.attention(
                heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)), is_causal=is_causal
            )
            return self.out_proj(out.reshape(b, n, e))


def build_model(ctx: RankContext, device: torch.device) -> tuple[nn.Module, Any]:
    """(module, attention impl): the same parameters on every rank and in every process."""
    wl = ctx.workload
    impl = impls.build(wl.impl, **wl.config)
    if ctx.module == "attention":
        return impl.to(device), impl
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = MultiheadSelfAttention(impl, wl.heads, wl.head_dim, wl.torch_dtype)
    # parameters stay float32 (mixed precision runs under autocast), so gradient compression
    # to bf16 / fp16 really halves what the all-reduce sends
    return model.to(device), impl


def seeded_normal(shape: tuple[int, ...], batch: range, seed: int, stream: int, dtype, device) -> torch.Tensor:
    """Batch element b is drawn from its own generator, so any rank holding any subset of
    the batch gets exactly the values the single-GPU run used."""
    out = torch.empty((len(batch), *shape), dtype=dtype, device=device)
    for i, b in enumerate(batch):
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + stream * 10_007 + b)
        out[i].normal_(generator=gen)
    return out


def make_inputs(ctx: RankContext, batch: range, device: torch.device) -> tuple[torch.Tensor, ...]:
    wl = ctx.workload
    if ctx.module == "attention":
        shape = (wl.seq_len, wl.heads, wl.head_dim)
        tensors = tuple(seeded_normal(shape, batch, ctx.seed, s, wl.torch_dtype, device) for s in range(3))
        if wl.mode == "fwd_bwd":
            for t in tensors:
                t.requires_grad_(True)
        return tensors
    return (seeded_normal((wl.seq_len, wl.heads * wl.head_dim), batch, ctx.seed, 0, wl.torch_dtype, device),)


def output_shape(ctx: RankContext) -> tuple[int, ...]:
    wl = ctx.workload
    return (wl.seq_len, wl.heads, wl.head_dim) if ctx.module == "attention" else (wl.seq_len, wl.heads * wl.head_dim)


def plan_work(
    ctx: RankContext,
    model: nn.Module,
    plain: nn.Module,
    impl,
    inputs,
    batch: range,
    device: torch.device,
    tokens: slice = slice(None),
) -> Prepared:
    """The step, output and gradient closures of any strategy.

    ``model`` is what the step calls (possibly wrapped), ``plain`` what the output check
    calls. The backward uses a fixed upstream gradient scaled by 1/len(batch), so the
    gradient is that of a batch mean: averaged over data-parallel ranks it equals the
    single-GPU gradient of the whole batch.
    """
    wl = ctx.workload
    causal = wl.causal
    grad_out = None
    if wl.mode == "fwd_bwd":
        grad_out = seeded_normal(output_shape(ctx), batch, ctx.seed, 7, wl.torch_dtype, device) / len(batch)

    def forward(m):
        # keyword arguments make DataParallel pad a short batch's scatter with empty calls:
        # pass none when the default already says it
        return m(*inputs, is_causal=True) if causal else m(*inputs)

    def step() -> None:
        if grad_out is None:
            with torch.no_grad():
                forward(model)
            return
        for t in inputs:
            t.grad = None
        model.zero_grad(set_to_none=True)
        forward(model).backward(grad_out)

    def output() -> torch.Tensor:
        with torch.no_grad():
            return forward(plain)

    def grads() -> torch.Tensor | None:
        params = [p for p in plain.parameters()]
        if grad_out is None or not params:
            return None
        step()
        return torch.cat([p.grad.detach().float().flatten() for p in params])

    return Prepared(
        step=step,
        output=output,
        batch=batch,
        tokens=tokens,
        grads=grads,
        backend=lambda: impl.last_backend,
        kv_layout=lambda: impl.last_kv_layout or None,
    )
