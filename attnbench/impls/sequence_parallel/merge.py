"""The log-sum-exp merge of partial attention results, in place and in one launch on CUDA.

A ring attends its queries to one block of keys at a time; each block gives an output and the
log-sum-exp of its scores. Two such results over disjoint key sets combine exactly:

    lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

computed in float32 whatever the storage. A row no key has reached has lse = -inf and weight 0,
so an empty block leaves a row as it was and a row empty in both stays zero (never NaN).

On CUDA with Triton this is one kernel (one launch per merge: a ring step's host cost is
what limits it at short lengths); elsewhere the same arithmetic in a few torch operations.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _kernel():
    """The Triton kernel, compiled on first use; None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def merge_kernel(
        Acc,
        Lse,
        Out,
        LseB,
        rows,
        heads,
        dim,
        sab,
        sah,
        sam,
        sad,
        slb,
        slh,
        slm,
        sob,
        soh,
        som,
        sod,
        sbb,
        sbh,
        sbm,
        BLOCK_M: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # 64-bit offsets: a long shard's (B, H, M, D) output passes 2^31 elements
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // heads, bh % heads
        m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        row_ok = m < rows
        ok = row_ok[:, None] & (d < dim)[None, :]
        la = tl.load(Lse + b * slb + h * slh + m * slm, mask=row_ok, other=float("-inf"))
        lb = tl.load(LseB + b * sbb + h * sbh + m * sbm, mask=row_ok, other=float("-inf"))
        top = tl.maximum(la, lb)
        top = tl.where(top == float("-inf"), 0.0, top)
        ea, eb = tl.exp(la - top), tl.exp(lb - top)
        total = ea + eb
        reached = total > 0
        wa = tl.where(reached, ea / total, 0.0)
        wb = tl.where(reached, eb / total, 0.0)
        a_ptr = Acc + b * sab + h * sah + m[:, None] * sam + d[None, :] * sad
        a = tl.load(a_ptr, mask=ok, other=0.0).to(tl.float32)
        o = tl.load(Out + b * sob + h * soh + m[:, None] * som + d[None, :] * sod, mask=ok, other=0.0)
        merged = a * wa[:, None] + o.to(tl.float32) * wb[:, None]
        tl.store(a_ptr, merged.to(Acc.dtype.element_ty), mask=ok)
        tl.store(Lse + b * slb + h * slh + m * slm, tl.where(reached, top + tl.log(total), float("-inf")), mask=row_ok)

    return merge_kernel


def merge_into(acc: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """``acc`` (B, H, M, D) and ``lse`` (B, H, M, float32) become the merge of themselves with
    ``out_b`` and ``lse_b`` (same shapes); any strides (row slices of a larger buffer too)."""
    kernel = _kernel() if acc.is_cuda else None
    if kernel is None:
        _merge_eager(acc, lse, out_b, lse_b)
        return
    import triton

    batch, heads, rows, dim = acc.shape
    block_m = 64
    grid = (triton.cdiv(rows, block_m), batch * heads)
    kernel[grid](
        acc,
        lse,
        out_b,
        lse_b,
        rows,
        heads,
        dim,
        *acc.stride(),
        *lse.stride(),
        *out_b.stride(),
        *lse_b.stride(),
        BLOCK_M=block_m,
        BLOCK_D=triton.next_power_of_2(dim),
    )


def _merge_eager(acc, lse, out_b, lse_b) -> None:
    new = torch.logaddexp(lse, lse_b)
    # exp(-inf - -inf) is NaN: a row empty on both sides keeps weight 0 and stays as it was
    wa = torch.exp(lse - new).nan_to_num_(0.0).unsqueeze(-1)
    wb = torch.exp(lse_b - new).nan_to_num_(0.0).unsqueeze(-1)
    if acc.dtype == torch.float32:
        acc.mul_(wa).addcmul_(out_b.float(), wb)
    else:
        acc.copy_(acc.float() * wa + out_b.float() * wb)
    lse.copy_(new)
