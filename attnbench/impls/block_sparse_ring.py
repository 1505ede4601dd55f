"""block-sparse-ring: block-sparse attention over a sequence split across ranks.

The key sets are ``block-sparse``'s with the same configuration (docs/design/semantics.md): the pattern
is built for the whole sequence, and rank r holds its contiguous blocks ``[r m, (r+1) m)``
(``m`` = blocks per rank). Contiguous also when causal: a causal pattern keeps no block above
the diagonal, so later ranks do more of the work (the price of receiving only what the
pattern needs; a zigzag layout would balance it but split every local window in two).

Per ring step a rank receives from rank s exactly the K/V blocks of s that its own rows keep
(the pattern's progressions clipped to s's range, united over the rows), nothing when they
keep none: ``local_window`` exchanges a window's edge, ``hierarchical`` the coarse grid of
the far segments. It attends its queries to those blocks with the pattern remapped onto them
(compiled FlexAttention on a GPU, an exact gathered float32 softmax on the CPU) and merges
(out, log-sum-exp) into the rows they reach. The output shard stays in the inputs' dtype
with a float32 log-sum-exp per row, so a shard costs no float32 copy of itself: a row that
merges keys from k ranks is rounded k times to the dtype, within its verify tolerance.
"""

from __future__ import annotations

import math

import torch

from attnbench.errors import ConfigError
from attnbench.impls.base import lcm
from attnbench.impls.block_sparse import GATHER_BUDGET_BYTES, BlockSparseAttention
from attnbench.impls.block_sparse_flex import INDEX_BUDGET_BYTES, MASK_CACHE_BYTES
from attnbench.impls.config import Config
from attnbench.impls.families.block_sparse import RING_PARAMS
from attnbench.impls.flex_kernel import compiled_flex, diagonal_causal, flex_attend, flex_options, has_compute_q_blocks
from attnbench.impls.sequence_parallel.base import SequenceParallelAttention
from attnbench.impls.sequence_parallel.engine import RingSchedule, Selection, run_ring
from attnbench.impls.sequence_parallel.merge import merge_into
from attnbench.masks.block_lists import (
    BlockPattern,
    clip_progressions,
    expand_progressions,
    progression_lengths,
    progression_spans,
)

# index elements one expansion of progressions may hold (the plan is made in such pieces)
EXPAND_ELEMENTS = 1 << 24


class BlockSparseRingAttention(SequenceParallelAttention):
    counterpart_name = "block-sparse"

    def __init__(
        self,
        pattern_type: str = "local_window",
        sparsity_ratio: float = 0.05,
        block_size: int = 128,
        segment_lengths: list[int] | None = None,
        dilation_rates: list[int] | None = None,
        kernel: str = "auto",
        compile_mode: str = "default",
        max_chunk_tokens: int = 1 << 20,
    ) -> None:
        super().__init__()
        # the single-device implementation validates the configuration and builds the pattern
        self.single = BlockSparseAttention(
            pattern_type,
            sparsity_ratio,
            block_size,
            segment_lengths,
            dilation_rates,
            kernel,
            "",
            compile_mode,
            max_chunk_tokens,
        )
        self.single.name = "block-sparse"
        self.kernel, self.block_size = kernel, block_size
        self._needed: dict[tuple, torch.Tensor] = {}
        self._masks: dict[tuple, list] = {}
        self._plans: dict[tuple, list] = {}

    def config(self) -> Config:
        c = self.single.config()
        return {key: c[key] for key in RING_PARAMS}

    def counterpart_config(self) -> Config:
        return {k: v for k, v in self.config().items() if k != "kernel"}

    @property
    def compiles(self) -> bool:  # type: ignore[override]
        return self.single.compiles

    # --- shape rules -------------------------------------------------------------------
    @property
    def granularity(self) -> int:
        """Whole blocks on every rank, whole segments of the pattern over the sequence."""
        return lcm([self.single.granularity, self.block_size * self.world()])

    def granularity_reason(self) -> str:
        ranks = f" on each of {self.world()} ranks" if self.world() > 1 else ""
        segments = " and whole segments of the pattern" if self.single.segment_lengths else ""
        return f", whole {self.block_size}-token blocks{ranks}{segments}"

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        super().check_shape(seq_len, num_heads)
        self.single.check_shape(seq_len, num_heads)

    def verify_seq_len(self) -> int:
        g = self.granularity
        return -(-self.single.verify_seq_len() // g) * g

    # --- what rank ``receiver`` needs of rank ``sender`` ---------------------------------------
    def needed_blocks(self, p: BlockPattern, world: int, receiver: int, sender: int, device) -> torch.Tensor:
        """Blocks of ``sender`` (its local numbering, ascending) that ``receiver``'s rows keep.
        The same function on both sides: the sender sends what the receiver sizes for."""
        key = (p.num_blocks, p.causal, world, receiver, sender, str(device))
        if key not in self._needed:
            m = p.num_blocks // world
            prog = clip_progressions(p.progressions[receiver * m : (receiver + 1) * m], sender * m, (sender + 1) * m)
            kept = torch.zeros(m, dtype=torch.bool, device=device)
            for idx in _expanded(prog, device):
                kept[idx - sender * m] = True
            self._needed[key] = kept.nonzero().flatten()
        return self._needed[key]

    # --- running -------------------------------------------------------------------------
    def _forward(self, q, k, v, is_causal, rank, world, clock):
        p = self.single.pattern(q.shape[1] * world, is_causal)
        use_flex = self.kernel == "flex" or (self.kernel == "auto" and q.is_cuda)
        if use_flex and not q.is_cuda:
            raise ConfigError(
                f"{self.name}: kernel=flex runs on CUDA only (torch's CPU FlexAttention returns no "
                "log-sum-exp to merge); use kernel=gather or auto on the CPU"
            )
        schedule = BlockSparseSchedule(self, p, q, rank, world, use_flex)
        run_ring(schedule, k, v, rank, world, self.group, clock)
        self.last_backend = "flex" if use_flex else "gather"
        return schedule.finish()


def _expanded(prog: torch.Tensor, device):
    """The kept block ids of progressions ``(rows, R, 3)``, in pieces of bounded size."""
    lengths = progression_lengths(prog).sum(dim=1)
    if not len(lengths) or int(lengths.sum()) == 0:
        return
    rows = max(1, EXPAND_ELEMENTS // max(1, int(lengths.max())))
    for r0 in range(0, prog.shape[0], rows):
        idx, counts = expand_progressions(prog[r0 : r0 + rows].to(device))
        yield idx[torch.arange(idx.shape[1], device=device)[None, :] < counts[:, None]]


class BlockSparseSchedule(RingSchedule):
    """Local queries against the blocks each rank sends (see the module doc)."""

    def __init__(self, impl: BlockSparseRingAttention, p: BlockPattern, q, rank: int, world: int, use_flex: bool):
        self.impl, self.p, self.rank, self.world, self.use_flex = impl, p, rank, world, use_flex
        self.b = impl.block_size
        self.m = p.num_blocks // world
        self.n = q.shape[1]
        self.qh = q.transpose(1, 2)  # (B, H, n, D): a view, the layout the kernels take
        self.out = torch.zeros(self.qh.shape, dtype=q.dtype, device=q.device)
        self.lse = torch.full(self.qh.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        self._tokens: dict[int, torch.Tensor] = {}

    # --- what travels --------------------------------------------------------------------
    def blocks(self, receiver: int, sender: int) -> torch.Tensor:
        return self.impl.needed_blocks(self.p, self.world, receiver, sender, self.qh.device)

    def select(self, receiver: int, sender: int) -> list[Selection]:
        if receiver == sender:
            return [Selection(slice(0, self.n), slice(None), self.n)]
        blocks = self.blocks(receiver, sender)
        if not len(blocks):
            return []
        if len(blocks) == self.m:  # all of them: the shard itself, no gathered copy
            return [Selection(slice(0, self.n), slice(None), self.n)]
        key = receiver * self.world + sender
        if key not in self._tokens:
            offsets = torch.arange(self.b, device=blocks.device)
            self._tokens[key] = (blocks[:, None] * self.b + offsets).flatten()
        return [Selection(self._tokens[key], slice(None), len(blocks) * self.b)]

    # --- what it computes ------------------------------------------------------------------
    def attend(self, sender: int, pieces) -> None:
        if not pieces:
            return
        ((k, v),) = pieces
        kh, vh = k.transpose(1, 2), v.transpose(1, 2)
        # sender-local block -> position among the received blocks
        local = sender == self.rank or kh.shape[2] == self.n
        if local:
            position = torch.arange(self.m, device=kh.device)
        else:
            position = torch.full((self.m,), -1, dtype=torch.int64, device=kh.device)
            blocks = self.blocks(self.rank, sender)
            position[blocks] = torch.arange(len(blocks), device=kh.device)
        diagonal = self.p.causal and sender == self.rank
        if self.use_flex:
            self._attend_flex(sender, kh, vh, position, diagonal)
        else:
            self._attend_gather(sender, kh, vh, position, diagonal)

    def _rows(self, sender: int, r0: int, r1: int, drop_diagonal: bool = False) -> torch.Tensor:
        """Local query blocks [r0, r1)'s kept blocks in ``sender``'s range, as progressions."""
        g0 = self.rank * self.m
        prog = self.p.progressions[g0 + r0 : g0 + r1]
        hi = (sender + 1) * self.m
        if drop_diagonal:  # causal stops are <= i + 1: stopping at i leaves the partial block out
            rows = torch.arange(g0 + r0, g0 + r1)
            prog = prog.clone()
            prog[:, :, 1] = torch.minimum(prog[:, :, 1], rows[:, None])
        return clip_progressions(prog, sender * self.m, hi)

    def _compact(self, prog, sender: int, position: torch.Tensor, width: int | None = None):
        idx, counts = expand_progressions(prog.to(position.device), width)
        # padding after a row's count points at block 0 (never read: the counts bound every row)
        return position[(idx - sender * self.m).clamp(0, self.m - 1)].clamp(min=0), counts

    def _merge(self, sender: int, t0: int, t1: int, out: torch.Tensor, lse: torch.Tensor) -> None:
        """A partial result into token rows [t0, t1). The rank's own keys come first (run_ring
        attends them before any exchange) and reach each row once: copied, not merged. Later
        senders merge by log-sum-exp (``merge_into``: one launch on CUDA, in place)."""
        if sender == self.rank:
            self.out[:, :, t0:t1].copy_(out)
            self.lse[:, :, t0:t1].copy_(lse)
        else:
            merge_into(self.out[:, :, t0:t1], self.lse[:, :, t0:t1], out, lse)

    # --- CPU: gathered blocks, one exact float32 softmax ---------------------------------------
    def _attend_gather(self, sender, kh, vh, position, diagonal) -> None:
        batch, heads, _, head_dim = self.qh.shape
        kv_heads, b = kh.shape[1], self.b
        groups = heads // kv_heads  # grouped K/V: each key/value head against its query heads
        width = int(progression_lengths(self._rows(sender, 0, self.m)).sum(1).max())
        if width == 0:
            return
        per_row = batch * width * b * heads * (2 * b * 4 + 2 * head_dim * 4)
        step = max(1, min(GATHER_BUDGET_BYTES // per_row, self.impl.single.max_chunk_tokens // b))
        key_blocks = kh.reshape(batch, kv_heads, -1, b, head_dim)
        value_blocks = vh.reshape(batch, kv_heads, -1, b, head_dim)
        offsets = torch.arange(b, device=kh.device)
        for r0 in range(0, self.m, step):
            r1 = min(self.m, r0 + step)
            idx, counts = self._compact(self._rows(sender, r0, r1), sender, position, width)
            allowed = (torch.arange(width, device=kh.device)[None, :] < counts[:, None])[:, None, :, None]
            allowed = allowed.expand(r1 - r0, b, width, b)  # (rows, t, block, u)
            if diagonal:  # the local step: keys at or before the query (local numbering)
                key_pos = idx[:, None, :, None] * b + offsets
                query_pos = (torch.arange(r0, r1, device=kh.device)[:, None] * b + offsets)[:, :, None, None]
                allowed = allowed & (key_pos <= query_pos)
            qc = self.qh[:, :, r0 * b : r1 * b].float().reshape(batch, kv_heads, groups, r1 - r0, b, head_dim)
            kc = key_blocks[:, :, idx].float().flatten(3, 4)  # (B, H_kv, rows, width*b, D)
            vc = value_blocks[:, :, idx].float().flatten(3, 4)
            scores = torch.einsum("bkgrtd,bkrud->bkgrtu", qc, kc) / math.sqrt(head_dim)
            scores.masked_fill_(~allowed.reshape(r1 - r0, b, width * b), float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)
            probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num_(0.0)  # rows with no key: zero
            out = torch.einsum("bkgrtu,bkrud->bkgrtd", probs, vc)
            rows = (r1 - r0) * b
            self._merge(
                sender, r0 * b, r1 * b, out.reshape(batch, heads, rows, head_dim), lse.reshape(batch, heads, rows)
            )

    # --- GPU: compiled FlexAttention over the received blocks -------------------------------
    def _attend_flex(self, sender, kh, vh, position, diagonal) -> None:
        b = self.b
        single = self.impl.single
        flex = compiled_flex(single.compile_mode)
        options = flex_options(self.qh, b, single.user_kernel_options)
        for t0, t1, skip, k0, k1, mask in self._chunk_masks(sender, position, kh.shape[2] // b, diagonal):
            keys = slice(k0 * b, k1 * b)
            out, lse = flex_attend(
                flex, self.qh[:, :, t0:t1], kh[:, :, keys], vh[:, :, keys], mask, options, with_lse=True
            )
            self._merge(sender, t0 + skip, t1, out[:, :, skip:], lse[:, :, skip:])

    def _spans(self, sender, position) -> tuple[torch.Tensor, torch.Tensor]:
        """Per local query block: the first and one past the last received block it keeps
        (0, 0 when it keeps none)."""
        first, stop = progression_spans(self._rows(sender, 0, self.m))
        kept = stop > first
        to_received = position.cpu()
        lo = torch.where(kept, to_received[(first - sender * self.m).clamp(0, self.m - 1)], 0)
        hi = torch.where(kept, to_received[(stop - 1 - sender * self.m).clamp(0, self.m - 1)] + 1, 0)
        return lo, hi

    def _chunk_masks(self, sender, position, key_blocks: int, diagonal: bool):
        """(first token, last token, rows already merged by the previous chunk, first and last
        key block, BlockMask) per chunk of local query blocks. The masks are kept where they
        are small; otherwise built again each call from the cached plan (GPU work only)."""
        key = (self.p.num_blocks, self.p.causal, self.world, self.rank, sender, str(position.device))
        if key in self.impl._masks:
            return self.impl._masks[key]
        plan = self.impl._plans.get(key)
        if plan is None:
            plan = self.impl._plans[key] = self._chunk_plan(sender, position, key_blocks, diagonal)
        chunks = [
            (t0, t1, skip, k0, k1, self._block_mask(idx, counts, t0 // self.b, k1 - k0, k0, diagonal))
            for t0, t1, skip, k0, k1, idx, counts in plan
        ]
        if sum((t1 - t0) // self.b * (k1 - k0) * 8 for t0, t1, _, k0, k1, _, _ in plan) <= MASK_CACHE_BYTES:
            self.impl._masks[key] = chunks
        return chunks

    def _chunk_plan(self, sender, position, key_blocks: int, diagonal: bool):
        """Per chunk of local query blocks: first and last token, rows already merged by the
        previous chunk, first and last key block, and the kept blocks of each row as
        positions in the key window (a narrow index and counts, on the device). Equal chunks
        (one compiled shape per step), the last one overlapping its neighbour: those rows are
        computed again but merged once. Each chunk sees a window of the received keys of one
        length (the widest chunk's span): local_window's chunks read only their neighbourhood,
        so offsets stay small and index rows short at any N. Reading the pattern's lists is
        host work: done once per (pattern, rank, sender), not per call."""
        b, m = self.b, self.m
        lo, hi = self._spans(sender, position)
        widest = int((hi - lo).max())
        rows = max(1, min(m, self.impl.single.max_chunk_tokens // b))
        while rows > 1 and rows * min(key_blocks, rows + widest) * 8 > INDEX_BUDGET_BYTES:
            rows //= 2
        count = -(-m // rows)
        rows = -(-m // count)
        starts = [min(c * rows, m - rows) for c in range(count)]
        spans = [(int(lo[r0 : r0 + rows].min()), int(hi[r0 : r0 + rows].max())) for r0 in starts]
        window = max(k1 - k0 for k0, k1 in spans)
        plan, done = [], 0
        for r0, (k0, k1) in zip(starts, spans):
            skip, done = (done - r0) * b, r0 + rows
            if k1 <= k0:  # no kept block of this sender in the chunk
                continue
            k0 = min(k0, key_blocks - window)
            idx, counts = self._compact(self._rows(sender, r0, r0 + rows, drop_diagonal=diagonal), sender, position)
            plan.append((r0 * b, (r0 + rows) * b, skip, k0, k0 + window, (idx - k0).clamp(min=0), counts))
        return plan

    def _block_mask(self, idx, counts, r0: int, window: int, k0: int, diagonal: bool):
        """Kept blocks are full; the local causal step's diagonal block is partial. Index rows
        are full width (one column per block of the key window), which torch 2.11's lowering
        needs (narrow rows compute a wrong output there); indices count from the window's first
        block ``k0``."""
        from torch.nn.attention.flex_attention import BlockMask

        rows, device = idx.shape[0], idx.device
        full_idx = torch.zeros(rows, window, dtype=torch.int32, device=device)
        full_idx[:, : idx.shape[1]] = idx
        part_idx = torch.zeros(rows, window, dtype=torch.int32, device=device)
        if diagonal:
            part_idx[:, 0] = torch.arange(r0, r0 + rows, device=device) - k0
        part_count = torch.full((rows,), int(diagonal), dtype=torch.int32, device=device)
        extra = {"compute_q_blocks": False} if has_compute_q_blocks() else {}
        return BlockMask.from_kv_blocks(
            part_count[None, None],
            part_idx[None, None],
            counts.to(torch.int32)[None, None],
            full_idx[None, None],
            BLOCK_SIZE=self.b,
            mask_mod=diagonal_causal(self.b) if diagonal else None,
            seq_lengths=(rows * self.b, window * self.b),
            **extra,
        )

    def finish(self) -> torch.Tensor:
        return self.out.transpose(1, 2)
