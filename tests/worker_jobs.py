"""Job functions the warm-start tests hand to worker processes (put on their PYTHONPATH by
the test that needs them)."""

import os
from dataclasses import dataclass

from attnbench.runtime.jobs import Place, job


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


@dataclass
class Folder:
    dir: str


@job
def sleep_forever(spec: Folder, place: Place) -> Nothing:
    """A rank that records its pid in the spec's folder, then never finishes."""
    import time
    from pathlib import Path

    (Path(spec.dir) / f"rank{place.rank}.pid").write_text(str(os.getpid()))
    time.sleep(3600)
    return Nothing()
