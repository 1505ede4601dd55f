"""The ``local-attention`` package's ``LocalAttention`` as an attnbench implementation.

The kernel cuts the sequence into windows of ``window_size`` tokens; a query in window w
attends every key in windows w - look_backward .. w + look_forward (look_forward is 0 when
causal, where it also drops the keys after the query). It computes the scores of all those
windows' slots, padding at the sequence's ends included, so it executes more pairs than it
uses: the adapter declares both (``mask_mod`` for the key sets it uses, ``executed_pairs`` for
what it computes). Nothing here imports attnbench: the contract is plain PyTorch.
"""

from __future__ import annotations

from torch import nn


class LocalWindows(nn.Module):
    """``local_attention.LocalAttention`` on attnbench's ``(B, N, H, D)`` tensors."""

    def __init__(self, window_size: int, look_backward: int, look_forward: int) -> None:
        super().__init__()
        from local_attention import LocalAttention

        self.window_size, self.look_backward, self.look_forward = window_size, look_backward, look_forward
        self.granularity = window_size  # the kernel asserts N is a multiple of its window
        common = {"window_size": window_size, "look_backward": look_backward, "use_rotary_pos_emb": False}
        self.plain = LocalAttention(causal=False, look_forward=look_forward, **common)
        self.causal = LocalAttention(causal=True, look_forward=0, **common)

    def mask_mod(self, b, h, q_idx, kv_idx):
        """Windows w - look_backward .. w + look_forward of the query's window w."""
        w, kw = q_idx // self.window_size, kv_idx // self.window_size
        return (kw >= w - self.look_backward) & (kw <= w + self.look_forward)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        """Every slot of every window a query's window looks at, padding included."""
        windows = self.look_backward + 1 + (0 if causal else self.look_forward)
        return num_heads * seq_len * windows * self.window_size

    def forward(self, q, k, v, is_causal: bool = False):
        attend = self.causal if is_causal else self.plain
        out = attend(*(x.transpose(1, 2) for x in (q, k, v)))  # it takes (..., N, D)
        return out.transpose(1, 2)


def local_attention(window_size: int = 128, look_backward: int = 1, look_forward: int = 1) -> nn.Module:
    """local-attention 1.11.2's LocalAttention: blocked windows, the query's and its neighbours'."""
    return LocalWindows(window_size, look_backward, look_forward)


local_attention.summary = "local-attention's LocalAttention (pip local-attention): windows of keys around the query's"
local_attention.memory_order = 1
