"""Block-sparse attention: one softmax over the key blocks a pattern keeps (docs/semantics.md).

The pattern (attnbench.patterns) lists, for each query block, its kept key blocks as a few
progressions. Two kernels run the same math:

- ``flex`` (the GPU path): PyTorch's compiled FlexAttention with a ``BlockMask`` built
  directly from the block lists (``BlockMask.from_kv_blocks``; nothing is evaluated over
  N^2 pairs). Kept blocks are "full" blocks, where no mask function runs; only a causal
  pattern's diagonal blocks are partial, masked by ``q mod b >= k mod b``. Queries run in
  chunks of equal length, each against a window of k and v as long as the widest chunk's
  span of key blocks (``local_window``: its neighbourhood; the wider patterns: all of it),
  so one chunk's block mask stays under a fixed budget and one compiled kernel serves every
  chunk; masks that fit are cached per (N, device). Index rows are full width (one column
  per block of the window), the layout torch 2.11's lowering computes correctly. Past 2^31
  element offsets ``flex_attend`` runs per (batch, head).
- ``gather`` (the CPU path): for a chunk of query blocks, gather their kept key blocks and
  run one masked softmax over all of them (SDPA with a boolean mask), chunked so the
  gathered keys stay under a fixed budget.

Query blocks that keep every allowed block (the global rows of ``global_local``) run as
plain dense attention (SDPA), except under autograd on the flex path in several chunks,
where the block mask holds them as well (no piece then reads every key with an SDPA backward).

Under autograd a chunk's backward makes dk, dv as long as its key window; where the window
is more than twice the chunk (the wide patterns read every key) the backward takes it in
parts (``attnbench.impls.pieces``), so that one training step holds a few chunks' worth
beyond the floor at any length.

The FlexAttention calls themselves are in ``attnbench.impls.flex_kernel``. This module is
over 400 lines because it is one implementation: its shape rules, counts, both kernels'
pieces (the flex layout and block masks, the gather path) and its registry entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnbench.block_lists import BlockPattern, progression_spans
from attnbench.errors import ConfigError
from attnbench.impls import register
from attnbench.impls.base import AttentionImpl, ImplSpec, Param
from attnbench.impls.flex_kernel import (
    compact_indices_ok,
    compiled_flex,
    diagonal_causal,
    flex_attend,
    flex_compile_mode,
    flex_options,
    has_compute_q_blocks,
    parse_kernel_options,
)
from attnbench.impls.pieces import (
    KeyPart,
    Piece,
    PiecewiseAttention,
    grads_by_recompute,
    training_chunk_tokens,
    write_pieces,
)
from attnbench.patterns import MULTISCALE, PATTERN_TYPES, build_pattern, check_scales

BLOCK_SIZES = (16, 32, 64, 128, 256)
KERNELS = ("auto", "flex", "gather")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
INDEX_WIDTHS = ("auto", "full", "compact")
# Bytes one chunk's temporaries may take: the flex block-mask indices, the gathered keys.
INDEX_BUDGET_BYTES = 256 << 20
GATHER_BUDGET_BYTES = 256 << 20
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


class BlockSparseAttention(AttentionImpl):
    def __init__(
        self,
        pattern_type: str = "local_window",
        sparsity_ratio: float = 0.05,
        block_size: int = 128,
        segment_lengths: list[int] | None = None,
        dilation_rates: list[int] | None = None,
        kernel: str = "auto",
        kernel_options: str = "",
        compile_mode: str = "default",
        max_chunk_tokens: int = 1 << 20,
        index_width: str = "auto",
    ) -> None:
        super().__init__()
        if pattern_type not in PATTERN_TYPES:
            raise ConfigError(
                f"block-sparse: unknown pattern_type {pattern_type!r}: choose one of {', '.join(PATTERN_TYPES)}"
            )
        if not 0 < sparsity_ratio <= 1:
            raise ConfigError(
                f"block-sparse: sparsity_ratio {sparsity_ratio} is the kept fraction of block pairs and "
                "must be in (0, 1], e.g. 0.05 keeps 5% (95% sparse)"
            )
        if block_size not in BLOCK_SIZES:
            raise ConfigError(
                f"block-sparse: block_size {block_size} unsupported: choose one of {', '.join(map(str, BLOCK_SIZES))}"
            )
        for w in segment_lengths or []:
            if w <= 0 or w % block_size:
                raise ConfigError(
                    f"block-sparse: segment length {w} is not a multiple of block_size {block_size}; "
                    f"choose multiples of {block_size}"
                )
        if max_chunk_tokens < block_size:
            raise ConfigError(f"block-sparse: max_chunk_tokens must be at least block_size ({block_size})")
        if kernel not in KERNELS or compile_mode not in COMPILE_MODES or index_width not in INDEX_WIDTHS:
            raise ConfigError(
                f"block-sparse: kernel is one of {', '.join(KERNELS)}, compile_mode one of "
                f"{', '.join(COMPILE_MODES)}, index_width one of {', '.join(INDEX_WIDTHS)}"
            )
        self.pattern_type = pattern_type
        self.sparsity_ratio = float(sparsity_ratio)
        self.block_size = block_size
        self.segment_lengths = list(segment_lengths) if segment_lengths else None
        self.dilation_rates = list(dilation_rates) if dilation_rates else None
        self.kernel = kernel
        self.kernel_options = kernel_options
        self.user_kernel_options = parse_kernel_options(kernel_options)
        self.compile_mode = compile_mode
        self.max_chunk_tokens = max_chunk_tokens
        self.index_width = index_width
        if self.segment_lengths or self.dilation_rates:  # nesting etc., before any length is known
            if pattern_type not in MULTISCALE:
                raise ConfigError(
                    f"block-sparse: {pattern_type} takes no segment_lengths or dilation_rates (only "
                    f"{' and '.join(MULTISCALE)} do): drop them"
                )
            segments = self._segment_blocks()
            check_scales(pattern_type, segments[-1] if segments else 1, segments, self.dilation_rates)
        self._patterns: dict[tuple[int, bool], BlockPattern] = {}
        self._masks: dict[tuple, list] = {}
        self._layouts: dict[tuple, FlexLayout] = {}

    def config(self) -> dict[str, Any]:
        return {
            "pattern_type": self.pattern_type,
            "sparsity_ratio": self.sparsity_ratio,
            "block_size": self.block_size,
            "segment_lengths": self.segment_lengths,
            "dilation_rates": self.dilation_rates,
            "kernel": self.kernel,
            "kernel_options": self.kernel_options,
            "compile_mode": self.compile_mode,
            "max_chunk_tokens": self.max_chunk_tokens,
            "index_width": self.index_width,
        }

    @property
    def compiles(self) -> bool:  # type: ignore[override]
        return self.kernel == "flex" or (self.kernel == "auto" and torch.cuda.is_available())

    # --- shape rules -------------------------------------------------------------------
    @property
    def granularity(self) -> int:
        return self.segment_lengths[-1] if self.segment_lengths else self.block_size

    def verify_seq_len(self) -> int:
        # 32 blocks (16 of 256 tokens): long enough for every pattern to take shape, short
        # enough for the float64 reference; a given segment length sets its own minimum
        n = self.block_size * (16 if self.block_size >= 256 else 32)
        g = self.granularity
        return max(g, -(-n // g) * g)

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        self.check_length(seq_len)
        super().check_shape(seq_len, num_heads)
        self.pattern(seq_len, causal=False)  # a pattern that cannot keep the ratio is refused here

    def check_length(self, seq_len: int) -> None:
        """The length rules, before any pattern is built."""
        if seq_len <= 0 or seq_len % self.block_size:
            raise ConfigError(
                f"block-sparse: block_size {self.block_size} does not divide sequence length {seq_len}; "
                f"choose a multiple of {self.granularity}"
            )
        if seq_len % self.granularity:
            raise ConfigError(
                f"block-sparse: sequence length {seq_len} is not a multiple of the longest segment "
                f"{self.granularity}; choose a multiple of {self.granularity}"
            )

    def _segment_blocks(self) -> list[int] | None:
        return [w // self.block_size for w in self.segment_lengths] if self.segment_lengths else None

    def pattern(self, seq_len: int, causal: bool) -> BlockPattern:
        key = (seq_len, causal)
        if key not in self._patterns:
            try:
                self._patterns[key] = build_pattern(
                    self.pattern_type,
                    seq_len // self.block_size,
                    self.sparsity_ratio,
                    causal,
                    self._segment_blocks(),
                    self.dilation_rates,
                )
            except ConfigError as exc:
                raise ConfigError(f"block-sparse at N={seq_len}, block {self.block_size}: {exc}") from None
        return self._patterns[key]

    # --- key sets and counts -------------------------------------------------------------
    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        self.check_shape(seq_len, num_heads)
        b = self.block_size
        mask = self.pattern(seq_len, causal).dense().repeat_interleave(b, 0).repeat_interleave(b, 1)
        if causal:
            mask &= torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        return mask.expand(num_heads, seq_len, seq_len)

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        return self.key_mask(seq_len, num_heads, causal=False)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        p, b = self.pattern(seq_len, causal), self.block_size
        if not causal:
            return num_heads * p.kept_blocks * b * b
        # every row keeps its diagonal block, of which the causal mask leaves b(b+1)/2 pairs
        return num_heads * ((p.kept_blocks - p.num_blocks) * b * b + p.num_blocks * b * (b + 1) // 2)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return num_heads * self.pattern(seq_len, causal).kept_blocks * self.block_size**2

    # --- forward -------------------------------------------------------------------------
    def forward(self, q, k, v, is_causal: bool = False):
        batch, seq_len, num_heads, _ = q.shape
        self.check_shape(seq_len, num_heads)
        p = self.pattern(seq_len, is_causal)
        use_flex = self.kernel == "flex" or (self.kernel == "auto" and q.is_cuda)
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        if use_flex:
            key = (seq_len, is_causal, str(q.device), grad)
            if key not in self._layouts:  # short calls are timed with their Python overhead: keep it small
                self._layouts[key] = self._flex_layout(p, q.device, grad)
            layout = self._layouts[key]
            pieces = _flex_pieces(self, q, p, layout, grad)
            dense_rows = layout.first_row
        else:
            pieces = self._gather_pieces(q, p)
            dense_rows = p.dense_rows
        if dense_rows:
            tokens = dense_rows * self.block_size
            pieces.insert(
                0,
                Piece(
                    slice(0, tokens),
                    slice(0, tokens) if is_causal else slice(None),
                    functools.partial(_dense_rows, causal=is_causal),
                ),
            )
        self.last_backend = ("flex" if use_flex else "gather") + ("+sdpa" if dense_rows else "")
        if len(pieces) == 1 and pieces[0].rows == slice(0, seq_len):
            return pieces[0].run(q, k, v)  # one piece holds every row: its output is the output, no copy
        if grad and use_flex and len(layout.starts) == 1:
            # one chunk and the dense rows: each under its kernel's own autograd (no
            # recomputation), joined; a copy of the output more than one piece, short sequences only
            return torch.cat([piece.run(q, k, v) for piece in pieces], dim=1)
        if grad:
            return PiecewiseAttention.apply(q, k, v, pieces)
        return write_pieces(q, k, v, pieces)

    def _gather_pieces(self, q, p: BlockPattern) -> list[Piece]:
        """One piece per chunk of query blocks: gathered keys, one masked softmax."""
        batch, _, num_heads, head_dim = q.shape
        b, nb, first = self.block_size, p.num_blocks, p.dense_rows
        width = int(p.row_counts[first:].max()) if first < nb else 1
        per_row = batch * width * b * (2 * num_heads * head_dim * q.element_size() + num_heads * b * 4 + b)
        rows_per_chunk = max(1, min(GATHER_BUDGET_BYTES // per_row, self.max_chunk_tokens // b))
        return [
            Piece(
                slice(r0 * b, min(nb, r0 + rows_per_chunk) * b),
                slice(None),
                functools.partial(_gather_attend, p, r0, min(nb, r0 + rows_per_chunk), width, b),
            )
            for r0 in range(first, nb, rows_per_chunk)
        ]

    def _flex_layout(self, p: BlockPattern, device, grad: bool) -> FlexLayout:
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
        if self.index_width == "compact" and not narrow_ok:
            raise ConfigError(
                "block-sparse: index_width=compact needs a GPU whose FlexAttention lowering takes "
                "narrow index rows; use index_width=auto"
            )
        compact = self.index_width == "compact" or (
            self.index_width == "auto" and narrow_ok and not grad and nb * nb * 8 > FULL_WIDTH_MASK_BYTES
        )
        chunk_tokens = (
            self.max_chunk_tokens if not grad else _training_chunk_tokens(nb * self.block_size, self.max_chunk_tokens)
        )
        # rows that keep every allowed block run as dense SDPA: in one flex call their long
        # rows are a tail (at 64K on an H200 global_local trained 12% slower with them inside).
        # Not under autograd in several chunks, where SDPA's backward would make dk, dv of the
        # whole sequence and the long rows are a few in one part of one chunk.
        first = 0 if grad and chunk_tokens < nb * self.block_size else p.dense_rows
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

        limit = max(1, min(total, chunk_tokens // self.block_size))
        while limit > 1 and limit * (2 * index_width(limit) * 4 + most * 8 * 6) > INDEX_BUDGET_BYTES:
            limit //= 2  # two int32 index rows + the expansion's temporaries per query block
        count = -(-total // limit)
        rows = -(-total // count)
        # equal chunks (one compiled shape); the last may overlap its neighbour by fewer rows
        # than there are chunks, recomputing them identically
        starts = [first + min(c * rows, total - rows) for c in range(count)]
        spans = [
            (int(lo[r0 - first : r0 - first + rows].min()), int(hi[r0 - first : r0 - first + rows].max()))
            for r0 in starts
        ]
        window = max(k1 - k0 for k0, k1 in spans)
        key_starts = [min(k0, nb - window) for k0, _ in spans]
        width = 1 << (most - 1).bit_length() if compact else window
        part, part_starts = window, ()
        if grad and window > 2 * rows:
            part = max(rows, -(-window // TRAINING_KEY_PARTS))
            part_starts = tuple(min(j * part, window - part) for j in range(-(-window // part)))
        return FlexLayout(first, width, rows, starts, window, key_starts, part, part_starts)

    def _chunk_masks(self, p: BlockPattern, layout: FlexLayout, device, grad: bool):
        key = (p.num_blocks, p.causal, str(device), grad)
        if key in self._masks:
            return self._masks[key]
        masks = (
            self._block_mask(p, r0, layout.rows, layout.width, device, grad, k0, layout.window)
            for r0, k0 in zip(layout.starts, layout.key_starts)
        )
        if len(layout.starts) * layout.rows * layout.width * 4 * 2 <= MASK_CACHE_BYTES:
            masks = self._masks[key] = list(masks)
        return masks

    def _block_mask(
        self,
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

        b = self.block_size
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

    def _flex_options(self, q, grad: bool = False) -> dict[str, Any] | None:
        # local_window: each row's full blocks (and its partial diagonal) are consecutive, so
        # the kernel can step to the next block without loading its index
        return flex_options(q, self.block_size, self.user_kernel_options, self.pattern_type == "local_window", grad)

    def _flex_compile_mode(self, q, grad: bool) -> str:
        """The compile mode of the flex calls (``flex_kernel.flex_compile_mode``)."""
        return flex_compile_mode(q, self.block_size, grad, self.compile_mode)


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


def _flex_pieces(impl, q, p, layout, grad: bool) -> list[Piece]:
    """One piece per chunk of query blocks: compiled FlexAttention over the chunk's key window."""
    flex, options, b = compiled_flex(impl._flex_compile_mode(q, grad)), impl._flex_options(q, grad), impl.block_size
    masks = impl._chunk_masks(p, layout, q.device, grad)
    cached = masks if isinstance(masks, list) else None
    tokens, keys = layout.rows * b, layout.window * b
    pieces, fresh = [], 0
    for i, (r0, k0) in enumerate(zip(layout.starts, layout.key_starts)):
        if cached is not None:
            mask = functools.partial(list.__getitem__, cached, i)
        else:  # built when the piece runs (again in the backward), so masks do not pile up
            mask = functools.partial(
                impl._block_mask, p, r0, layout.rows, layout.width, q.device, grad, k0, layout.window
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
        mask = functools.partial(impl._block_mask, p, r0, layout.rows, size, device, True, k0 + start, size, (lo, hi))
        attend = functools.partial(_flex_piece_lse, flex, mask, options)
        yield KeyPart(slice((k0 + start) * b, (k0 + start + size) * b), functools.partial(grads_by_recompute, attend))


def _flex_piece(flex, mask, options, q, k, v):
    return flex_attend(flex, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask(), options).transpose(1, 2)


def _flex_piece_lse(flex, mask, options, q, k, v):
    """The piece's output and its log-sum-exp ``(B, rows, H)``."""
    heads_first = (x.transpose(1, 2) for x in (q, k, v))
    out, lse = flex_attend(flex, *heads_first, mask(), options, with_lse=True)
    return out.transpose(1, 2), lse.transpose(1, 2)


def _gather_attend(p: BlockPattern, r0: int, r1: int, width: int, b: int, q, k, v):
    """Query blocks [r0, r1) (q holds their rows) over their kept key blocks of k, v (all keys)."""
    batch, _, num_heads, head_dim = q.shape
    nb, rows = p.num_blocks, r1 - r0
    key_blocks = k.view(batch, nb, b, num_heads, head_dim)
    value_blocks = v.view(batch, nb, b, num_heads, head_dim)
    offsets = torch.arange(b, device=q.device)
    idx, counts = p.expand(r0, r1, width, device=q.device)
    kept = torch.arange(width, device=q.device)[None, :] < counts[:, None]  # (rows, width)
    allowed = kept[:, None, :, None].expand(rows, b, width, b)  # (rows, t, block, u)
    if p.causal:
        key_pos = idx[:, None, :, None] * b + offsets
        query_pos = (torch.arange(r0, r1, device=q.device)[:, None] * b + offsets)[:, :, None, None]
        allowed = allowed & (key_pos <= query_pos)
    mask = allowed.reshape(rows, 1, b, width * b).repeat(batch, 1, 1, 1)

    def heads_first(x, length):  # (B, rows, length, H, D) -> (B*rows, H, length, D)
        return (
            x.reshape(batch, rows, length, num_heads, head_dim).transpose(2, 3).reshape(-1, num_heads, length, head_dim)
        )

    out = F.scaled_dot_product_attention(
        heads_first(q, b),
        heads_first(key_blocks[:, idx], width * b),
        heads_first(value_blocks[:, idx], width * b),
        attn_mask=mask,
    )
    return (
        out.reshape(batch, rows, num_heads, b, head_dim).transpose(2, 3).reshape(batch, rows * b, num_heads, head_dim)
    )


def _dense_rows(q, k, v, causal: bool) -> torch.Tensor:
    """The queries that keep every allowed key (q holds them; k, v every key, or the prefix
    when causal): dense attention."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(1, 2)


def _block_sparse(
    pattern_type="local_window",
    sparsity_ratio=0.05,
    block_size=128,
    segment_lengths=None,
    dilation_rates=None,
    kernel="auto",
    kernel_options="",
    compile_mode="default",
    max_chunk_tokens=1 << 20,
    index_width="auto",
) -> BlockSparseAttention:
    return BlockSparseAttention(
        pattern_type,
        sparsity_ratio,
        block_size,
        segment_lengths,
        dilation_rates,
        kernel,
        kernel_options,
        compile_mode,
        max_chunk_tokens,
        index_width,
    )


def _verify_configs(device: str) -> tuple[dict[str, Any], ...]:
    """Every pattern x two block sizes x two ratios (causal and not come from the cases).
    On a GPU each shape compiles a kernel, so there one block size and one ratio."""
    sizes, ratios = ((16, 32), (0.1, 0.25)) if device == "cpu" else ((32,), (0.1,))
    return tuple(
        {"pattern_type": t, "block_size": b, "sparsity_ratio": r} for t in PATTERN_TYPES for b in sizes for r in ratios
    )


register(
    ImplSpec(
        name="block-sparse",
        factory=_block_sparse,
        summary="block-sparse attention (local_window, dilated_sparse, global_local, hierarchical): FlexAttention on GPU",
        params=(
            Param("pattern_type", "local_window", "block pattern", kind="str", choices=PATTERN_TYPES),
            Param("sparsity_ratio", 0.05, "kept fraction of block pairs (0.05 = 95% sparse)", kind="float"),
            Param("block_size", 128, "tokens per block: 16, 32, 64, 128 or 256"),
            Param(
                "segment_lengths",
                None,
                "dilated_sparse/hierarchical: segment lengths in tokens (optional)",
                kind="ints",
            ),
            Param(
                "dilation_rates", None, "dilated_sparse/hierarchical: dilation rates in blocks (optional)", kind="ints"
            ),
            Param(
                "kernel",
                "auto",
                "flex (compiled FlexAttention) or gather; auto: flex on GPU",
                kind="str",
                choices=KERNELS,
            ),
            Param(
                "kernel_options",
                "",
                "FlexAttention kernel options, e.g. BLOCK_M=128,BLOCK_N=64,num_warps=8",
                kind="str",
            ),
            Param("compile_mode", "default", "torch.compile mode for flex", kind="str", choices=COMPILE_MODES),
            Param("max_chunk_tokens", 1 << 20, "query tokens per kernel call (bounds temporary memory)"),
            Param(
                "index_width",
                "auto",
                "flex mask rows: one column per key block (full), as many as a row keeps "
                "(compact, GPU only), auto: full while small",
                kind="str",
                choices=INDEX_WIDTHS,
            ),
        ),
        verify_configs=_verify_configs,
    )
)
