"""A job for tests/test_distributed.py whose answer is known. Rank processes import this
module by name (the test puts tests/ on their PYTHONPATH)."""

import os
import signal
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from attnbench.runtime.jobs import Place, job


@dataclass
class Faults:
    fail_rank: int | None = None  # this rank raises
    kill_rank: int | None = None  # this rank is killed, as `kill -9` from a shell would


@dataclass
class Summed:
    sum: float
    expected: float


@job
def selftest(spec: Faults, place: Place) -> Summed:
    """An all-reduce of rank+1 over the ranks (sum world*(world+1)/2), and a rank that fails
    or is killed on request."""
    if spec.fail_rank == place.rank:
        raise RuntimeError(f"rank {place.rank} was asked to fail")
    if spec.kill_rank == place.rank:
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.full((4,), float(place.rank + 1), device=place.device)
    dist.all_reduce(x)
    return Summed(x[0].item(), place.world * (place.world + 1) / 2)


@dataclass
class Plans:
    seq_len: int
    plans: list[tuple[str, int]]  # (plan, batch)


@dataclass
class Errors:
    found: dict[str, dict[str, float]] = field(default_factory=dict)  # "plan batch=B" -> what it found


@job
def ring_exchanges(spec: Plans, place: Place) -> Errors:
    """``ring`` in each exchange plan of ``spec.plans``, ``(plan, batch)`` pairs, its
    thresholds set so a short shard takes it: ``steps`` (one exchange per peer), ``pieces``
    (K/V cut in pieces), ``gather`` (every peer's K/V in one exchange): per plan and batch,
    the gathered output's error against the float64 reference, causal and not, and how many
    exchanges a call made. One launch runs them all (the thresholds are read at each call)."""
    from attnbench.impls.sequence_parallel import ring

    defaults = (ring.GATHER_BLOCK_FLOP, ring.WHOLE_SHARD_TOKENS, ring.MIN_PIECE_TOKENS, ring.PIECES_PER_SHARD)
    found = Errors()
    for plan, batch in spec.plans:
        ring.GATHER_BLOCK_FLOP, ring.WHOLE_SHARD_TOKENS, ring.MIN_PIECE_TOKENS, ring.PIECES_PER_SHARD = defaults
        ring.GATHER_BLOCK_FLOP = 1 << 60 if plan == "gather" else 0
        if plan == "pieces":
            ring.WHOLE_SHARD_TOKENS, ring.MIN_PIECE_TOKENS, ring.PIECES_PER_SHARD = 16, 8, 4
        found.found[f"{plan} batch={batch}"] = _ring_errors(spec.seq_len, batch, place.rank, place.world)
    return found


def _ring_errors(seq: int, batch: int, rank: int, world: int) -> dict[str, float]:
    from attnbench.impls import build_for_ranks
    from attnbench.trials.reference import masked_reference, relative_error

    heads, dim = 2, 8
    impl = build_for_ranks("ring", {}, world)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(batch, seq, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    found = {}
    for causal in (False, True):
        positions = [impl.shard_positions(seq, r, causal) for r in range(world)]
        out = impl(*(x[:, positions[rank]].float() for x in (q, k, v)), is_causal=causal)
        shards = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(shards, out.contiguous())
        full = torch.empty(batch, seq, heads, dim)
        for r in range(world):
            full[:, positions[r]] = shards[r]
        mask = impl.key_mask(seq, heads, causal=causal)
        found[f"causal={causal}"] = relative_error(full, masked_reference(q, k, v, mask))
        found[f"exchanges causal={causal}"] = impl.last_breakdown()["comm_steps"]
    return found
