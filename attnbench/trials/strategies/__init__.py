"""How a trial spreads over processes and GPUs: a small registry of strategies, one module
each (``single``, ``thread``, ``dp``, ``mp`` run the module ``work`` builds; ``ring`` shards
one sequence of a sequence-parallel implementation, ``sequence``). ``device`` places a trial
alone, one implementation's call on one device; it launches nothing, so it is not registered.

A strategy says how many processes to launch for P GPUs, which CUDA devices each rank
uses, which part of the global batch and sequence each rank holds, and how the work is
wrapped (plain, DataParallel, DistributedDataParallel, a ring). It never measures: one place
does that for every strategy (``attnbench.trials.placed_job.measure``), so times, memory and
the output check mean the same thing in every row.

A new strategy is one module here that calls ``register(Strategy(...))`` (or such a module
anywhere: the rank processes import a strategy's module by name before they look it up), and
its label in ``attnbench.plan.strategies``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.errors import AttnbenchError
from attnbench.registry import Registry
from attnbench.results.schema import Speedup
from attnbench.trials.workload import Workload

MODULES = ("attention", "multihead")
# torch's built-in DDP gradient-compression hooks, by the dtype they send
GRAD_COMPRESSION = ("bf16", "fp16")


@dataclass(frozen=True)
class RankContext:
    """What one rank knows: the whole problem and its place in the world."""

    workload: Workload  # global batch and sequence length
    module: str  # attention | multihead
    grad_compression: str | None
    gpus: int  # GPUs of the run (processes on the CPU)
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    seed: int = 0
    fail_rank: int | None = None  # a test's fault: this rank raises once its inputs are made

    @property
    def cuda(self) -> bool:
        return self.workload.device == "cuda"

    def device(self, index: int | None = None) -> torch.device:
        if not self.cuda:
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank if index is None else index)


@dataclass
class Prepared:
    """A rank's share of the work, ready to run."""

    step: Callable[[], None]  # one timed iteration (forward, or forward + backward)
    output: Callable[[], torch.Tensor]  # this rank's output, (len(batch), tokens, ...) in global order
    batch: range  # global batch indices this rank's output holds
    tokens: slice = field(default_factory=lambda: slice(None))  # global tokens held (all unless sequence-parallel)
    grads: Callable[[], torch.Tensor | None] = lambda: None  # flat parameter gradients after one step
    backend: Callable[[], str | None] = lambda: None  # what the kernel really ran
    kv_layout: Callable[[], str | None] = lambda: None  # grouped K/V: shared, or copied per query head
    replica_batches: list[list[int]] | None = None  # DataParallel: [gpu, batch size] each replica got, as it ran
    compiles: bool = False  # its first call compiles (timed apart)
    gpu_timed: bool | None = None  # whether GPU time can be taken over its ranks (None: in one process only)
    after_call: Callable[[], dict[str, Any]] | None = None  # what a call did, read after each timed call


def _no_check(wl: Workload, gpus: int) -> None:
    return None


@dataclass(frozen=True)
class Strategy:
    """A strategy's code; its label and what it does are declared without torch, under the same
    name, in ``attnbench.plan.strategies``."""

    name: str
    processes: Callable[[int], int]  # ranks to launch for P GPUs
    devices: Callable[[RankContext], list[int]]  # CUDA devices a rank uses (allocator peaks read there)
    prepare: Callable[[RankContext], Prepared]
    link: Callable[[RankContext], float | None] = lambda ctx: None  # GB/s between its ranks, before the trial
    world_size: Callable[[int], int] = lambda gpus: gpus  # the GPUs a row of this strategy names
    check: Callable[[Workload, int], None] = _no_check  # bad input: raise AttnbenchError naming the fix
    skip: Callable[[str], str | None] = lambda device: None  # why it cannot run on this device type
    notes: Callable[[Speedup], list[str]] = lambda row: []  # what really happened, from the row
    min_gpus: int = 2  # GPUs it needs to mean anything (1: it runs on a one-GPU machine too)
    # whether its one process may also take GPU time: a CUDA graph or events on the caller's stream
    # see only work launched there, not what other threads launch (DataParallel's replicas, thread)
    gpu_timed: bool = True

    @property
    def module_name(self) -> str:
        """Where the rank processes find it."""
        return self.prepare.__module__


# the strategies, each registered by its module in this package
STRATEGIES: Registry[Strategy] = Registry("strategy", __name__)


def register(strategy: Strategy) -> Strategy:
    return STRATEGIES.register(strategy.name, strategy)


def get(name: str) -> Strategy:
    known = STRATEGIES.entries()
    if name not in known:
        raise AttnbenchError(f"unknown strategy {name!r}: choose from {', '.join(n for n in known if n != 'single')}")
    return known[name]
