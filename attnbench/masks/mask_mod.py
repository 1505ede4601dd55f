"""Key sets declared as a ``mask_mod(b, h, q_idx, kv_idx)`` (FlexAttention's convention).

A mask_mod answers "is key ``kv_idx`` in the key set of query ``q_idx`` of head ``h``" with
tensor operations, so it can be evaluated on whole index tensors at once. Key sets do not
depend on the batch entry (semantics: one set per head and query), so ``b`` is always 0.

Pairs are counted from a mask_mod (``count_pairs``) one of two ways, and the count says which:

- ``blocks``: tiles of pairs classified from bounds on their positions as FlexAttention's block
  mask classifies them (full, empty, partial), full ones counted whole and partial ones cut
  down to small tiles evaluated pair by pair (``attnbench.masks.bounds``): exact, and seconds
  at 10M tokens for a window or a document mask;
- ``exact``: every (query, key) pair evaluated, in row chunks, where the mask_mod does
  something bounds cannot follow, up to EXACT_MAX_EVALUATIONS evaluations; beyond that the
  count is refused (``CountRefused``, naming the operation) rather than run for hours.

Counting runs on the CPU, outside any trial's timer and memory limit (``trials.counting``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.masks import bounds
from attnbench.masks.bounds import CountRefused, check_time, time_limit

__all__ = ["CountRefused", "count_exact", "count_pairs", "key_mask", "time_limit", "with_causal"]

MaskMod = Callable[..., torch.Tensor]

BLOCK = 128  # FlexAttention's tile: the unit flex's lengths are multiples of
# pairs evaluated at once when counting pair by pair (a few hundred MB of index temporaries)
_PAIRS_PER_CHUNK = 1 << 22
# The most evaluations a pair-by-pair count makes (about a minute on a CPU); a mask_mod that
# bounds cannot follow is not counted beyond this.
EXACT_MAX_EVALUATIONS = 1 << 34


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


def count_exact(mask_mod: MaskMod, seq_len: int, num_heads: int) -> int:
    """Pairs in the key sets, every pair evaluated, ``_PAIRS_PER_CHUNK`` at a time."""
    idx = torch.arange(seq_len)
    step = max(1, _PAIRS_PER_CHUNK // seq_len)
    total = 0
    for h in range(num_heads):
        for start in range(0, seq_len, step):
            check_time()
            total += int(_rows(mask_mod, h, idx[start : start + step], idx).sum())
    return total


def heads_differ(mask_mod: MaskMod, seq_len: int = 256) -> bool:
    """Whether the key sets depend on the head (heads 0 and 1 compared at a small length)."""
    sets = key_mask(mask_mod, seq_len, 2)
    return not torch.equal(sets[0], sets[1])


def count_pairs(mask_mod: MaskMod, seq_len: int, num_heads: int) -> tuple[int, str]:
    """(pairs, how counted: blocks or exact) of the key sets ``mask_mod`` declares; CountRefused
    where bounds cannot follow it and a pair-by-pair count would be too long."""
    try:
        return bounds.count_blocks(mask_mod, seq_len, num_heads), "blocks"
    except bounds.Unbounded as exc:
        evaluations = seq_len * seq_len * num_heads
        if evaluations > EXACT_MAX_EVALUATIONS:
            raise CountRefused(
                f"the mask_mod uses {exc}, which attnbench cannot bound over tiles, and a pair-by-pair count "
                f"at N={seq_len:,}, H={num_heads} needs {evaluations:.1e} evaluations"
            ) from None
        return count_exact(mask_mod, seq_len, num_heads), "exact"
