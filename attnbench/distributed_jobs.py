"""Jobs that run on every rank under ``attnbench.distributed.launch``."""

from __future__ import annotations

from typing import Any

from attnbench.distributed import job
from attnbench.sweeps import seqpar  # noqa: F401  (registers the sequence-parallel jobs)


@job("selftest")
def selftest(payload: dict[str, Any], rank: int, world: int, device: str) -> dict[str, Any]:
    """An all-reduce whose answer is known, and a rank that fails on request (tests use it)."""
    import torch
    import torch.distributed as dist

    if payload.get("fail_rank") == rank:
        raise RuntimeError(f"rank {rank} was asked to fail")
    x = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(x)
    return {"sum": x[0].item(), "expected": world * (world + 1) / 2}
