"""Job functions the warm-start tests hand to worker processes (put on their PYTHONPATH by
the test that needs them)."""

import os


def nothing() -> None:
    """A spare's preload that imports nothing more."""


def whoami(args: dict) -> dict:
    """The worker's pid, and whether a CUDA context existed when its job began."""
    import torch

    return {"pid": os.getpid(), "cuda_initialized": torch.cuda.is_initialized()}
