"""The ring engine every sequence-parallel implementation runs on: ``run_ring`` drives a
``RingSchedule`` around the ranks (exchange of step s+1 in flight while step s computes),
``Selection`` says which K/V travel, ``LseAccumulator`` merges partial results by their
log-sum-exp, and ``StepClock`` splits a call's time into compute and waiting on communication."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.impls import fused_sdpa
from attnbench.impls.fused_sdpa import cuda_kernel
from attnbench.impls.sequence_parallel.merge import merge_into
from attnbench.measure.core import cuda_event

# ---------------------------------------------------------------------------------------
# One block of attention with its log-sum-exp, from a fused kernel
# ---------------------------------------------------------------------------------------


def attend_with_lse(
    q, k, v, causal: bool, backend: str = "auto", kernel: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Softmax attention of ``q`` over ``k, v`` (all ``(B, H, N, D)`` views, scale 1/sqrt(D)).

    Returns the output ``(B, H, Nq, D)`` in q's dtype, the natural-log log-sum-exp of the
    scaled scores ``(B, H, Nq)`` in float32, and the kernel's name. ``causal`` is the
    top-left-aligned triangle of a square block. ``kernel``: the one an earlier block of the
    same call chose (asking the dispatcher again costs host time every step).
    """
    if kernel is None:
        kernel = "flash-cpu" if q.device.type != "cuda" else cuda_kernel(q, k, v, causal, backend)
    out, saved = fused_sdpa.forward(q, k, v, causal, kernel)
    return out, saved.natural_lse(q.shape[2]), kernel


class LseAccumulator:
    """Merges partial attention results over disjoint key sets with the log-sum-exp rule
    (``merge.merge_into``): float32 storage and arithmetic.

    Rows no key has reached keep lse = -inf and a zero output (empty key set: zero row).
    A single contribution is returned as the kernel produced it (no float32 round trip),
    unless ``eager``: then the first whole contribution becomes the float32 sum at once, so
    the kernel's own output is never held beside the sum (a ring's peak memory).
    """

    def __init__(self, shape: tuple[int, int, int, int], device, dtype, eager: bool = False) -> None:
        self.shape, self.device, self.dtype, self.eager = shape, device, dtype, eager
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None
        self._single: tuple[torch.Tensor, torch.Tensor] | None = None

    def add(self, out_b: torch.Tensor, lse_b: torch.Tensor, rows: slice = slice(None)) -> None:
        full = rows == slice(None) or (rows.start in (None, 0) and rows.stop in (None, self.shape[2]))
        if self.out is None and self._single is None and full:
            self._single = (out_b, lse_b)
            if self.eager:
                self._materialise()
            return
        self._materialise()
        merge_into(self.out[:, :, rows], self.lse[:, :, rows], out_b, lse_b)

    def _materialise(self) -> None:
        if self.out is not None:
            return
        if self._single is not None:
            out_b, lse_b = self._single
            # the kernel's lse is this call's own tensor: merged into in place, not copied
            self.out, self.lse = out_b.float(), lse_b
            self._single = None
        else:
            self.out = torch.zeros(self.shape, device=self.device, dtype=torch.float32)
            self.lse = torch.full(self.shape[:3], float("-inf"), device=self.device, dtype=torch.float32)

    def result(self) -> torch.Tensor:
        """(B, H, Nq, D) in the inputs' dtype."""
        if self._single is not None:
            return self._single[0]
        self._materialise()
        out, self.out, self.lse = self.out, None, None  # the float32 sum is freed as the result is made
        return out.to(self.dtype)


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
            self.marks.append((label, cuda_event()))
        else:
            self.marks.append((label, time.perf_counter()))

    def summary(self) -> dict[str, float | int]:
        """Needs the call finished (the trial synchronises before reading it)."""
        totals = {"compute": 0.0, "wait": 0.0}
        for (_, a), (label, b) in zip(self.marks, self.marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            totals[label] = totals.get(label, 0.0) + ms
        return {
            "compute_ms": totals["compute"],
            "comm_wait_ms": totals["wait"],
            "sent_bytes": self.sent_bytes,
            "comm_steps": self.steps,
        }


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
            if self.count == x.shape[1] and self.heads == slice(None):
                return x  # all of it: no view to make on the host
            return x[:, self.tokens, self.heads]
        return x[:, :, self.heads].index_select(1, self.tokens)

    def pieces(self, size: int) -> list[Selection]:
        """This selection cut into consecutive pieces of at most ``size`` tokens."""
        if self.count <= size:
            return [self]
        cut = []
        for first in range(0, self.count, size):
            count = min(size, self.count - first)
            if isinstance(self.tokens, slice):
                start, step = self.tokens.start or 0, self.tokens.step or 1
                tokens = slice(start + first * step, start + (first + count - 1) * step + 1, step)
            else:
                tokens = self.tokens[first : first + count]
            cut.append(Selection(tokens, self.heads, count, self.key))
        return cut


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

    def piece_tokens(self) -> int | None:
        """None: a step's selections travel whole and ``attend`` gets all of them at once. A
        number: each travels in pieces of at most that many tokens, each received while the
        one before is attended, and ``attend`` gets one piece at a time (a schedule whose
        attend takes any subset of the keys): two pieces in flight instead of two shards."""
        return None

    def gathers(self) -> bool:
        """True: every peer's selections travel in one exchange, in flight while the rank's
        own keys are attended, and ``attend_gathered`` gets them all. One exchange instead of
        p-1 steps, for short shards whose steps' fixed cost (an exchange's kernels, a wait, a
        merge) outweighs their compute; the rank holds every peer's K/V instead of two."""
        return False

    def attend_gathered(
        self, received: list[tuple[int, list]], joined: tuple[torch.Tensor, torch.Tensor] | None
    ) -> None:
        """Every peer's pieces, ``(sender, pieces)`` in ring order. ``joined``: all of them as
        one ``(k, v)`` pair of views (batch 1, whole heads: they lie back to back in the receive
        buffer), or None. Attending sender by sender is always right."""
        for sender, pieces in received:
            self.attend(sender, pieces)


@dataclass(frozen=True)
class Transfer:
    """One pair of an exchange: what this rank sends to ``dst`` and receives from ``src``."""

    src: int
    dst: int
    send: list[Selection]
    recv: list[Selection]


def _cut(sels: list[Selection], size: int | None) -> list[Selection]:
    return sels if size is None else [p for s in sels for p in s.pieces(size)]


def plan_transfers(schedule: RingSchedule, rank: int, world: int) -> list[list[Transfer]]:
    """The exchanges of one call in order, each the transfers posted together: one per step s
    (send to rank+s, receive from rank-s), or one per piece when the schedule cuts its K/V
    into pieces, or a single exchange with every peer when the schedule gathers. Every rank
    cuts every pair's selections alike, so the exchanges line up across ranks one for one."""
    size = schedule.piece_tokens() if not schedule.gathers() else None
    steps = []
    for step in range(1, world):
        src, dst = (rank - step) % world, (rank + step) % world
        send, recv = _cut(schedule.select(dst, rank), size), _cut(schedule.select(rank, src), size)
        if size is None:
            steps.append([Transfer(src, dst, send, recv)])
            continue
        count = max(len(_cut(schedule.select((r + step) % world, r), size)) for r in range(world))
        steps += [[Transfer(src, dst, send[j : j + 1], recv[j : j + 1])] for j in range(count)]
    if schedule.gathers() and steps:
        return [[t for exchange in steps for t in exchange]]
    return steps


def _heads(sel: Selection, num_heads: int) -> int:
    return len(range(*sel.heads.indices(num_heads)))


def run_ring(
    schedule: RingSchedule,
    k: torch.Tensor,
    v: torch.Tensor,
    rank: int,
    world: int,
    group=None,
    clock: StepClock | None = None,
) -> None:
    """Drive ``schedule`` around the ring: exchange i+1 in flight while exchange i's keys are
    attended. On NCCL nothing here waits on the host: a receive is waited for by the compute
    stream, and each exchange's transfer waits (on its own stream) for the compute that last
    read the buffer it fills."""
    batch, _, num_heads, head_dim = k.shape
    clock = clock or StepClock(k.device)
    plan = plan_transfers(schedule, rank, world)
    inbox = _Inbox(plan, k, num_heads)

    pending = _post(plan[0], inbox.slots(0), k, v, group, clock) if plan else None
    schedule.attend(rank, [(sel.take(k), sel.take(v)) for sel in schedule.select(rank, rank)])
    for i in range(len(plan)):
        clock.mark("compute")
        requests, received, _ = pending
        for req in requests:
            req.wait()  # on NCCL: the compute stream waits for the receive, the host does not
        clock.mark("wait")
        pending = _post(plan[i + 1], inbox.slots(i + 1), k, v, group, clock) if i + 1 < len(plan) else None
        if schedule.gathers():
            schedule.attend_gathered(received, inbox.joined(i) if batch == 1 else None)
        else:
            for sender, pieces in received:
                schedule.attend(sender, pieces)
    clock.mark("compute")


class _Inbox:
    """Two receive buffers, sized for the largest exchange, alternating between exchanges
    (never the tensors sent). An exchange's K pieces lie back to back, then its V pieces, so
    the keys of a gathered exchange are one tensor when the batch is 1 and heads are whole."""

    def __init__(self, plan: list[list[Transfer]], k: torch.Tensor, num_heads: int) -> None:
        self.plan, self.num_heads = plan, num_heads
        self.batch, self.head_dim = k.shape[0], k.shape[3]
        largest = max((2 * self._tokens_x_heads(e) for e in plan), default=0) * self.batch * self.head_dim
        self.buffers = [k.new_empty(largest) for _ in range(min(2, len(plan)))] if largest else []

    def _shape(self, sel: Selection) -> tuple[int, int, int, int]:
        return (self.batch, sel.count, _heads(sel, self.num_heads), self.head_dim)

    def _tokens_x_heads(self, exchange: list[Transfer]) -> int:
        return sum(s.count * _heads(s, self.num_heads) for t in exchange for s in t.recv)

    def slots(self, i: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per transfer of exchange i, per received selection, its (k, v) receive views."""
        exchange = self.plan[i]
        if not self.buffers:  # nothing received in any exchange
            return [[] for _ in exchange]
        buffer = self.buffers[i % len(self.buffers)]
        half = self._tokens_x_heads(exchange) * self.batch * self.head_dim
        slots, offset = [], 0
        for t in exchange:
            pairs = []
            for sel in t.recv:
                shape = self._shape(sel)
                n = math.prod(shape)
                pairs.append(
                    (buffer[offset : offset + n].view(shape), buffer[half + offset : half + offset + n].view(shape))
                )
                offset += n
            slots.append(pairs)
        return slots

    def joined(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Exchange i's K and V as one (1, tokens, H, D) pair, or None where heads are cut."""
        exchange = self.plan[i]
        sels = [s for t in exchange for s in t.recv]
        if not sels or not self.buffers or any(_heads(s, self.num_heads) != self.num_heads for s in sels):
            return None
        tokens = sum(s.count for s in sels)
        shape, n = (1, tokens, self.num_heads, self.head_dim), tokens * self.num_heads * self.head_dim
        buffer = self.buffers[i % len(self.buffers)]
        return buffer[:n].view(shape), buffer[n : 2 * n].view(shape)


def _post(exchange: list[Transfer], slots, k, v, group, clock: StepClock):
    """Post one exchange's sends and receives together; returns its requests, per transfer
    ``(sender, pieces)`` of the receive views, and the tensors sent (held until the exchange
    is waited for: a gathered copy must outlive its send)."""
    import torch.distributed as dist

    ops, outgoing, received = [], [], []
    for transfer, pairs in zip(exchange, slots):
        for n, sel in enumerate(transfer.send):
            for j, x in enumerate((k, v)):
                t = sel.take(x).contiguous()  # the local inputs themselves when the selection is all of them
                outgoing.append(t)
                ops.append(dist.P2POp(dist.isend, t, transfer.dst, group, tag=2 * n + j))
        # a peer's receives in the order it sends (NCCL pairs a pair's operations in order)
        for n, pair in enumerate(pairs):
            for j, t in enumerate(pair):
                ops.append(dist.P2POp(dist.irecv, t, transfer.src, group, tag=2 * n + j))
        received.append((transfer.src, pairs))
    clock.sent_bytes += sum(t.numel() * t.element_size() for t in outgoing)
    clock.steps += bool(ops)
    return (dist.batch_isend_irecv(ops) if ops else []), received, outgoing


def link_bandwidth_gbps(device: torch.device, rank: int, world: int, nbytes: int, reps: int = 5, group=None) -> float:
    """The ring's own exchange with nothing else running: every rank sends ``nbytes`` to the
    next and receives as much from the previous (``batch_isend_irecv``, as ``run_ring`` does);
    bytes one rank sends over the median exchange time, slowest rank's, GB/s (nccl-tests'
    algbw). What the link gives the ring, against which a trial's achieved bandwidth reads."""
    import torch.distributed as dist

    send = torch.ones(nbytes // 2, dtype=torch.bfloat16 if device.type == "cuda" else torch.float16, device=device)
    recv = torch.empty_like(send)
    nxt, prev = (rank + 1) % world, (rank - 1) % world

    def exchange() -> float:
        dist.barrier(group)
        sync(device)
        start = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prev, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        sync(device)
        return time.perf_counter() - start

    exchange()  # the first exchange sets up the connection between the pair
    seconds = sorted(exchange() for _ in range(reps))[reps // 2]
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return nbytes / float(slowest.item()) / 1e9


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
