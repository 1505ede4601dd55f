"""Sequence-parallel attention: one sequence split over the ranks of a process group.

Contract (docs/semantics.md, "Sequence-parallel variants"): inside an initialised process group of ``p``
ranks, ``forward(q, k, v, is_causal)`` takes the rank's shard ``(B, N/p, H, D)`` of q, k
and v and returns the rank's shard of the output. Which global positions a rank holds, in
which local order, is the implementation's declaration ``shard_positions(N, rank,
causal)`` (contiguous; zigzag for causal: rank r holds chunks r and 2p-1-r of 2p, so every
rank has the same causal work; curve order for the Hilbert variant). The key sets are the
single-device counterpart's (ring == dense, ring-dilated == dilated, ...), so the float64
reference and the counterpart's output check a gathered result. Outside a process group
the same module runs as a ring of one.

The engine (``run_ring``) is shared by every variant. A variant is a ``RingSchedule``:

* ``select(receiver, sender)``: which of the sender's K/V tokens and heads the receiver
  needs (deterministic, so the sender computes what to send with the same function the
  receiver uses to size its receive buffer; only those tokens travel);
* ``attend(sender, pieces)``: attend the local queries to those pieces; partial results
  (out, log-sum-exp) are merged in float32 by ``LseAccumulator``;
* ``finish()``: the output shard.

At step s (0 < s < p) rank r receives from r-s and sends to r+s (modulo p), with
``batch_isend_irecv`` into one of two preallocated receive buffers that are never the
tensors being sent (local K/V or a gathered copy). Step s+1's exchange is posted before
step s's compute, so communication overlaps compute. ``last_breakdown()`` splits the last
call's time into compute and waiting on communication.

A block-sparse ring is one more schedule: ``select`` = the K/V blocks of the sender that
the receiver's block pattern touches (``Selection.tokens`` may be an index tensor),
``attend`` = the block-sparse kernel with log-sum-exp over the received blocks, then the
same merge.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from attnbench import hilbert as hilbert_curve
from attnbench.errors import ConfigError
from attnbench.impls import build, fused_sdpa, register
from attnbench.impls.base import AttentionImpl, ImplSpec, Param, lcm
from attnbench.impls.dense import DENSE_GRANULARITY
from attnbench.impls.dilated import HeadGroup, attend_group, head_groups, validate_pattern
from attnbench.impls.fused_sdpa import CUDA_KERNELS, cuda_kernel

# ---------------------------------------------------------------------------------------
# One block of attention with its log-sum-exp, from a fused kernel
# ---------------------------------------------------------------------------------------


def attend_with_lse(q, k, v, causal: bool, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, str]:
    """Softmax attention of ``q`` over ``k, v`` (all ``(B, H, N, D)`` views, scale 1/sqrt(D)).

    Returns the output ``(B, H, Nq, D)`` in q's dtype, the natural-log log-sum-exp of the
    scaled scores ``(B, H, Nq)`` in float32, and the kernel's name. ``causal`` is the
    top-left-aligned triangle of a square block.
    """
    kernel = "flash-cpu" if q.device.type != "cuda" else cuda_kernel(q, k, v, causal, backend)
    out, saved = fused_sdpa.forward(q, k, v, causal, kernel)
    return out, saved.natural_lse(q.shape[2]), kernel


class LseAccumulator:
    """Merges partial attention results over disjoint key sets with the log-sum-exp rule,
    in float32: out = sum_i exp(lse_i - lse) out_i with lse = log sum_i exp(lse_i).

    Rows no key has reached keep lse = -inf and a zero output (empty key set: zero row).
    A single contribution is returned as the kernel produced it (no float32 round trip).
    """

    def __init__(self, shape: tuple[int, int, int, int], device, dtype) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None
        self._single: tuple[torch.Tensor, torch.Tensor] | None = None

    def add(self, out_b: torch.Tensor, lse_b: torch.Tensor, rows: slice = slice(None)) -> None:
        full = rows == slice(None) or (rows.start in (None, 0) and rows.stop in (None, self.shape[2]))
        if self.out is None and self._single is None and full:
            self._single = (out_b, lse_b)
            return
        self._materialise()
        o, lse = self.out[:, :, rows], self.lse[:, :, rows]
        new = torch.logaddexp(lse, lse_b)
        base = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
        o.mul_((lse - base).exp_().unsqueeze(-1))
        o.addcmul_(out_b, (lse_b - base).exp_().unsqueeze(-1))
        lse.copy_(new)

    def _materialise(self) -> None:
        if self.out is not None:
            return
        if self._single is not None:
            out_b, lse_b = self._single
            self.out, self.lse = out_b.float(), lse_b.clone()
            self._single = None
        else:
            self.out = torch.zeros(self.shape, device=self.device, dtype=torch.float32)
            self.lse = torch.full(self.shape[:3], float("-inf"), device=self.device, dtype=torch.float32)

    def result(self) -> torch.Tensor:
        """(B, H, Nq, D) in the inputs' dtype."""
        if self._single is not None:
            return self._single[0]
        self._materialise()
        return self.out.to(self.dtype)


# ---------------------------------------------------------------------------------------
# Where the time goes: compute vs waiting on communication
# ---------------------------------------------------------------------------------------

class StepClock:
    """Marks on the compute stream (CUDA events) or the host clock (CPU). An interval is
    booked to the label of the mark that ends it: "wait" for the stall while the compute
    stream waits on a receive, "compute" for everything else."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []
        self.sent_bytes = 0
        self.steps = 0

    def mark(self, label: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((label, ev))
        else:
            self.marks.append((label, time.perf_counter()))

    def summary(self) -> dict[str, float | int]:
        """Needs the call finished (the trial synchronises before reading it)."""
        totals = {"compute": 0.0, "wait": 0.0}
        for (_, a), (label, b) in zip(self.marks, self.marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            totals[label] = totals.get(label, 0.0) + ms
        return {"compute_ms": totals["compute"], "comm_wait_ms": totals["wait"],
                "sent_bytes": self.sent_bytes, "comm_steps": self.steps}


# ---------------------------------------------------------------------------------------
# The ring engine
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """Tokens (a slice or an index tensor of local positions) and heads of a sender's K/V."""

    tokens: slice | torch.Tensor
    heads: slice
    count: int
    key: Any = None  # the schedule's own label (e.g. the head group)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, n, H, D)`` -> ``(B, count, heads, D)``: a view for slices, a copy for indices."""
        if isinstance(self.tokens, slice):
            return x[:, self.tokens, self.heads]
        return x[:, :, self.heads].index_select(1, self.tokens)


def kept_slice(start: int, stop: int, step: int = 1) -> tuple[slice, int]:
    return slice(start, stop, step), len(range(start, stop, step))


class RingSchedule:
    """What a rank needs from every other rank and what it computes with it (see module doc)."""

    def select(self, receiver: int, sender: int) -> list[Selection]:
        raise NotImplementedError

    def attend(self, sender: int, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        raise NotImplementedError

    def finish(self) -> torch.Tensor:
        raise NotImplementedError


def _heads(sel: Selection, num_heads: int) -> int:
    return len(range(*sel.heads.indices(num_heads)))


def run_ring(schedule: RingSchedule, k: torch.Tensor, v: torch.Tensor, rank: int, world: int,
             group=None, clock: StepClock | None = None) -> None:
    """Drive ``schedule`` around the ring: exchange of step s+1 in flight while step s computes."""
    import torch.distributed as dist

    batch, _, num_heads, head_dim = k.shape
    clock = clock or StepClock(k.device)

    def elements(sels: list[Selection]) -> int:
        return sum(2 * batch * s.count * _heads(s, num_heads) * head_dim for s in sels)

    # Two receive buffers, sized for the largest step, alternate between steps.
    largest = max((elements(schedule.select(rank, (rank - s) % world)) for s in range(1, world)), default=0)
    buffers = [k.new_empty(largest) for _ in range(min(2, world - 1))] if largest else []

    def post(step: int):
        src, dst = (rank - step) % world, (rank + step) % world
        ops, outgoing, pieces = [], [], []
        for i, sel in enumerate(schedule.select(dst, rank)):
            for j, x in enumerate((k, v)):
                t = sel.take(x).contiguous()  # the local inputs themselves when the selection is all of them
                outgoing.append(t)
                ops.append(dist.P2POp(dist.isend, t, dst, group, tag=2 * i + j))
        offset = 0
        for i, sel in enumerate(schedule.select(rank, src)):
            pair = []
            for j in range(2):
                shape = (batch, sel.count, _heads(sel, num_heads), head_dim)
                t = buffers[step % len(buffers)][offset:offset + math.prod(shape)].view(shape)
                offset += t.numel()
                ops.append(dist.P2POp(dist.irecv, t, src, group, tag=2 * i + j))
                pair.append(t)
            pieces.append(tuple(pair))
        clock.sent_bytes += sum(t.numel() * t.element_size() for t in outgoing)
        clock.steps += bool(ops)
        return (dist.batch_isend_irecv(ops) if ops else []), pieces, outgoing

    pending = post(1) if world > 1 else None
    schedule.attend(rank, [(sel.take(k), sel.take(v)) for sel in schedule.select(rank, rank)])
    for step in range(1, world):
        clock.mark("compute")
        requests, pieces, _ = pending
        for req in requests:
            req.wait()  # on NCCL: the compute stream waits for the receive, the host does not
        clock.mark("wait")
        pending = post(step + 1) if step + 1 < world else None
        schedule.attend((rank - step) % world, pieces)
    clock.mark("compute")


# ---------------------------------------------------------------------------------------
# Shard layouts
# ---------------------------------------------------------------------------------------

def contiguous_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    n = seq_len // world
    return torch.arange(rank * n, (rank + 1) * n)


def zigzag_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """Chunks r and 2p-1-r of 2p equal chunks: each rank gets an early and a late chunk."""
    c = seq_len // (2 * world)
    late = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)])


# ---------------------------------------------------------------------------------------
# Base class of the sequence-parallel implementations
# ---------------------------------------------------------------------------------------

class SequenceParallelAttention(AttentionImpl):
    """A distributed implementation; its key sets are its single-device counterpart's."""

    #: registry name of the single-device implementation computing the same thing
    counterpart_name = "sdpa"

    def __init__(self) -> None:
        super().__init__()
        #: ranks the global sequence is split over; None: the process group's size (1 outside one)
        self.world_size: int | None = None
        self.group = None
        self._clock: StepClock | None = None

    # --- the process group ---------------------------------------------------------------
    def world(self) -> int:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            actual = dist.get_world_size(self.group)
            if self.world_size not in (None, actual):
                raise ConfigError(f"{self.name}: configured for {self.world_size} ranks but the process group has {actual}")
            return actual
        return self.world_size or 1

    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    # --- declarations --------------------------------------------------------------------
    def counterpart_config(self) -> dict[str, Any]:
        return {}

    def counterpart(self) -> AttentionImpl:
        return build(self.counterpart_name, **self.counterpart_config())

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        return self.counterpart()._key_sets(seq_len, num_heads)

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        self.check_shape(seq_len, num_heads)
        return self.counterpart().key_mask(seq_len, num_heads, causal)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return self.counterpart().useful_pairs(seq_len, num_heads, causal)

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        return self.counterpart().executed_pairs(seq_len, num_heads, causal)

    def shard_positions(self, seq_len: int, rank: int, causal: bool) -> torch.Tensor:
        """Global positions of the rank's local tokens, in local order."""
        return contiguous_positions(seq_len, self.world(), rank)

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        world = self.world()
        if seq_len % world:
            raise ConfigError(f"{self.name}: sequence length {seq_len} does not split over {world} ranks; "
                              f"choose a multiple of {self.granularity}")
        super().check_shape(seq_len, num_heads)

    def check_causal(self, causal: bool) -> None:
        if causal and not self.supports_causal:
            raise ConfigError(f"{self.name} runs non-causal only (a 2-D grid has no causal order); drop --causal")

    def verify_seq_len(self) -> int:
        return self.granularity

    # --- running -------------------------------------------------------------------------
    def forward(self, q, k, v, is_causal: bool = False):
        world, rank = self.world(), self.rank()
        batch, n, num_heads, _ = q.shape
        self.check_shape(n * world, num_heads)
        self.check_causal(is_causal)
        self._clock = StepClock(q.device)
        self._clock.mark("start")
        return self._forward(q, k, v, is_causal, rank, world, self._clock)

    def _forward(self, q, k, v, is_causal, rank, world, clock) -> torch.Tensor:
        raise NotImplementedError

    def last_breakdown(self) -> dict[str, float | int]:
        """Compute vs communication wait of the last call; read after it finished."""
        return self._clock.summary() if self._clock else {}


# ---------------------------------------------------------------------------------------
# ring: dense attention
# ---------------------------------------------------------------------------------------

class DenseSchedule(RingSchedule):
    """Every query attends every key. Causal runs on the zigzag layout: a rank's own block
    is causal; from an earlier rank only its early chunk is in the past (all queries see
    it); from a later rank only the late local queries see its keys (both chunks)."""

    def __init__(self, q, rank: int, causal: bool, backend: str) -> None:
        self.qh = q.transpose(1, 2)  # (B, H, n, D): a view, the layout the kernels take
        self.rank, self.causal, self.backend = rank, causal, backend
        self.n = q.shape[1]
        self.acc = LseAccumulator(tuple(self.qh.shape), q.device, q.dtype)
        self.kernel = None

    def select(self, receiver: int, sender: int) -> list[Selection]:
        if self.causal and sender < receiver:
            tokens, count = kept_slice(0, self.n // 2)
        else:
            tokens, count = kept_slice(0, self.n)
        return [Selection(tokens, slice(None), count)]

    def attend(self, sender, pieces) -> None:
        (k, v), = pieces
        kh, vh = k.transpose(1, 2), v.transpose(1, 2)
        if self.causal and sender > self.rank:
            half = self.n // 2
            out, lse, self.kernel = attend_with_lse(self.qh[:, :, half:], kh, vh, False, self.backend)
            self.acc.add(out, lse, rows=slice(half, self.n))
        else:
            out, lse, self.kernel = attend_with_lse(self.qh, kh, vh, self.causal and sender == self.rank, self.backend)
            self.acc.add(out, lse)

    def finish(self) -> torch.Tensor:
        return self.acc.result().transpose(1, 2)


class DenseSequenceParallel(SequenceParallelAttention):
    """The dense layout shared by ``ring`` and PyTorch's context parallel: contiguous shards,
    or zigzag (head-tail) ones when causal so every rank gets equal work."""

    counterpart_name = "sdpa"

    @property
    def granularity(self) -> int:
        return DENSE_GRANULARITY * self.world()

    def shard_positions(self, seq_len, rank, causal):
        world = self.world()
        return zigzag_positions(seq_len, world, rank) if causal else contiguous_positions(seq_len, world, rank)


class RingAttention(DenseSequenceParallel):
    """Dense ring attention (zigzag layout when causal)."""

    def __init__(self, backend: str = "auto") -> None:
        super().__init__()
        self.backend = backend

    def config(self):
        return {"backend": self.backend}

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        schedule = DenseSchedule(q, rank, is_causal, self.backend)
        run_ring(schedule, k, v, rank, world, self.group, clock)
        self.last_backend = schedule.kernel
        return schedule.finish()


# ---------------------------------------------------------------------------------------
# ring-dilated: LongNet dilated attention over the split sequence
# ---------------------------------------------------------------------------------------

def check_segments_fit(name: str, seq_len: int, world: int, segment_lengths) -> None:
    """Each segment lies inside one rank's shard or spans whole shards."""
    n = seq_len // world
    for w in segment_lengths:
        if n % w and w % n:
            step = lcm(segment_lengths) * world
            raise ConfigError(
                f"{name}: {n} tokens per rank ({seq_len} over {world} ranks) neither hold whole segments of "
                f"{w} nor tile one; choose a sequence length that is a multiple of {step}"
            )


class DilatedSchedule(RingSchedule):
    """Head groups whose segments lie inside the shard run the single-device kernel locally
    (no communication). A group whose segment spans k = w / n shards exchanges, between the
    k ranks of a segment, only the kept (dilated) K/V positions of its heads."""

    def __init__(self, q, k, v, rank: int, causal: bool, groups: list[HeadGroup], max_chunk_tokens: int,
                 backend: str) -> None:
        self.q, self.k, self.v = q, k, v
        self.rank, self.causal, self.backend = rank, causal, backend
        self.n = q.shape[1]
        self.local = [g for g in groups if self.n % g.segment_length == 0]
        self.spanning = [g for g in groups if self.n % g.segment_length]
        self.max_chunk_tokens = max_chunk_tokens
        self.out = torch.zeros_like(q)  # queries outside the dilation: zero rows
        self.acc: dict[int, LseAccumulator] = {}
        self.kernel = "sdpa" if self.local else None

    def kept(self, g: HeadGroup, rank: int) -> tuple[slice, int]:
        """Local positions of ``rank`` kept by group g: in-segment offset p with p mod r = o."""
        first = (rank % (g.segment_length // self.n)) * self.n  # the shard's offset in its segment
        return kept_slice((g.offset - first) % g.dilation_rate, self.n, g.dilation_rate)

    def select(self, receiver: int, sender: int) -> list[Selection]:
        sels = []
        for i, g in enumerate(self.spanning):
            span = g.segment_length // self.n
            if receiver // span != sender // span or (self.causal and sender > receiver):
                continue
            tokens, count = self.kept(g, sender)
            if count and self.kept(g, receiver)[1]:
                sels.append(Selection(tokens, g.heads, count, key=i))
        return sels

    def attend(self, sender, pieces) -> None:
        if sender == self.rank:
            for g in self.local:
                attend_group(self.q, self.k, self.v, self.out, g, self.causal, self.max_chunk_tokens)
        for sel, (k, v) in zip(self.select(self.rank, sender), pieces):
            g = self.spanning[sel.key]
            rows, _ = self.kept(g, self.rank)
            qh = self.q[:, rows, g.heads].transpose(1, 2)
            out, lse, self.kernel = attend_with_lse(qh, k.transpose(1, 2), v.transpose(1, 2),
                                                    self.causal and sender == self.rank, self.backend)
            self.acc.setdefault(sel.key, LseAccumulator(tuple(qh.shape), qh.device, qh.dtype)).add(out, lse)

    def finish(self) -> torch.Tensor:
        for i, acc in self.acc.items():
            g = self.spanning[i]
            rows, _ = self.kept(g, self.rank)
            self.out[:, rows, g.heads] = acc.result().transpose(1, 2)
        return self.out


class RingDilatedAttention(SequenceParallelAttention):
    counterpart_name = "dilated"

    def __init__(self, segment_lengths=(2048, 4096), dilation_rates=(1, 2), max_chunk_tokens: int = 1 << 19,
                 backend: str = "auto") -> None:
        super().__init__()
        validate_pattern(segment_lengths, dilation_rates)
        if max_chunk_tokens <= 0:
            raise ConfigError(f"{self.name or 'ring-dilated'}: max_chunk_tokens must be positive")
        self.segment_lengths = list(segment_lengths)
        self.dilation_rates = list(dilation_rates)
        self.max_chunk_tokens = max_chunk_tokens
        self.backend = backend

    def config(self):
        return {"segment_lengths": self.segment_lengths, "dilation_rates": self.dilation_rates,
                "max_chunk_tokens": self.max_chunk_tokens, "backend": self.backend}

    def counterpart_config(self):
        return {"segment_lengths": self.segment_lengths, "dilation_rates": self.dilation_rates,
                "max_chunk_tokens": self.max_chunk_tokens}

    @property
    def granularity(self) -> int:
        """Search step: whole segments on every rank (shorter valid lengths exist, see check_shape)."""
        return lcm(self.segment_lengths) * self.world()

    def verify_seq_len(self) -> int:
        # the smallest length where the longest segments span ranks, so the exchange is checked
        short = lcm(self.segment_lengths)
        try:
            self.check_shape(short, len(self.segment_lengths))
            return short
        except ConfigError:
            return self.granularity

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        self.counterpart().check_shape(seq_len, num_heads)
        world = self.world()
        if seq_len % world:
            raise ConfigError(f"{self.name}: sequence length {seq_len} does not split over {world} ranks; "
                              f"choose a multiple of {self.granularity}")
        check_segments_fit(self.name, seq_len, world, self.segment_lengths)

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        groups = head_groups(q.shape[2], self.segment_lengths, self.dilation_rates)
        schedule = DilatedSchedule(q, k, v, rank, is_causal, groups, self.max_chunk_tokens, self.backend)
        run_ring(schedule, k, v, rank, world, self.group, clock)
        self.last_backend = schedule.kernel
        return schedule.finish()


class RingDilatedHilbertAttention(RingDilatedAttention):
    """ring-dilated over tokens in Hilbert-curve order: the shards are consecutive runs of
    the curve (compact 2-D patches of the grid), rank r holding curve positions
    [r n, (r+1) n); the dilated pattern holds between curve positions."""

    supports_causal = False

    def __init__(self, segment_lengths=(2048, 4096), dilation_rates=(1, 2), max_chunk_tokens: int = 1 << 19,
                 grid_width: int = 0, backend: str = "auto") -> None:
        super().__init__(segment_lengths, dilation_rates, max_chunk_tokens, backend)
        if grid_width < 0:
            raise ConfigError(f"ring-dilated-hilbert: grid_width must be 0 (automatic) or positive, got {grid_width}")
        self.grid_width = grid_width

    def config(self):
        return {**super().config(), "grid_width": self.grid_width}

    def counterpart_config(self):
        return {**super().counterpart_config(), "hilbert": True, "grid_width": self.grid_width}

    def shard_positions(self, seq_len, rank, causal):
        n = seq_len // self.world()
        return hilbert_curve.curve_order(seq_len, self.grid_width)[rank * n:(rank + 1) * n]

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        self.check_causal(causal)
        return super().key_mask(seq_len, num_heads, causal)


# ---------------------------------------------------------------------------------------
# context-parallel: PyTorch's own ring over SDPA (torch.distributed.tensor.experimental)
# ---------------------------------------------------------------------------------------

def context_parallel_support() -> str:
    """'' when this torch has context parallelism, else why not (imports it: ~1 s)."""
    try:
        from torch.distributed.tensor.experimental._attention import (  # noqa: F401
            _cp_options,
            _disable_context_parallel_dispatcher,
            _enable_context_parallel_dispatcher,
            set_rotate_method,
        )
    except Exception as exc:  # private API: absent or moved in this release
        return f"not in torch {torch.__version__} ({type(exc).__name__}: {exc})"
    return ""


def context_parallel_availability() -> str:
    """The line ``attnbench list`` shows."""
    reason = context_parallel_support()
    return f"available in torch {torch.__version__}" if not reason else f"UNAVAILABLE: {reason}"


class ContextParallelAttention(DenseSequenceParallel):
    """``F.scaled_dot_product_attention`` on DTensors sharded along the sequence, with
    PyTorch's context-parallel dispatcher: its ring (all-gather or all-to-all rotation of
    K/V) around the fused SDPA kernels. CUDA only (its ring handles the CUDA kernels). Causal
    uses its head-tail load balancing, the same zigzag layout as ``ring``."""

    def __init__(self, backend: str = "auto", rotate_method: str = "allgather") -> None:
        super().__init__()
        reason = context_parallel_support()
        if reason:
            raise ConfigError(f"context-parallel: unavailable, {reason}; use ring")
        self.backend = backend
        self.rotate_method = rotate_method
        self._mesh = None

    def config(self):
        return {"backend": self.backend, "rotate_method": self.rotate_method}

    def _forward(self, q, k, v, is_causal, rank, world, clock):
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        from torch.distributed.tensor.experimental._attention import (
            _cp_options,
            _disable_context_parallel_dispatcher,
            _enable_context_parallel_dispatcher,
            set_rotate_method,
        )
        from torch.nn.attention import sdpa_kernel

        from attnbench.impls.dense import SDPA_BACKENDS

        if q.device.type != "cuda":
            raise ConfigError("context-parallel runs on CUDA only (PyTorch's ring handles the CUDA SDPA kernels); use ring on the CPU")
        if self._mesh is None or self._mesh.size() != world:
            self._mesh = init_device_mesh("cuda", (world,))
        set_rotate_method(self.rotate_method)
        _cp_options.enable_load_balance = is_causal  # its head-tail layout is our zigzag
        qd, kd, vd = (DTensor.from_local(x.transpose(1, 2), self._mesh, [Shard(2)], run_check=False) for x in (q, k, v))
        # the fused kernels only: its ring handles those; math would fall back to DTensor's all-gather
        names = [self.backend] if self.backend != "auto" else list(CUDA_KERNELS)
        backends = [SDPA_BACKENDS[name] for name in names]
        _enable_context_parallel_dispatcher()
        try:
            with sdpa_kernel(backends):
                out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=is_causal)
        finally:
            _disable_context_parallel_dispatcher()
        with sdpa_kernel(backends):  # the kernel SDPA picks for one local block, for the row
            from attnbench.impls.dense import sdpa_backend_in_use

            kernel = sdpa_backend_in_use(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal)
        self.last_backend = f"context-parallel/{self.rotate_method}/{kernel}"
        clock.mark("compute")  # its communication is inside PyTorch: booked as compute
        return out.to_local().transpose(1, 2)


# ---------------------------------------------------------------------------------------
# Registry entries
# ---------------------------------------------------------------------------------------

KERNEL_PARAM = Param("backend", "auto", "fused kernel per block on CUDA (auto: the one SDPA picks); the CPU has one",
                     kind="str", choices=("auto", *CUDA_KERNELS))
SEGMENT_PARAMS = (
    Param("segment_lengths", [2048, 4096], "segment length per head group", kind="ints"),
    Param("dilation_rates", [1, 2], "dilation rate per head group (divides its segment)", kind="ints"),
    Param("max_chunk_tokens", 1 << 19, "tokens per kernel launch of the local segments (bounds temporary memory)"),
)
DILATED_VERIFY = (
    {"segment_lengths": [16, 32], "dilation_rates": [1, 2]},
    {"segment_lengths": [8, 16, 32], "dilation_rates": [1, 2, 4], "max_chunk_tokens": 16},
    {"segment_lengths": [32, 32], "dilation_rates": [4, 2]},
    {"segment_lengths": [16], "dilation_rates": [8]},  # some ranks keep no query of a segment
)
_SEQPAR = {"modes": ("fwd",)}  # forward only: the ring has no backward pass yet

register(ImplSpec(
    name="ring",
    factory=RingAttention,
    summary="dense ring attention: K/V around the ranks, overlapped with compute, log-sum-exp merge (zigzag when causal)",
    params=(KERNEL_PARAM,),
    verify_configs=({},),
    distributed=True,
    counterpart="sdpa",
    extra=_SEQPAR,
))
register(ImplSpec(
    name="ring-dilated",
    factory=RingDilatedAttention,
    summary="LongNet dilated attention over the split sequence: local segments stay local, spanning ones send kept K/V only",
    params=(*SEGMENT_PARAMS, KERNEL_PARAM),
    verify_configs=DILATED_VERIFY,
    distributed=True,
    counterpart="dilated",
    extra=_SEQPAR,
))
register(ImplSpec(
    name="ring-dilated-hilbert",
    factory=RingDilatedHilbertAttention,
    summary="ring-dilated over a 2-D token grid in Hilbert-curve order (shards = curve runs); non-causal",
    params=(*SEGMENT_PARAMS, Param("grid_width", 0, "grid width in tokens (0: automatic from the length)"), KERNEL_PARAM),
    verify_configs=DILATED_VERIFY[:2] + ({"segment_lengths": [16, 32], "dilation_rates": [2, 4], "grid_width": 16},),
    distributed=True,
    counterpart="dilated",
    extra=_SEQPAR,
))
register(ImplSpec(
    name="context-parallel",
    factory=ContextParallelAttention,
    summary="PyTorch's context parallel (torch.distributed.tensor.experimental: its ring over the fused SDPA kernels), CUDA only",
    params=(
        Param("backend", "auto", "SDPA backend", kind="str", choices=("auto", *CUDA_KERNELS)),
        Param("rotate_method", "allgather", "how PyTorch moves K/V", kind="str", choices=("allgather", "alltoall")),
    ),
    devices=("cuda",),
    dtypes=("fp16", "bf16", "fp32"),
    distributed=True,
    counterpart="sdpa",
    extra={**_SEQPAR, "availability": context_parallel_availability},
))
