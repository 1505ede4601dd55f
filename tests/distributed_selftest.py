"""A job for tests/test_distributed.py whose answer is known. Rank processes import this
module by name (the test puts tests/ on their PYTHONPATH)."""

import os
import signal
from typing import Any

import torch
import torch.distributed as dist


def selftest(payload: dict[str, Any], rank: int, world: int, device: str) -> dict[str, Any]:
    """An all-reduce of rank+1 over the ranks (sum world*(world+1)/2), and a rank that fails
    or is killed on request."""
    if payload.get("fail_rank") == rank:
        raise RuntimeError(f"rank {rank} was asked to fail")
    if payload.get("kill_rank") == rank:  # as `kill -9` from a shell would
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(x)
    return {"sum": x[0].item(), "expected": world * (world + 1) / 2}


def ring_exchanges(payload: dict[str, Any], rank: int, world: int, device: str) -> dict[str, Any]:
    """``ring`` in each exchange plan of ``payload["plans"]``, ``[plan, batch]`` pairs, its
    thresholds set so a short shard takes it: ``steps`` (one exchange per peer), ``pieces``
    (K/V cut in pieces), ``gather`` (every peer's K/V in one exchange): per plan and batch,
    the gathered output's error against the float64 reference, causal and not, and how many
    exchanges a call made. One launch runs them all (the thresholds are read at each call)."""
    from attnbench.impls.sequence_parallel import ring

    defaults = (ring.GATHER_BLOCK_FLOP, ring.WHOLE_SHARD_TOKENS, ring.MIN_PIECE_TOKENS, ring.PIECES_PER_SHARD)
    found = {}
    for plan, batch in payload["plans"]:
        ring.GATHER_BLOCK_FLOP, ring.WHOLE_SHARD_TOKENS, ring.MIN_PIECE_TOKENS, ring.PIECES_PER_SHARD = defaults
        ring.GATHER_BLOCK_FLOP = 1 << 60 if plan == "gather" else 0
        if plan == "pieces":
            ring.WHOLE_SHARD_TOKENS, ring.MIN_PIECE_TOKENS, ring.PIECES_PER_SHARD = 16, 8, 4
        found[f"{plan} batch={batch}"] = _ring_errors(payload["seq_len"], batch, rank, world)
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
