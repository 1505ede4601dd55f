"""Attention computed in pieces (chunks of query rows, each against a range of keys), and its
training step at the memory floor.

Under autograd, writing each piece's output into one output tensor keeps every piece's
output twice (the piece's own, saved by its kernel, and the copy) and makes the backward
clone the whole output gradient once per write. ``PiecewiseAttention`` instead keeps only
q, k, v and its own output: the backward recomputes one piece at a time under autograd and
adds its dq, dk, dv into preallocated gradients, so what it holds beyond the floor is one
piece's worth.

A piece that reads many keys (a wide block-sparse pattern reads them all) would still make
dk and dv as long as the sequence in its backward. Such a piece lists its keys in parts
(``KeyPart``): the forward keeps the piece's log-sum-exp, and the backward takes one part at
a time, given the piece's log-sum-exp and ``delta = dO . out`` per row (``grads_by_recompute``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

#: (q rows, k keys, v keys), each (B, n, H, D) -> (the rows' output (B, rows, H, D), their
#: natural log-sum-exp (B, rows, H) in float32)
AttendLse = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class KeyPart:
    """A range of a piece's keys whose backward runs on its own."""

    keys: slice
    #: (output gradient, q rows, k part, v part, the rows' log-sum-exp over all the piece's keys,
    #: their delta = dO . out) -> this part's share of dq and its dk, dv
    grads: Callable[..., tuple[torch.Tensor | None, ...]]


@dataclass(frozen=True)
class Piece:
    rows: slice  # query tokens it computes
    keys: slice  # key tokens it reads
    #: (q rows, k keys, v keys), each (B, n, H, D) -> the rows' output (B, rows, H, D)
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    #: the first row no earlier piece computed; rows before it are recomputed identically
    #: (equal-length chunks whose last overlaps its neighbour) and count once in the backward
    fresh: int = 0
    #: disjoint ranges covering every key the piece reaches, for a backward that takes one at a
    #: time; with them ``attend_lse`` gives the forward the piece's log-sum-exp too
    key_parts: tuple[KeyPart, ...] = ()
    attend_lse: AttendLse | None = None

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


def grads_by_recompute(attend_lse: AttendLse, grad, q, k, v, lse, delta):
    """One key part's dq, dk, dv, recomputing the part under autograd. The piece's output is
    ``out = sum_j w_j out_j`` over its parts, ``w_j = exp(lse_j - lse)`` the part's share of each
    row's softmax, so the part's output gets ``w_j dO`` and its log-sum-exp
    ``w_j (dO . out_j - delta)`` (the share moves as lse_j does); a part that keeps no key of a
    row has lse_j = -inf there and gets nothing."""
    inputs = [x.detach().requires_grad_(True) for x in (q, k, v)]
    with torch.enable_grad():
        part_out, part_lse = attend_lse(*inputs)
    share = torch.exp(part_lse.detach() - lse)
    grad_out = grad * share.unsqueeze(-1).to(grad.dtype)
    grad_lse = share * (row_dot(grad, part_out.detach()) - delta)
    return torch.autograd.grad((part_out, part_lse), inputs, (grad_out, grad_lse), allow_unused=True)


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per (batch, row, head) dot product over the head dimension, in float32 (or float64)."""
    wide = torch.promote_types(a.dtype, torch.float32)
    return torch.linalg.vecdot(a.to(wide), b.to(wide))


class PiecewiseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pieces):
        lses = []
        with torch.no_grad():
            out = torch.empty_like(q)
            for piece in pieces:
                if piece.key_parts:
                    out[:, piece.rows], lse = piece.attend_lse(q[:, piece.rows], k[:, piece.keys], v[:, piece.keys])
                    lses.append(lse)
                else:
                    out[:, piece.rows] = piece.run(q, k, v)
                    lses.append(None)
        ctx.pieces, ctx.lses = pieces, lses
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        grads = [torch.zeros_like(x) for x in (q, k, v)]
        for piece, lse in zip(ctx.pieces, ctx.lses):
            grad = grad_out[:, piece.rows]
            seen = piece.fresh - piece.rows.start
            if seen > 0:  # rows an earlier piece already carried back
                grad = grad.clone()
                grad[:, :seen] = 0
            if piece.key_parts:
                rows_q, delta = q[:, piece.rows], row_dot(grad, out[:, piece.rows])
                for part in piece.key_parts:  # one part's dk, dv at a time, each dropped once added
                    where = (piece.rows, part.keys, part.keys)
                    _add(grads, where, part.grads(grad, rows_q, k[:, part.keys], v[:, part.keys], lse, delta))
            else:
                _add(grads, (piece.rows, piece.keys, piece.keys), _recomputed_grads(piece, grad, q, k, v))
        ctx.pieces = ctx.lses = None
        return (*grads, None)


def _recomputed_grads(piece: Piece, grad, q, k, v):
    """A piece's dq, dk, dv, recomputing it under autograd (its temporaries die on return)."""
    inputs = [x.detach().requires_grad_(True) for x in (q[:, piece.rows], k[:, piece.keys], v[:, piece.keys])]
    with torch.enable_grad():
        out = piece.attend(*inputs)
    return torch.autograd.grad(out, inputs, grad, allow_unused=True)


def _add(grads: list[torch.Tensor], where: tuple[slice, slice, slice], got) -> None:
    for target, at, g in zip(grads, where, got):
        if g is not None:  # a piece whose keys are all masked reaches no key
            target[:, at] += g
