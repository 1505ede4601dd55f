"""Which keys each query sees, declared without an implementation: the block-sparse patterns
(``patterns``: the rules) and their block lists (``block_lists``: ``BlockPattern`` and the
arithmetic on progressions), the Hilbert order dilated attention may run in (``hilbert``), and
FlexAttention's ``mask_mod`` convention (``mask_mod``: key sets and pair counts from one).

This module holds the ready-made attention-gym style masks, ``mask_mod(b, h, q_idx, kv_idx) ->
bool tensor`` and functions that return one: ``--impl flex --param mask=attnbench.masks:NAME``
(with ``--param mask_args=...`` for the functions), and examples of the convention.
"""

from __future__ import annotations

# The block-sparse patterns ``patterns`` builds, by name: here, free of torch, where the
# registry's declarations read them. The multi-scale ones take segment lengths and dilation rates.
PATTERN_TYPES = ("local_window", "dilated_sparse", "global_local", "hierarchical")
MULTISCALE = ("dilated_sparse", "hierarchical")


def sliding_window(window_size: int):
    """Each query sees the keys at most ``window_size`` positions away (both sides)."""

    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= window_size

    return sliding_window_mask


def document(doc_len: int):
    """Documents of ``doc_len`` tokens packed in one sequence: a query sees its own document."""

    def document_mask(b, h, q_idx, kv_idx):
        return (q_idx // doc_len) == (kv_idx // doc_len)

    return document_mask


def causal(b, h, q_idx, kv_idx):
    """Every earlier key (the plain causal mask)."""
    return kv_idx <= q_idx
