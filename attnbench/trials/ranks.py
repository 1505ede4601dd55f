"""What every rank of a multi-rank trial shares, whatever it runs (a sequence shard, a
speedup strategy's share): its torch device, how its ranks agree, and who announces phases.

A rank job is told its ``Place``; these turn that place into what the measurement core takes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.measure.core import Ranks
from attnbench.runtime.jobs import Place
from attnbench.runtime.supervise import announce_phase

# one rank (a job run in this process): it waits for no one, and its value is the slowest
ALONE = Ranks(barrier=lambda: None, agree_max=lambda value: value)


def rank_device(place: Place) -> torch.device:
    """This rank's device: its own GPU (the launcher made it current) or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if place.device == "cuda" else torch.device("cpu")


def agreement(place: Place) -> Ranks:
    """How the ranks of one step agree: each call after a barrier that also waits for this
    rank's GPU (so call i starts together on every rank), and a value as the slowest rank's."""
    if place.world == 1:
        return ALONE
    import torch.distributed as dist

    cuda = place.device == "cuda"

    def barrier() -> None:
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()

    def agree_max(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=rank_device(place))
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    return Ranks(barrier=barrier, agree_max=agree_max)


def phase_reporter(place: Place) -> Callable[..., None]:
    """Announces a phase on each node's first rank only: its launcher's supervisor reads these
    from that torchrun's stdout, one line a phase."""
    if place.local_rank != 0:
        return lambda name, limit_s=None: None
    return announce_phase
