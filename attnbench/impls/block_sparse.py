"""Block-sparse attention: one softmax over the key blocks a pattern keeps (docs/design/semantics.md).

The pattern (attnbench.masks.patterns) lists, for each query block, its kept key blocks as a few
progressions. Three kernels run the same math:

- ``flex`` (the GPU path): PyTorch's compiled FlexAttention with a ``BlockMask`` built
  directly from the block lists (``BlockMask.from_kv_blocks``; nothing is evaluated over
  N^2 pairs). Kept blocks are "full" blocks, where no mask function runs; only a causal
  pattern's diagonal blocks are partial, masked by ``q mod b >= k mod b``. Queries run in
  chunks of equal length, each against a window of k and v as long as the widest chunk's
  span of key blocks (``local_window``: its neighbourhood; the wider patterns: all of it);
  under autograd a wide chunk's backward takes its window in parts. The layout, masks and
  pieces are in ``attnbench.impls.block_sparse_flex``, the FlexAttention calls in
  ``attnbench.impls.flex_kernel``.
- ``triton`` (GPU, no autograd, fp16/bf16; else ``flex``): a Triton forward (``attnbench.impls.flash``)
  over compressed-row block lists, all rows in one launch per chunk, longest first. On an H100
  it runs at FlexAttention's pace, not beyond (docs/findings/kernels.md), so ``auto`` stays ``flex``.
- ``gather`` (the CPU path): for a chunk of query blocks, gather their kept key blocks and
  run one masked softmax over all of them (SDPA with a boolean mask), chunked so the
  gathered keys stay under a fixed budget.

Query blocks that keep every allowed block (the global rows of ``global_local``) run as
plain dense attention (SDPA), except in the flex path's training chunks (longer than 256K
tokens), where the block mask holds them as well, so that no piece reads every key with an
SDPA backward. Training in one chunk runs each piece under its kernel's own autograd.

Grouped K/V (fewer key/value heads than query heads) are shared by every path: FlexAttention
and SDPA with ``enable_gqa``, the gather path gathering key blocks of the key/value heads only.
"""

from __future__ import annotations

import functools

import torch

from attnbench.errors import ConfigError
from attnbench.impls import flash, gqa
from attnbench.impls.base import AttentionImpl
from attnbench.impls.block_sparse_flex import FlexLayout, flex_layout, flex_pieces
from attnbench.impls.config import Config
from attnbench.impls.families.block_sparse import COMPILE_MODES, INDEX_WIDTHS, KERNELS
from attnbench.impls.flex_kernel import (
    KernelOptions,
    flex_compile_mode,
    flex_options,
    parse_kernel_options,
)
from attnbench.impls.pieces import (
    Piece,
    PiecewiseAttention,
    write_pieces,
)
from attnbench.masks import MULTISCALE, PATTERN_TYPES
from attnbench.masks.block_lists import BlockPattern
from attnbench.masks.patterns import build_pattern, check_scales

BLOCK_SIZES = (16, 32, 64, 128, 256)
GATHER_BUDGET_BYTES = 256 << 20


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
        if kernel == "triton" and not flash.triton_installed():
            raise ConfigError(
                "block-sparse: kernel=triton needs Triton, which this environment lacks: pip install triton "
                "(a CUDA build of torch brings it), or leave kernel at auto"
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

    def config(self) -> Config:
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
        return self.kernel in ("flex", "triton") or (self.kernel == "auto" and torch.cuda.is_available())

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

    def granularity_reason(self) -> str:
        if self.segment_lengths:
            return ", the longest segment"
        return ", the block size"

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        super().check_shape(seq_len, num_heads)
        self.pattern(seq_len, causal=False)  # a pattern that cannot keep the ratio is refused here

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
        use_flex = self.kernel in ("flex", "triton") or (self.kernel == "auto" and q.is_cuda)
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        if self.kernel == "triton" and not grad and q.is_cuda and flash.applies(q, k, v):
            # one launch per chunk of rows over compressed-row block lists, the global rows in it
            self.last_backend = "triton"
            return flash.block_sparse(q, k, v, p, self.block_size, flash.block_lists(p, q.device, self._masks))
        if use_flex:
            key = (seq_len, is_causal, str(q.device), grad)
            if key not in self._layouts:  # short calls are timed with their Python overhead: keep it small
                self._layouts[key] = flex_layout(self, p, q.device, grad)
            layout = self._layouts[key]
            pieces = flex_pieces(self, q, p, layout, grad)
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

    def _flex_options(self, q, grad: bool = False) -> KernelOptions | None:
        # local_window: each row's full blocks (and its partial diagonal) are consecutive, so
        # the kernel can step to the next block without loading its index
        return flex_options(q, self.block_size, self.user_kernel_options, self.pattern_type == "local_window", grad)

    def _flex_compile_mode(self, q, grad: bool) -> str:
        """The compile mode of the flex calls (``flex_kernel.flex_compile_mode``)."""
        return flex_compile_mode(q, self.block_size, grad, self.compile_mode)


def _gather_attend(p: BlockPattern, r0: int, r1: int, width: int, b: int, q, k, v):
    """Query blocks [r0, r1) (q holds their rows) over their kept key blocks of k, v (all keys)."""
    batch, _, num_heads, head_dim = q.shape
    nb, rows, kv_heads = p.num_blocks, r1 - r0, k.shape[2]
    key_blocks = k.view(batch, nb, b, kv_heads, head_dim)
    value_blocks = v.view(batch, nb, b, kv_heads, head_dim)
    offsets = torch.arange(b, device=q.device)
    idx, counts = p.expand(r0, r1, width, device=q.device)
    kept = torch.arange(width, device=q.device)[None, :] < counts[:, None]  # (rows, width)
    allowed = kept[:, None, :, None].expand(rows, b, width, b)  # (rows, t, block, u)
    if p.causal:
        key_pos = idx[:, None, :, None] * b + offsets
        query_pos = (torch.arange(r0, r1, device=q.device)[:, None] * b + offsets)[:, :, None, None]
        allowed = allowed & (key_pos <= query_pos)
    mask = allowed.reshape(rows, 1, b, width * b).repeat(batch, 1, 1, 1)

    def heads_first(x, length, heads=num_heads):  # (B, rows, length, H, D) -> (B*rows, H, length, D)
        return x.reshape(batch, rows, length, heads, head_dim).transpose(2, 3).reshape(-1, heads, length, head_dim)

    out = gqa.sdpa(
        heads_first(q, b),
        heads_first(key_blocks[:, idx], width * b, kv_heads),
        heads_first(value_blocks[:, idx], width * b, kv_heads),
        attn_mask=mask,
    )
    return (
        out.reshape(batch, rows, num_heads, b, head_dim).transpose(2, 3).reshape(batch, rows * b, num_heads, head_dim)
    )


def _dense_rows(q, k, v, causal: bool) -> torch.Tensor:
    """The queries that keep every allowed key (q holds them; k, v every key, or the prefix
    when causal): dense attention."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return gqa.sdpa(qh, kh, vh, is_causal=causal).transpose(1, 2)


def build_block_sparse(
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
