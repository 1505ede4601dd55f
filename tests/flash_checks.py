"""The Triton forward kernels' checks against the float64 masked reference, shared by
tests/test_flash_kernels.py: run here as a script they check every CPU case under Triton's
interpreter and print one JSON object, case name -> relative error.

    TRITON_INTERPRET=1 python tests/flash_checks.py

The interpreter must be on before triton.language is first imported (its own helpers, such as
``tl.zeros``, are jit functions that the interpreter calls only when they were defined under
it), so the cases run in a fresh process. float16 only: the interpreter's bfloat16 ``tl.dot``
is wrong in Triton 3.7 (a 16x16 product off by ~1e10); bfloat16 is checked on the GPU.
Outputs start poisoned (NaN), so a row a kernel leaves unwritten fails its check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnbench import impls  # noqa: E402
from attnbench.impls import flash  # noqa: E402
from attnbench.trials.reference import masked_reference, relative_error  # noqa: E402

PATTERNS = ("local_window", "dilated_sparse", "global_local", "hierarchical")


def inputs(batch, seq_len, heads, kv_heads, head_dim, dtype=torch.float16, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_len, heads, head_dim, generator=gen)
    k = torch.randn(batch, seq_len, kv_heads, head_dim, generator=gen)
    v = torch.randn(batch, seq_len, kv_heads, head_dim, generator=gen)
    return tuple(x.to(dtype).to(device) for x in (q, k, v))


def reference(impl, q, k, v, causal):
    """The float64 masked reference, each key head repeated for the query heads that read it."""
    seq_len, heads = q.shape[1], q.shape[2]
    repeat = heads // k.shape[2]
    mask = impl.key_mask(seq_len, heads, causal)
    return masked_reference(q, k.repeat_interleave(repeat, 2), v.repeat_interleave(repeat, 2), mask)


def dilated_error(segments, rates, shape, causal, tiles=None, dtype=torch.float16, device="cpu"):
    batch, seq_len, heads, kv_heads, head_dim = shape
    impl = impls.build("dilated", segment_lengths=segments, dilation_rates=rates)
    q, k, v = inputs(batch, seq_len, heads, kv_heads, head_dim, dtype, device)
    out = torch.full_like(q, float("nan"))
    for g in impl.groups(heads):
        flash.dilated_group(q, k, v, out, g.heads, g.segment_length, g.dilation_rate, g.offset, causal, tiles)
    return relative_error(out, reference(impl, q, k, v, causal))


def block_sparse_error(pattern, block_size, shape, causal, tiles=None, dtype=torch.float16, device="cpu", ratio=0.25):
    batch, seq_len, heads, kv_heads, head_dim = shape
    impl = impls.build("block-sparse", pattern_type=pattern, block_size=block_size, sparsity_ratio=ratio)
    q, k, v = inputs(batch, seq_len, heads, kv_heads, head_dim, dtype, device)
    p = impl.pattern(seq_len, causal)
    out = flash.block_sparse(q, k, v, p, block_size, flash.block_lists(p, q.device), tiles)
    return relative_error(out, reference(impl, q, k, v, causal))


# (segment lengths, dilation rates, (B, N, H, Hkv, D), tiles): one tile per segment, several
# tiles with a partial last one, kept tokens fewer than the smallest tile, several groups
DILATED_CASES = {
    "two groups, fewer key heads": ([16, 32], [1, 2], (2, 64, 4, 2, 16), None),
    "kept under one tile": ([32], [4], (1, 96, 3, 3, 16), None),
    "three groups, one key head": ([16, 32, 64], [1, 2, 4], (1, 128, 3, 1, 32), None),
    "partial last tile": ([48, 96], [1, 2], (1, 96, 2, 2, 16), flash.Tiles(16, 16)),
    "head dim 64, tiles of 16": ([64], [2], (1, 128, 2, 1, 64), flash.Tiles(16, 16)),
}


def cases():
    """Case name -> a function computing its relative error."""
    out = {}
    for causal in (False, True):
        for name, (segments, rates, shape, tiles) in DILATED_CASES.items():
            out[f"dilated {name} causal={causal}"] = (dilated_error, segments, rates, shape, causal, tiles)
        for pattern in PATTERNS:
            out[f"block-sparse {pattern} causal={causal}"] = (
                block_sparse_error,
                pattern,
                16,
                (1, 256, 2, 1, 16),
                causal,
            )
            # blocks of 32 in tiles of 16: two query and two key tiles per block, the diagonal cut between them
            out[f"block-sparse {pattern} tiles inside blocks causal={causal}"] = (
                block_sparse_error,
                pattern,
                32,
                (2, 256, 2, 2, 32),
                causal,
                flash.Tiles(16, 16),
            )
    return out


def chunked_case():
    """global_local with block lists cut into chunks of a few rows."""
    flash.CHUNK_ENTRIES = 8
    impl = impls.build("block-sparse", pattern_type="global_local", block_size=16, sparsity_ratio=0.25)
    chunks = len(flash.block_list_chunks(impl.pattern(256, True)))
    return chunks, block_sparse_error("global_local", 16, (1, 256, 2, 1, 16), True)


def main() -> None:
    results = {name: fn(*args) for name, (fn, *args) in cases().items()}
    chunks, err = chunked_case()
    results["block-sparse global_local in chunks causal=True"] = err
    results["chunks"] = chunks
    print(json.dumps(results))


if __name__ == "__main__":
    main()
