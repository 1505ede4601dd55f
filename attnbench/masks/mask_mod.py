"""Key sets declared as a ``mask_mod(b, h, q_idx, kv_idx)`` (FlexAttention's convention).

A mask_mod answers "is key ``kv_idx`` in the key set of query ``q_idx`` of head ``h``" with
tensor operations, so it can be evaluated on whole index tensors at once. Key sets do not
depend on the batch entry (semantics: one set per head and query), so ``b`` is always 0.

Pairs are counted from the mask_mod in one of two ways, and the count says which:

- ``exact``: every (query, key) pair evaluated, in row chunks: on the CPU at any length, on
  CUDA up to EXACT_MAX_SEQ_LEN_CUDA (chunks of a few hundred MB of temporaries: at 512K tokens
  a quarter of a million million pairs a head, seconds on a current GPU, and no compilation);
- ``blocks``: on CUDA above that length, FlexAttention's block mask (built by a compiled
  kernel, never N x N) classifies BLOCK x BLOCK tiles as empty, full or partial; full tiles
  count BLOCK^2 pairs and only partial tiles are evaluated pair by pair. The same number as
  the exact count; the label says how it was obtained. (Uncompiled, building the block mask
  materialises N x N, so on the CPU the count stays exact, chunked.) Compiling the block-mask
  kernel in a fresh process takes tens of seconds to minutes, which is why exact counting
  reaches as far as it does on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MaskMod = Callable[..., torch.Tensor]

# On CUDA, above this length the exact count (N^2 evaluations per head) gives way to block counts.
EXACT_MAX_SEQ_LEN_CUDA = 1 << 19
BLOCK = 128
# pairs evaluated at once: 4 Mi on the CPU; 64 Mi on a GPU (about 1.2 GB of index temporaries,
# counted after the trial's inputs are freed and its peak recorded)
_PAIRS_PER_CHUNK = {"cpu": 1 << 22, "cuda": 1 << 26}


def with_causal(mask_mod: MaskMod) -> MaskMod:
    """The mask_mod intersected with ``kv_idx <= q_idx``."""

    def causal_mask_mod(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) & (kv_idx <= q_idx)

    return causal_mask_mod


def _rows(mask_mod: MaskMod, h: int, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """Boolean (len(q_idx), len(kv_idx)) of one head, broadcast over index tensors."""
    device = q_idx.device
    b = torch.zeros((), dtype=torch.long, device=device)
    head = torch.full((), h, dtype=torch.long, device=device)
    out = mask_mod(b, head, q_idx[:, None], kv_idx[None, :])
    return torch.as_tensor(out, device=device).to(torch.bool).expand(len(q_idx), len(kv_idx))


def key_mask(mask_mod: MaskMod, seq_len: int, num_heads: int) -> torch.Tensor:
    """Boolean (H, N, N) key sets at small N."""
    idx = torch.arange(seq_len)
    return torch.stack([_rows(mask_mod, h, idx, idx) for h in range(num_heads)])


def count_exact(mask_mod: MaskMod, seq_len: int, num_heads: int, device: str = "cpu") -> int:
    """Pairs in the key sets, every pair evaluated, ``_PAIRS_PER_CHUNK`` at a time."""
    idx = torch.arange(seq_len, device=device)
    step = max(1, _PAIRS_PER_CHUNK.get(device, _PAIRS_PER_CHUNK["cpu"]) // seq_len)
    total = 0
    for h in range(num_heads):
        for start in range(0, seq_len, step):
            total += int(_rows(mask_mod, h, idx[start : start + step], idx).sum())
    return total


def heads_differ(mask_mod: MaskMod, seq_len: int = 256) -> bool:
    """Whether the key sets depend on the head (heads 0 and 1 compared at a small length)."""
    sets = key_mask(mask_mod, seq_len, 2)
    return not torch.equal(sets[0], sets[1])


def count_blocks(mask_mod: MaskMod, seq_len: int, num_heads: int, device: str = "cpu") -> int:
    """Pairs from FlexAttention's block mask: full tiles counted, partial tiles evaluated.
    One head's block mask at a time (``N/BLOCK`` squared indices each), one for all heads when
    the mask does not depend on the head."""
    if num_heads > 1 and not heads_differ(mask_mod):
        return num_heads * count_blocks(mask_mod, seq_len, 1, device)
    return sum(_head_block_pairs(mask_mod, h, seq_len, device) for h in range(num_heads))


def _head_block_pairs(mask_mod: MaskMod, h: int, seq_len: int, device: str) -> int:
    from torch.nn.attention.flex_attention import create_block_mask

    def head_mask_mod(b, _h, q_idx, kv_idx):
        return mask_mod(b, torch.full_like(q_idx, h), q_idx, kv_idx)

    block_mask = create_block_mask(
        head_mask_mod, 1, 1, seq_len, seq_len, device=device, BLOCK_SIZE=BLOCK, _compile=device == "cuda"
    )
    idx = torch.arange(seq_len, device=device)
    # tile extents: the last tile is short when BLOCK does not divide N
    extent = (idx[::BLOCK] + BLOCK).clamp(max=seq_len) - idx[::BLOCK]
    total = 0
    if block_mask.full_kv_num_blocks is not None:
        num, cols = block_mask.full_kv_num_blocks[0, 0], block_mask.full_kv_indices[0, 0]
        used = torch.arange(cols.shape[1], device=device)[None, :] < num[:, None]
        sizes = extent[: num.shape[0], None] * extent[cols.clamp(max=len(extent) - 1)]
        total += int((sizes * used).sum())
    return total + _partial_pairs(mask_mod, h, block_mask.kv_num_blocks[0, 0], block_mask.kv_indices[0, 0], seq_len)


def _partial_pairs(mask_mod: MaskMod, h: int, num: torch.Tensor, cols: torch.Tensor, seq_len: int) -> int:
    """Pairs in the partial tiles of one head, a few query blocks of tiles at a time."""
    device = num.device
    offs = torch.arange(BLOCK, device=device)
    b = torch.zeros((), dtype=torch.long, device=device)
    head = torch.full((), h, dtype=torch.long, device=device)
    width = max(1, int(num.max())) if num.numel() else 1
    step = max(1, _PAIRS_PER_CHUNK["cpu"] // (width * BLOCK * BLOCK))
    total = 0
    for start in range(0, num.shape[0], step):
        qb = torch.arange(start, min(start + step, num.shape[0]), device=device)
        used = torch.arange(width, device=device)[None, :] < num[qb, None]  # (Q, W)
        q_idx = (qb[:, None] * BLOCK + offs[None, :])[:, None, :, None]  # (Q, 1, B, 1)
        kv_idx = (cols[qb, :width, None] * BLOCK + offs)[:, :, None, :]  # (Q, W, 1, B)
        inside = (q_idx < seq_len) & (kv_idx < seq_len) & used[:, :, None, None]
        keep = torch.as_tensor(mask_mod(b, head, q_idx.clamp(max=seq_len - 1), kv_idx.clamp(max=seq_len - 1)))
        total += int((keep.to(torch.bool) & inside).sum())
    return total


def count_pairs(mask_mod: MaskMod, seq_len: int, num_heads: int, causal: bool, device: str = "cpu") -> tuple[int, str]:
    """(pairs, how counted): exact on the CPU and on CUDA up to EXACT_MAX_SEQ_LEN_CUDA, block counts above."""
    mod = with_causal(mask_mod) if causal else mask_mod
    if seq_len <= EXACT_MAX_SEQ_LEN_CUDA or device != "cuda":
        return count_exact(mod, seq_len, num_heads, device), "exact"
    return count_blocks(mod, seq_len, num_heads, device), "blocks"
