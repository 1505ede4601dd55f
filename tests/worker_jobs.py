"""Job functions the warm-start tests hand to worker processes (put on their PYTHONPATH by
the test that needs them)."""

import os
from dataclasses import dataclass

from attnbench.runtime.jobs import job


def nothing() -> None:
    """A spare's preload that imports nothing more."""


@dataclass
class Nothing:
    pass


@dataclass
class Worker:
    pid: int
    cuda_initialized: bool  # a CUDA context existed when the job began


@job
def whoami(spec: Nothing) -> Worker:
    """The worker's pid, and whether a CUDA context existed when its job began (none can
    where torch was never imported)."""
    import sys

    torch = sys.modules.get("torch")
    return Worker(os.getpid(), torch is not None and torch.cuda.is_initialized())


def sleep_forever(payload: dict, rank: int, world_size: int, device: str) -> dict:
    """A rank that records its pid in the payload's directory, then never finishes."""
    import time
    from pathlib import Path

    (Path(payload["dir"]) / f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(3600)
    return {}
