"""Attention computed in pieces (chunks of query rows, each against a range of keys), and its
training step at the memory floor.

Under autograd, writing each piece's output into one output tensor keeps every piece's
output twice (the piece's own, saved by its kernel, and the copy) and makes the backward
clone the whole output gradient once per write. ``PiecewiseAttention`` instead keeps only
q, k and v: the backward recomputes one piece at a time under autograd and adds its dq, dk,
dv into preallocated gradients, so what it holds beyond the floor is one piece's worth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Piece:
    rows: slice  # query tokens it computes
    keys: slice  # key tokens it reads
    #: (q rows, k keys, v keys), each (B, n, H, D) -> the rows' output (B, rows, H, D)
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    #: the first row no earlier piece computed; rows before it are recomputed identically
    #: (equal-length chunks whose last overlaps its neighbour) and count once in the backward
    fresh: int = 0

    def run(self, q, k, v) -> torch.Tensor:
        return self.attend(q[:, self.rows], k[:, self.keys], v[:, self.keys])


def training_chunk_tokens(seq_len: int, max_chunk_tokens: int, least: int = 1) -> int:
    """Query tokens per kernel call under autograd. The backward's temporaries are a few
    chunks' worth (a chunk's recomputed output or its kernel's dq, dk, dv and float32
    accumulators): at most a 16th of the sequence keeps them to a few percent of the training
    floor at any length; ``least`` keeps short sequences in few calls."""
    return min(max_chunk_tokens, max(least, seq_len // 16))


def write_pieces(q, k, v, pieces: list[Piece]) -> torch.Tensor:
    """The output, every piece written into one tensor (no autograd)."""
    out = torch.empty_like(q)
    for piece in pieces:
        out[:, piece.rows] = piece.run(q, k, v)
    return out


class PiecewiseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pieces):
        with torch.no_grad():
            out = write_pieces(q, k, v, pieces)
        ctx.pieces = pieces
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        grads = [torch.zeros_like(x) for x in (q, k, v)]
        for piece in ctx.pieces:
            inputs = [
                q[:, piece.rows].detach().requires_grad_(True),
                k[:, piece.keys].detach().requires_grad_(True),
                v[:, piece.keys].detach().requires_grad_(True),
            ]
            grad = grad_out[:, piece.rows]
            seen = piece.fresh - piece.rows.start
            if seen > 0:  # rows an earlier piece already carried back
                grad = grad.clone()
                grad[:, :seen] = 0
            with torch.enable_grad():
                out = piece.attend(*inputs)
            dq, dk, dv = torch.autograd.grad(out, inputs, grad, allow_unused=True)
            for target, where, got in zip(grads, (piece.rows, piece.keys, piece.keys), (dq, dk, dv)):
                if got is not None:  # a piece whose keys are all masked reaches no key
                    target[:, where] += got
        ctx.pieces = None
        return (*grads, None)
