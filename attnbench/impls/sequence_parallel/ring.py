"""``ring``: dense ring attention, K/V around the ranks overlapped with compute and merged by
log-sum-exp; the zigzag layout when causal. Grouped K/V travel at their own head count (the
kernels share them), so the ring moves H_kv / H of what plain multi-head attention would."""

from __future__ import annotations

import torch

from attnbench.impls import gqa
from attnbench.impls.fused_sdpa import shares_kv
from attnbench.impls.sequence_parallel.base import DenseSequenceParallel
from attnbench.impls.sequence_parallel.engine import (
    LseAccumulator,
    RingSchedule,
    Selection,
    attend_with_lse,
    kept_slice,
    run_ring,
)

#: shards up to this many tokens send their K/V whole (the fewest exchanges: a step's host
#: time is what limits a short ring); longer ones in pieces of 1/PIECES_PER_SHARD of the shard
#: (at least MIN_PIECE_TOKENS), so a rank holds two small pieces in flight, not two shards:
#: on two H200s 4K-token pieces held 1.58x the shard's floor at 64K tokens a rank (8K: 1.64x)
#: in the same time (41.2 vs 40.3 ms a call)
WHOLE_SHARD_TOKENS = 32768
PIECES_PER_SHARD = 32
MIN_PIECE_TOKENS = 4096
#: a non-causal shard whose block (its queries over one shard's keys) is at most this much
#: work gathers every peer's K/V in one exchange, in flight while its own block is attended,
#: and attends them in one kernel call with one merge: a ring step's fixed cost (the
#: exchange's kernels, a wait, a merge) is a large part of so short a block. The limit is a
#: 16K-token shard's block at 8 heads of 64, about 1.2 ms on an H200 (FLOPs, 4 B H n^2 D)
GATHER_BLOCK_FLOP = 4 * 16384**2 * 8 * 64


class DenseSchedule(RingSchedule):
    """Every query attends every key. Causal runs on the zigzag layout: a rank's own block
    is causal; from an earlier rank only its early chunk is in the past (all queries see
    it); from a later rank only the late local queries see its keys (both chunks). Any piece
    of a sender's keys is attended on its own and merged."""

    def __init__(self, q, rank: int, world: int, causal: bool, backend: str) -> None:
        self.qh = q.transpose(1, 2)  # (B, H, n, D): a view, the layout the kernels take
        self.rank, self.causal, self.backend = rank, causal, backend
        self.n = q.shape[1]
        # with other ranks to merge, the float32 sum starts at once (never beside the first output)
        self.acc = LseAccumulator(tuple(self.qh.shape), q.device, q.dtype, eager=world > 1)
        self.kernel = None

    def piece_tokens(self) -> int | None:
        if self.n <= WHOLE_SHARD_TOKENS:
            return None
        return max(MIN_PIECE_TOKENS, -(-self.n // PIECES_PER_SHARD))

    def gathers(self) -> bool:
        batch, heads, n, dim = self.qh.shape
        return not self.causal and 4 * batch * heads * n * n * dim <= GATHER_BLOCK_FLOP

    def attend_gathered(self, received, joined) -> None:
        if joined is None:
            return super().attend_gathered(received, joined)
        self.attend(None, [joined])  # non-causal: every peer's keys in one call

    def select(self, receiver: int, sender: int) -> list[Selection]:
        if self.causal and sender < receiver:
            tokens, count = kept_slice(0, self.n // 2)
        else:
            tokens, count = kept_slice(0, self.n)
        return [Selection(tokens, slice(None), count)]

    def attend(self, sender, pieces) -> None:
        for k, v in pieces:
            kh, vh = k.transpose(1, 2), v.transpose(1, 2)
            if self.causal and sender > self.rank:
                half = self.n // 2
                out, lse, self.kernel = attend_with_lse(self.qh[:, :, half:], kh, vh, False, self.backend, self.kernel)
                self.acc.add(out, lse, rows=slice(half, self.n))
            else:
                causal = self.causal and sender == self.rank
                out, lse, self.kernel = attend_with_lse(self.qh, kh, vh, causal, self.backend, self.kernel)
                self.acc.add(out, lse)

    def finish(self) -> torch.Tensor:
        return self.acc.result().transpose(1, 2)


class RingAttention(DenseSequenceParallel):
    """Dense ring attention (zigzag layout when causal)."""

    graph_capturable = True  # seen on NCCL (torch 2.11, 2 and 4 H200): replays equal eager calls

    def __init__(self, backend: str = "auto") -> None:
        super().__init__()
        self.backend = backend

    def config(self):
        return {"backend": self.backend}

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        schedule = DenseSchedule(q, rank, world, is_causal, self.backend)
        run_ring(schedule, k, v, rank, world, self.group, clock)
        self.last_backend = schedule.kernel
        self.last_kv_layout = gqa.layout(q, k, expanded=not shares_kv(schedule.kernel or ""))
        return schedule.finish()
