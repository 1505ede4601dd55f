"""The Triton flash-attention forwards (``attnbench.impls.flash_kernels``) from the host:
where they apply, their tiles, and their launches.

- ``dilated_group``: one head group of dilated attention, read with the dilation stride and
  written in place (the SDPA path copies each chunk's output into its strided place and
  zeroes the whole output first).
- ``block_sparse``: every query block over its kept key blocks in one launch per chunk of
  rows, from a compressed-row block list (``block_lists``), longest rows first.

Forward only: under autograd the implementations keep their fused SDPA and FlexAttention
paths, whose backwards these kernels do not replace. The kernels run on CUDA in float16 and
bfloat16 (a float32 ``tl.dot`` would round through tf32) at head dims 16 to 128, and on the
CPU under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check them
without a GPU.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from attnbench.masks.block_lists import BlockPattern, flatten_progressions, progression_lengths

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16)
# Kept blocks of one chunk's compressed-row list: its expansion takes about 48 bytes per
# entry for a moment, so a chunk's temporaries stay near 200 MB at any length
CHUNK_ENTRIES = 1 << 22
# Block lists of all chunks are kept between calls while they take at most this
LIST_CACHE_BYTES = 64 << 20
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Tiles:
    """A kernel's tile shape and launch: query rows and key rows per step, warps, pipeline depth,
    and whether q, k, v and the output move through tensor-memory-access descriptors."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    tma: bool = False


# Chosen on one H100 (bf16, D=64; docs/findings/kernels.md): dilated at 1M ran within 1% at (128, 64) and
# (128, 128), 4 or 8 warps, 3 stages; two stages or 64-row tiles were slower. The block-sparse
# loop is long like dense attention's, where (128, 128, 4 warps) was the fastest at 64K; its
# 128-wide key tiles would take 224 KB of shared memory at head dim 128, so 64 there.
DILATED_TILES = Tiles(128, 64, 4, 3)


def block_sparse_tiles(head_dim: int) -> Tiles:
    return Tiles(128, 128, 4, 3) if head_dim <= 64 else Tiles(128, 64, 4, 3)


@functools.cache
def triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def applies(q, k, v) -> bool:
    """Whether the kernels run these inputs: CUDA (or the interpreter), float16 or bfloat16,
    a head dim they take, a dense last axis, query heads a multiple of key heads."""
    return (
        (q.is_cuda or interpreting())
        and q.dtype in DTYPES
        and q.dtype == k.dtype == v.dtype
        and q.shape[-1] in HEAD_DIMS
        and all(x.stride(-1) == 1 for x in (q, k, v))
        and q.shape[2] % k.shape[2] == 0
        and triton_installed()
    )


def _tile(wanted: int, length: int) -> int:
    """A power-of-two tile no longer than needed for ``length`` rows, at least 16 (tl.dot)."""
    return max(16, min(wanted, 1 << max(0, length - 1).bit_length()))


def _strides(x) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def dilated_group(q, k, v, out, heads: slice, segment_length: int, rate: int, offset: int, causal: bool, tiles=None):
    """Write heads ``heads`` of ``out`` (B, N, H, D): per segment, dense attention among the
    tokens ``offset, offset + rate, ...`` (causal in that order), and zero rows for the
    segment's other tokens. k, v may have fewer heads (query head h reads h // (H / Hkv))."""
    from attnbench.impls.flash_kernels import dilated_kernel

    tiles = tiles or DILATED_TILES
    batch, seq_len, num_heads, head_dim = q.shape
    kept = segment_length // rate
    block_m = _tile(tiles.block_m, kept)
    block_n = _tile(tiles.block_n, kept)
    if causal:  # the diagonal's key tiles must split the query tile
        block_n = min(block_n, block_m)
    even = kept % block_m == 0 and kept % block_n == 0
    m_tiles = -(-kept // block_m)
    segments = seq_len // segment_length
    group_heads = heads.stop - heads.start
    use_tma = tiles.tma and even and not interpreting() and _standard_layout(q, k, v, out)
    descriptors = _dilated_descriptors(q, k, v, out, rate, offset, block_m, block_n) if use_tma else (None,) * 4
    grid = (batch * segments * group_heads * m_tiles,)
    dilated_kernel[grid](
        q,
        k,
        v,
        out,
        *descriptors,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(out),
        heads.start,
        group_heads,
        num_heads // k.shape[2],
        segments,
        segment_length,
        seq_len,
        kept,
        rate,
        offset,
        m_tiles,
        LOG2E / math.sqrt(head_dim),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        CAUSAL=causal,
        EVEN=even,
        USE_TMA=use_tma,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out


def _standard_layout(*tensors) -> bool:
    """Contiguous (B, N, H, D) tensors on 16-byte boundaries, what the descriptors index."""
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in tensors)


def _dilated_descriptors(q, k, v, out, rate: int, offset: int, block_m: int, block_n: int):
    """2-D descriptors whose rows are ``rate`` tokens wide, starting at token ``offset``: row
    ``(b N + s w) / rate + i`` holds kept token ``i`` of segment ``s`` of batch ``b``, and its
    columns ``h D .. (h + 1) D`` head ``h``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def describe(x, block):
        batch, seq_len, heads, head_dim = x.shape
        rows = x.view(batch * seq_len // rate, rate * heads * head_dim)[:, offset * heads * head_dim :]
        return TensorDescriptor(rows, [rows.shape[0], heads * head_dim], [rows.stride(0), 1], [block, head_dim])

    return describe(q, block_m), describe(k, block_n), describe(v, block_n), describe(out, block_m)


@dataclass(frozen=True)
class BlockList:
    """Rows ``[first_row, stop_row)`` of a pattern as the block-sparse kernel reads them:
    ``order`` the rows longest first, ``row_start`` each row's first entry in ``blocks`` (and
    one past the last row's end), ``blocks`` the kept key blocks off the diagonal (int32)."""

    first_row: int
    stop_row: int
    order: torch.Tensor
    row_start: torch.Tensor
    blocks: torch.Tensor


def block_list_chunks(p: BlockPattern) -> list[tuple[int, int]]:
    """Row ranges whose lists hold at most CHUNK_ENTRIES kept blocks each (a row at least)."""
    counts = _listed_counts(p)
    ends, start, total = [], 0, 0
    for row, count in enumerate(counts.tolist()):
        if row > start and total + count > CHUNK_ENTRIES:
            ends.append((start, row))
            start, total = row, 0
        total += count
    ends.append((start, p.num_blocks))
    return ends


def list_bytes(p: BlockPattern) -> int:
    return int(_listed_counts(p).sum()) * 4 + p.num_blocks * 12


def _listed_progressions(p: BlockPattern, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1)'s progressions less what the kernel does without a list: the diagonal
    block of a causal row, and every block of a dense row."""
    prog = p.progressions[r0:r1].clone()
    if p.causal:
        rows = torch.arange(r0, r1)
        prog[:, :, 1] = torch.minimum(prog[:, :, 1], rows[:, None])  # causal stops are <= i + 1
    dense = max(0, min(p.dense_rows, r1) - r0)
    prog[:dense, :, 1] = prog[:dense, :, 0]
    return prog


def _listed_counts(p: BlockPattern) -> torch.Tensor:
    return progression_lengths(_listed_progressions(p, 0, p.num_blocks)).sum(dim=1)


def block_list(p: BlockPattern, r0: int, r1: int, device) -> BlockList:
    prog = _listed_progressions(p, r0, r1)
    counts = progression_lengths(prog).sum(dim=1)  # on the CPU: no wait on the GPU's queue
    rows = torch.arange(r0, r1)
    work = torch.where(rows < p.dense_rows, rows if p.causal else torch.full_like(rows, p.num_blocks), counts)
    order = r0 + torch.argsort(-work, stable=True)  # longest first: a long row never starts last
    row_start = torch.zeros(r1 - r0 + 1, dtype=torch.int64)
    row_start[1:] = torch.cumsum(counts, 0)
    values, _ = flatten_progressions(prog, device)
    return BlockList(
        r0, r1, order.to(torch.int32).to(device), row_start.to(device), values.to(torch.int32).contiguous()
    )


def block_sparse(q, k, v, p: BlockPattern, block_size: int, lists, tiles=None):
    """Output (B, N, H, D) of block-sparse attention over ``lists`` (BlockList, one per chunk
    of rows, or callables that build one when called)."""
    from attnbench.impls.flash_kernels import block_sparse_kernel

    batch, _, num_heads, head_dim = q.shape
    tiles = tiles or block_sparse_tiles(head_dim)
    block_m, block_n = min(tiles.block_m, block_size), min(tiles.block_n, block_size)
    out = torch.empty_like(q)
    for chunk in lists:
        chunk = chunk() if callable(chunk) else chunk
        grid = ((chunk.stop_row - chunk.first_row) * (block_size // block_m) * batch * num_heads,)
        block_sparse_kernel[grid](
            q,
            k,
            v,
            out,
            chunk.order,
            chunk.row_start,
            chunk.blocks,
            *_strides(q),
            *_strides(k),
            *_strides(v),
            *_strides(out),
            num_heads,
            num_heads // k.shape[2],
            batch * num_heads,
            chunk.first_row,
            p.dense_rows,
            p.num_blocks,
            LOG2E / math.sqrt(head_dim),
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            CAUSAL=p.causal,
            num_warps=tiles.num_warps,
            num_stages=tiles.num_stages,
        )
    return out


def block_lists(p: BlockPattern, device, cache: dict | None = None):
    """The chunks' block lists: kept (in ``cache``, keyed by the pattern's length and
    causality) while small, otherwise built chunk by chunk as the forward reaches them."""
    key = ("flash", p.num_blocks, p.causal, str(device))
    if cache is not None and key in cache:
        return cache[key]
    chunks = block_list_chunks(p)
    if list_bytes(p) > LIST_CACHE_BYTES:
        return [functools.partial(block_list, p, r0, r1, device) for r0, r1 in chunks]
    lists = [block_list(p, r0, r1, device) for r0, r1 in chunks]
    if cache is not None:
        cache[key] = lists
    return lists
