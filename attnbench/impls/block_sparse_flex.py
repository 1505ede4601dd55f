"""The FlexAttention path of block-sparse: how a pattern is cut into chunks of query blocks,
each against a window of key blocks (``flex_layout``, ``FlexLayout``), the block masks built
from the block lists (``block_mask``, ``chunk_masks``), and the pieces the forward runs, with
their key parts under autograd (``flex_pieces``).

Chunks have equal length, so one compiled kernel serves every chunk; masks that fit are
cached per (N, device) on the implementation. Index rows are full width (one column per
block of the window), the layout torch 2.11's lowering computes correctly. Under autograd a
chunk's backward makes dk, dv as long as its key window; where the window is more than twice
the chunk (the wide patterns read every key) the backward takes it in parts
(``attnbench.impls.pieces``), so that one training step holds a few chunks' worth beyond the
floor at any length. Query blocks that keep every allowed block (the global rows of
``global_local``) run as dense SDPA beside the chunks, except in training chunks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from attnbench.errors import ConfigError
from attnbench.impls.flex_kernel import (
    compact_indices_ok,
    compiled_flex,
    diagonal_causal,
    flex_attend,
    has_compute_q_blocks,
)
from attnbench.impls.pieces import KeyPart, Piece, grads_by_recompute, training_chunk_tokens
from attnbench.masks.block_lists import BlockPattern, progression_spans

# Bytes one chunk's block-mask indices (and their expansion's temporaries) may take.
INDEX_BUDGET_BYTES = 256 << 20
# Block masks of all chunks are kept between calls when they fit in this.
MASK_CACHE_BYTES = 256 << 20
# Full-width index rows (one column per key block) while a whole mask takes at most this.
FULL_WIDTH_MASK_BYTES = 64 << 20
# Under autograd, up to this length one chunk runs under flex's own autograd (no
# recomputation); above it chunks of a 16th of the sequence, so that what the backward holds
# beyond the floor (a chunk's recomputed output, its dq and its window's dk, dv) stays a few
# percent of it: with 256K-token chunks the peak at 1M was 1.32x the training floor on an H200
TRAINING_ONE_CHUNK_TOKENS = 1 << 18
# Under autograd, a chunk whose key window is over twice its length (the wide patterns read
# every key) has its backward take the window in this many parts: each part's dk, dv are an
# eighth of k, v, and the parts' own costs (a mask, a recomputed output and log-sum-exp) stay
# few. At 1M on an H200, parts of the chunk's length (16) cost up to 1.7x the step time of the
# whole window for 1.07x the floor instead of 1.28x.
TRAINING_KEY_PARTS = 8


def flex_layout(impl, p: BlockPattern, device, grad: bool) -> FlexLayout:
    """How the flex path cuts the pattern. Index rows have one column per key block (the
    layout create_block_mask makes) while that is small: every pattern and ratio at one
    length then shares one compiled kernel, global rows included. Longer sequences get
    rows as narrow as the compiler allows (a power of two, so few shapes) where a release
    takes them. Global rows go to SDPA, except in training chunks. The backward's transposed
    indices assume full rows in some releases: never compact under autograd. Under autograd
    a key window over twice the chunk is cut into TRAINING_KEY_PARTS parts (at least a chunk
    long) for the backward; the last part overlaps its neighbour and keeps only the blocks
    after it."""
    nb = p.num_blocks
    narrow_ok = compact_indices_ok(torch.device(device).type)
    if impl.index_width == "compact" and not narrow_ok:
        raise ConfigError(
            "block-sparse: index_width=compact needs a GPU whose FlexAttention lowering takes "
            "narrow index rows; use index_width=auto"
        )
    compact = impl.index_width == "compact" or (
        impl.index_width == "auto" and narrow_ok and not grad and nb * nb * 8 > FULL_WIDTH_MASK_BYTES
    )
    chunk_tokens = (
        impl.max_chunk_tokens if not grad else _training_chunk_tokens(nb * impl.block_size, impl.max_chunk_tokens)
    )
    # rows that keep every allowed block run as dense SDPA: in one flex call their long
    # rows are a tail (at 64K on an H200 global_local trained 12% slower with them inside).
    # Not under autograd in several chunks, where SDPA's backward would make dk, dv of the
    # whole sequence and the long rows are a few in one part of one chunk.
    first = 0 if grad and chunk_tokens < nb * impl.block_size else p.dense_rows
    most = int(p.row_counts[p.dense_rows :].max())  # the global rows are few: left out of the budget
    lo, hi = progression_spans(p.progressions[first:])
    # chunks read a window of the keys, as long as the widest chunk's span (local_window:
    # its neighbourhood, so offsets stay small, index rows short and a chunk's dk, dv in
    # training small at any N); index rows stay full width over the window
    widest = int((hi - lo).max())
    total = nb - first

    def window_for(rows: int) -> int:
        return min(nb, rows + widest)

    def index_width(rows: int) -> int:
        return 1 << (most - 1).bit_length() if compact else window_for(rows)

    limit = max(1, min(total, chunk_tokens // impl.block_size))
    while limit > 1 and limit * (2 * index_width(limit) * 4 + most * 8 * 6) > INDEX_BUDGET_BYTES:
        limit //= 2  # two int32 index rows + the expansion's temporaries per query block
    count = -(-total // limit)
    rows = -(-total // count)
    # equal chunks (one compiled shape); the last may overlap its neighbour by fewer rows
    # than there are chunks, recomputing them identically
    starts = [first + min(c * rows, total - rows) for c in range(count)]
    spans = [
        (int(lo[r0 - first : r0 - first + rows].min()), int(hi[r0 - first : r0 - first + rows].max())) for r0 in starts
    ]
    window = max(k1 - k0 for k0, k1 in spans)
    key_starts = [min(k0, nb - window) for k0, _ in spans]
    width = 1 << (most - 1).bit_length() if compact else window
    part, part_starts = window, ()
    if grad and window > 2 * rows:
        part = max(rows, -(-window // TRAINING_KEY_PARTS))
        part_starts = tuple(min(j * part, window - part) for j in range(-(-window // part)))
    return FlexLayout(first, width, rows, starts, window, key_starts, part, part_starts)


def chunk_masks(impl, p: BlockPattern, layout: FlexLayout, device, grad: bool):
    key = (p.num_blocks, p.causal, str(device), grad)
    if key in impl._masks:
        return impl._masks[key]
    masks = (
        block_mask(impl, p, r0, layout.rows, layout.width, device, grad, k0, layout.window)
        for r0, k0 in zip(layout.starts, layout.key_starts)
    )
    if len(layout.starts) * layout.rows * layout.width * 4 * 2 <= MASK_CACHE_BYTES:
        masks = impl._masks[key] = list(masks)
    return masks


def block_mask(
    impl,
    p: BlockPattern,
    r0: int,
    rows: int,
    width: int,
    device,
    grad: bool,
    k0: int = 0,
    window: int | None = None,
    keys: tuple[int, int] | None = None,
):
    """The BlockMask of query blocks [r0, r0 + rows) against key blocks [k0, k0 + window)
    (indices count from k0), built from the block lists: kept blocks are full; a causal
    pattern's diagonal is partial. ``keys`` keeps only key blocks in [lo, hi) (a part of the
    window)."""
    from torch.nn.attention.flex_attention import BlockMask

    b = impl.block_size
    window = window or p.num_blocks
    full_idx, full_count = p.expand(r0, r0 + rows, width=width, device=device, drop_diagonal=p.causal, keys=keys)
    full_idx = (full_idx - k0).clamp(min=0)  # padding after a row's count stays in range
    part_idx = torch.zeros(rows, 1 if width < window else window, dtype=torch.int32, device=device)
    part_count = torch.full((rows,), int(p.causal), dtype=torch.int32, device=device)
    if p.causal:
        diagonal = torch.arange(r0, r0 + rows, device=device)
        part_idx[:, 0] = (diagonal - k0).clamp(0, window - 1)
        if keys is not None:
            part_count = ((diagonal >= keys[0]) & (diagonal < keys[1])).to(torch.int32)
    extra = {"compute_q_blocks": grad} if has_compute_q_blocks() else {}
    return BlockMask.from_kv_blocks(
        part_count[None, None],
        part_idx[None, None],
        full_count.to(torch.int32)[None, None],
        full_idx.to(torch.int32)[None, None],
        BLOCK_SIZE=b,
        mask_mod=diagonal_causal(b) if p.causal else None,
        seq_lengths=(rows * b, window * b),
        **extra,
    )


def _training_chunk_tokens(seq_len: int, max_chunk_tokens: int) -> int:
    if seq_len <= TRAINING_ONE_CHUNK_TOKENS:
        return min(seq_len, max_chunk_tokens)
    return training_chunk_tokens(seq_len, max_chunk_tokens)


@dataclass(frozen=True)
class FlexLayout:
    first_row: int  # rows before it keep every allowed block and run as dense SDPA
    width: int  # columns of an index row
    rows: int  # query blocks per chunk
    starts: list[int]  # first query block of each chunk
    window: int  # key blocks a chunk reads
    key_starts: list[int]  # first key block of each chunk's window
    #: under autograd, where the window is over twice the chunk: key blocks of a part, and each
    #: part's first block in the window (none: the backward takes the window whole)
    part_blocks: int = 0
    part_starts: tuple[int, ...] = ()


def flex_pieces(impl, q, p, layout, grad: bool) -> list[Piece]:
    """One piece per chunk of query blocks: compiled FlexAttention over the chunk's key window."""
    flex, options, b = compiled_flex(impl._flex_compile_mode(q, grad)), impl._flex_options(q, grad), impl.block_size
    masks = chunk_masks(impl, p, layout, q.device, grad)
    cached = masks if isinstance(masks, list) else None
    tokens, keys = layout.rows * b, layout.window * b
    pieces, fresh = [], 0
    for i, (r0, k0) in enumerate(zip(layout.starts, layout.key_starts)):
        if cached is not None:
            mask = functools.partial(list.__getitem__, cached, i)
        else:  # built when the piece runs (again in the backward), so masks do not pile up
            mask = functools.partial(
                block_mask, impl, p, r0, layout.rows, layout.width, q.device, grad, k0, layout.window
            )
        rows = slice(r0 * b, r0 * b + tokens)
        parts = tuple(_flex_key_parts(impl, flex, options, p, layout, r0, k0, q.device)) if grad else ()
        pieces.append(
            Piece(
                rows,
                slice(k0 * b, k0 * b + keys),
                functools.partial(_flex_piece, flex, mask, options),
                fresh=max(fresh, rows.start),
                key_parts=parts,
                attend_lse=functools.partial(_flex_piece_lse, flex, mask, options) if parts else None,
            )
        )
        fresh = rows.stop
    return pieces


def _flex_key_parts(impl, flex, options, p, layout, r0: int, k0: int, device):
    """The parts of one chunk's key window that its rows reach, each with its own block mask
    (built when the backward runs it)."""
    b, size = impl.block_size, layout.part_blocks
    for j, start in enumerate(layout.part_starts):
        lo, hi = k0 + j * size, k0 + min((j + 1) * size, layout.window)
        if not p.kept_in(r0, r0 + layout.rows, lo, hi):
            continue
        mask = functools.partial(block_mask, impl, p, r0, layout.rows, size, device, True, k0 + start, size, (lo, hi))
        attend = functools.partial(_flex_piece_lse, flex, mask, options)
        yield KeyPart(slice((k0 + start) * b, (k0 + start + size) * b), functools.partial(grads_by_recompute, attend))


def _flex_piece(flex, mask, options, q, k, v):
    return flex_attend(flex, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask(), options).transpose(1, 2)


def _flex_piece_lse(flex, mask, options, q, k, v):
    """The piece's output and its log-sum-exp ``(B, rows, H)``."""
    heads_first = (x.transpose(1, 2) for x in (q, k, v))
    out, lse = flex_attend(flex, *heads_first, mask(), options, with_lse=True)
    return out.transpose(1, 2), lse.transpose(1, 2)
