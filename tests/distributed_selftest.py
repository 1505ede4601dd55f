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
