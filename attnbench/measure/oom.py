"""What kind of failure is an exception: out-of-memory, unsupported, or an error? One place
decides, for every trial."""

from __future__ import annotations

import sys

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
    "memoryerror",  # a child's last stderr line after Python's MemoryError
    "failed to map segment from shared object",  # a library loaded lazily under an address-space cap
)


# The library saying the shape, dtype or layout is outside what it supports (cuDNN's "No
# valid execution plans", "... is not supported"), as opposed to running out of anything.
_UNSUPPORTED_MESSAGES = (
    "no valid execution plans",
    "not supported",
    "no available kernel",
    "cudnn_status_not_supported",
)


def is_unsupported_text(text: str) -> bool:
    text = text.lower()
    return any(m in text for m in _UNSUPPORTED_MESSAGES)


def classify_text(text: str) -> str:
    """The status an error message alone supports."""
    if is_oom_text(text):
        return "oom"
    return "unsupported" if is_unsupported_text(text) else "error"


def is_oom_text(text: str) -> bool:
    text = text.lower()
    return any(m in text for m in _OOM_MESSAGES)


def is_oom(exc: BaseException) -> bool:
    # torch is not imported here: a process that never imported it (the parent, a worker
    # before its job) raises no torch error, and starts without torch's seconds of import
    torch = sys.modules.get("torch")
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def classify(exc: BaseException) -> str:
    """'oom' for an allocation failure, 'unsupported' when the library refuses the shape or
    dtype, 'error' for anything else."""
    if is_oom(exc):
        return "oom"
    return (
        "unsupported"
        if isinstance(exc, (RuntimeError, NotImplementedError)) and is_unsupported_text(str(exc))
        else "error"
    )


def one_line(exc: BaseException) -> str:
    """The exception's name and first line, at most 400 characters, never cut inside a word."""
    from attnbench.units import clip_text

    text = str(exc).strip().splitlines()
    return clip_text(f"{type(exc).__name__}: {text[0] if text else ''}", 400)
