"""Is a failure an out-of-memory? One place decides, for every trial."""

from __future__ import annotations

import torch

# Allocation failures that do not surface as torch.OutOfMemoryError: the CPU allocator,
# cuBLAS / cuDNN handles and workspaces, and raw CUDA runtime calls.
_OOM_MESSAGES = (
    "out of memory",  # "CUDA out of memory", "CUDA error: out of memory"
    "defaultcpuallocator: can't allocate memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_not_enough_workspace",
    "cusolver_status_alloc_failed",
    "failed to allocate memory",
)


def is_oom_text(text: str) -> bool:
    text = text.lower()
    return any(m in text for m in _OOM_MESSAGES)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def classify(exc: BaseException) -> str:
    """'oom' for an allocation failure, 'error' for anything else."""
    return "oom" if is_oom(exc) else "error"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]
