"""Sliding-window attention for attnbench: each query attends to the keys at most ``window``
positions away. Two implementations of the same key sets:

- ``sliding_window``: FlexAttention (compiled on CUDA) with the window as a ``mask_mod``;
  attnbench counts its pairs from the mask_mod.
- ``sliding_window_naive``: plain PyTorch, an N x N boolean mask into SDPA's math path;
  declares its pairs in closed form and its N^2 memory (``memory_order = 2``).

Neither imports attnbench: the contract is plain PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def sliding_window_mask(window_size: int):
    """attention-gym style: a ``mask_mod(b, h, q_idx, kv_idx)`` keeping |q - kv| <= window_size."""

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= window_size

    return mask_mod


class SlidingWindowFlex(nn.Module):
    """FlexAttention with a sliding-window block mask (built once per shape)."""

    compiles = True  # on CUDA the first call compiles the kernel: attnbench times it apart
    granularity = 128  # FlexAttention's block size

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window
        self.mask_mod = sliding_window_mask(window)  # the declared key sets
        self._block_mask = None
        self._key = None

    def forward(self, q, k, v, is_causal: bool = False):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        n, device = q.shape[1], q.device
        if self._key != (n, is_causal, device):
            mod = self.mask_mod
            if is_causal:

                def mod(b, h, q_idx, kv_idx):
                    return self.mask_mod(b, h, q_idx, kv_idx) & (kv_idx <= q_idx)

            cuda = device.type == "cuda"
            self._block_mask = create_block_mask(mod, None, None, n, n, device=device, _compile=cuda)
            self._key = (n, is_causal, device)
        attend = _compiled_flex() if device.type == "cuda" else flex_attention
        out = attend(*(x.transpose(1, 2) for x in (q, k, v)), block_mask=self._block_mask)
        return out.transpose(1, 2)


_flex = None


def _compiled_flex():
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex = torch.compile(flex_attention, dynamic=False)
    return _flex


class SlidingWindowNaive(nn.Module):
    """The same key sets as an explicit N x N mask (O(N^2) memory)."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window

    def key_mask(self, seq_len: int, num_heads: int) -> torch.Tensor:
        i = torch.arange(seq_len)
        return (i[:, None] - i[None, :]).abs() <= self.window  # (N, N): the same for every head

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        # a query at t keeps [t - w, t + w] (causal: [t - w, t]) clipped to [0, N)
        w = min(self.window, seq_len - 1)
        per_head = seq_len * (w + 1) - w * (w + 1) // 2 if causal else seq_len * (2 * w + 1) - w * (w + 1)
        return num_heads * per_head

    def forward(self, q, k, v, is_causal: bool = False):
        n = q.shape[1]
        mask = self.key_mask(n, q.shape[2]).to(q.device)
        if is_causal:
            mask &= torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask)
        return out.transpose(1, 2)


def sliding_window(window: int = 256) -> SlidingWindowFlex:
    """sliding-window attention through FlexAttention (compiled on CUDA)"""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    return SlidingWindowFlex(window)


def sliding_window_naive(window: int = 256) -> SlidingWindowNaive:
    """sliding-window attention as an N x N mask into SDPA (O(N^2) memory)"""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    return SlidingWindowNaive(window)


sliding_window_naive.memory_order = 2  # holds N x N: the capacity fit is quadratic
