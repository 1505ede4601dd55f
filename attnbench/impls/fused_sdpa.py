"""The fused SDPA kernels called through their aten operators: a forward that also returns
the log-sum-exp (what a merge over key blocks needs) and what the kernel's own backward
takes, and that backward. ``F.scaled_dot_product_attention`` hides both.

Inputs are ``(B, H, N, D)`` views with the last dimension contiguous, scale 1/sqrt(D), no
dropout, no mask; ``causal`` is the top-left-aligned triangle of a square block.

Kernels: ``flash``, ``efficient``, ``cudnn`` (CUDA), ``flash-cpu`` (the CPU flash kernel,
any float dtype, float64 included) and ``math``, which has no fused operator: its forward
runs SDPA's math path and its backward recomputes the block under autograd.

Grouped K/V (fewer heads than q, ``attnbench.impls.gqa``): flash, cuDNN and the CPU flash
kernel read them shared, math through ``enable_gqa``; the memory-efficient kernel has no
grouped variant, so a call to it copies K and V to every query head and its backward sums
dk, dv back over each group (``shares_kv`` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.impls import gqa
from attnbench.impls.families.dense import CUDA_KERNELS

aten = torch.ops.aten

# kernels without a grouped-query variant: K and V are copied to every query head per call
EXPANDS_KV = ("efficient",)


def shares_kv(kernel: str) -> bool:
    """Whether ``kernel`` reads grouped K/V without copying them."""
    return kernel not in EXPANDS_KV


def cuda_kernel(q, k, v, causal: bool, backend: str) -> str:
    """The fused kernel to call on CUDA: the named one, or the one SDPA itself would pick."""
    if backend != "auto":
        return backend
    from attnbench.impls.dense import sdpa_backend_in_use

    choice = sdpa_backend_in_use(q, k, v, causal)
    if choice in CUDA_KERNELS:
        return choice
    return "efficient" if q.dtype == torch.float32 else "flash"


def pick_kernel(q, k, v, causal: bool, backend: str) -> str:
    """The kernel for a backend choice (auto, flash, efficient, cudnn, math) on q's device."""
    if backend == "math":
        return "math"
    if q.device.type == "cuda":
        return cuda_kernel(q, k, v, causal, backend)
    if backend not in ("auto", "flash"):
        raise RuntimeError(f"SDPA backend {backend!r} has no CPU kernel; use auto, flash or math on the CPU")
    return "flash-cpu"


@dataclass
class Saved:
    """What one forward call leaves for its backward, besides q, k, v and the output."""

    kernel: str
    causal: bool
    lse: torch.Tensor | None  # as the kernel returned it: efficient pads queries to 32, cuDNN adds an axis of 1
    extra: tuple[Any, ...] = ()  # the kernel's rng state and sequence offsets, passed back untouched
    groups: int = 1  # > 1: K and V were copied to this many query heads each for the kernel

    def natural_lse(self, num_queries: int) -> torch.Tensor:
        """The log-sum-exp ``(B, H, Nq)`` in float32."""
        lse = self.lse
        if lse.dim() == 3 and lse.shape[2] == num_queries and lse.dtype == torch.float32:
            return lse  # flash's own layout: no view or cast to pay for on the host
        return lse.flatten(2)[..., :num_queries].float()


def forward(q, k, v, causal: bool, kernel: str) -> tuple[torch.Tensor, Saved]:
    """Output ``(B, H, Nq, D)`` in q's dtype and what ``backward`` needs."""
    if not shares_kv(kernel) and gqa.heads_differ(q, k, 1):
        groups = q.shape[1] // k.shape[1]
        out, saved = forward(q, gqa.expand_kv(k, groups, 1), gqa.expand_kv(v, groups, 1), causal, kernel)
        saved.groups = groups
        return out, saved
    if kernel == "flash-cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return out, Saved(kernel, causal, lse)
    if kernel == "flash":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal
        )
        return out, Saved(kernel, causal, lse, (cum_q, cum_k, max_q, max_k, seed, offset))
    if kernel == "efficient":
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)
        return out, Saved(kernel, causal, lse, (seed, offset))
    if kernel == "cudnn":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal
        )
        return out, Saved(kernel, causal, lse, (cum_q, cum_k, max_q, max_k, seed, offset))
    if kernel == "math":
        with sdpa_kernel([SDPBackend.MATH]):
            return gqa.sdpa(q, k, v, is_causal=causal), Saved(kernel, causal, None)
    raise ValueError(f"unknown fused SDPA kernel {kernel!r}")


def dense_tokens(x: torch.Tensor) -> torch.Tensor:
    """A ``(B, H, N, D)`` view laid out as the memory-efficient kernel's own output is: dense
    ``(B, N, H, D)`` memory, transposed. Its backward takes the output's batch and head strides
    but not its token stride, which it assumes is ``H * D`` (``o_strideM()`` in
    mem_eff_attention/kernel_backward.h). In half and bfloat16 the kernel computes
    ``delta = rowsum(dO * O)`` itself from that stride, so a strided output (a dilated or
    head-sliced view) gives a wrong delta and wrong dq and dk while dv stays right; in float32
    ATen computes delta with the true strides. A copy of one chunk when the layout differs."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def backward(grad_out, q, k, v, out, saved: Saved) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of one forward call, given the gradient of its output."""
    if saved.groups > 1:  # the kernel saw copied K/V: each copy's gradient adds to its head's
        expanded = [gqa.expand_kv(x, saved.groups, 1) for x in (k, v)]
        dq, dk, dv = backward(grad_out, q, *expanded, out, replace(saved, groups=1))
        return dq, *(d.unflatten(1, (-1, saved.groups)).sum(2) for d in (dk, dv))
    kernel, causal, lse = saved.kernel, saved.causal, saved.lse
    if kernel == "flash-cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, causal)
    if kernel == "flash":
        cum_q, cum_k, max_q, max_k, seed, offset = saved.extra
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset
        )
    if kernel == "efficient":
        seed, offset = saved.extra
        return aten._scaled_dot_product_efficient_attention_backward(
            dense_tokens(grad_out),
            q,
            k,
            v,
            None,
            dense_tokens(out),
            lse,
            seed,
            offset,
            0.0,
            [True, True, True, False],
            causal,
        )[:3]
    if kernel == "cudnn":
        cum_q, cum_k, max_q, max_k, seed, offset = saved.extra
        return aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal
        )
    if kernel == "math":
        with torch.enable_grad(), sdpa_kernel([SDPBackend.MATH]):
            inputs = [x.detach().requires_grad_(True) for x in (q, k, v)]
            recomputed = gqa.sdpa(*inputs, is_causal=causal)
            return torch.autograd.grad(recomputed, inputs, grad_out)
    raise ValueError(f"unknown fused SDPA kernel {kernel!r}")
