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
from attnbench.measure.core import cuda_event

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


def run_ring(
    schedule: RingSchedule,
    k: torch.Tensor,
    v: torch.Tensor,
    rank: int,
    world: int,
    group=None,
    clock: StepClock | None = None,
) -> None:
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
                t = buffers[step % len(buffers)][offset : offset + math.prod(shape)].view(shape)
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
