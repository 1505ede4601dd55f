"""The fused SDPA kernels called through their aten operators: a forward that also returns
the log-sum-exp (what a merge over key blocks needs) and what the kernel's own backward
takes, and that backward. ``F.scaled_dot_product_attention`` hides both.

Inputs are ``(B, H, N, D)`` views with the last dimension contiguous, scale 1/sqrt(D), no
dropout, no mask; ``causal`` is the top-left-aligned triangle of a square block.

Kernels: ``flash``, ``efficient``, ``cudnn`` (CUDA), ``flash-cpu`` (the CPU flash kernel,
any float dtype, float64 included) and ``math``, which has no fused operator: its forward
runs SDPA's math path and its backward recomputes the block under autograd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

aten = torch.ops.aten

CUDA_KERNELS = ("flash", "efficient", "cudnn")


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

    def natural_lse(self, num_queries: int) -> torch.Tensor:
        """The log-sum-exp ``(B, H, Nq)`` in float32."""
        return self.lse.flatten(2)[..., :num_queries].float()


def forward(q, k, v, causal: bool, kernel: str) -> tuple[torch.Tensor, Saved]:
    """Output ``(B, H, Nq, D)`` in q's dtype and what ``backward`` needs."""
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
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal), Saved(kernel, causal, None)
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
            recomputed = F.scaled_dot_product_attention(*inputs, is_causal=causal)
            return torch.autograd.grad(recomputed, inputs, grad_out)
    raise ValueError(f"unknown fused SDPA kernel {kernel!r}")
