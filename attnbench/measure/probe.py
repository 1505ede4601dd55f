"""A trial's peak memory: allocator peaks on CUDA (reset per trial), resident-set peaks on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnbench.measure.memory import current_rss_bytes, rss_peak_bytes


class MemoryProbe:
    """``start`` resets the peak and notes the baseline; ``peaks`` reads what the trial added."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.base = 0
        self.frozen: dict[str, Any] | None = None

    def restart_peak(self, name: str) -> dict[str, Any]:
        """The peak so far under ``name`` (compilation, autotuning), then a fresh peak."""
        if not self.cuda:
            return {}
        peak = torch.cuda.max_memory_allocated(0)
        torch.cuda.reset_peak_memory_stats(0)
        return {name: peak}

    def freeze(self) -> None:
        """Report the peaks as they are now; later allocations (CUDA-graph pools, counting
        pairs from a declared mask) are not the trial's. The first freeze holds."""
        if self.frozen is None:
            self.frozen = self.peaks()

    def start(self, limit: int | None) -> None:
        if self.cuda:
            torch.cuda.set_device(0)
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(0).total_memory
            if limit:
                torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), 0)
            torch.cuda.reset_peak_memory_stats(0)
            self.base = torch.cuda.memory_allocated(0)
        else:
            torch.ones(256, 256) @ torch.ones(256, 256)  # start the thread pool before any limit
            reset_rss_peak()
            self.base = current_rss_bytes()

    def in_use(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated(0) - self.base
        return current_rss_bytes() - self.base

    def peaks(self) -> dict[str, Any]:
        if self.frozen is not None:
            return self.frozen
        if self.cuda:
            if not torch.cuda.is_initialized():
                return {}
            return {
                "max_memory_allocated": torch.cuda.max_memory_allocated(0),
                "max_memory_reserved": torch.cuda.max_memory_reserved(0),
                "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
            }
        return {
            "cpu_peak_rss_delta": max(0, rss_high_water() - self.base) if self.base else None,
            "cpu_peak_rss": rss_peak_bytes(),
        }


def reset_rss_peak() -> None:
    """Linux resets VmHWM on '5' to clear_refs, so in-process trials get their own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def rss_high_water() -> int:
    """This process's resident-set high-water mark since the last ``reset_rss_peak``."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return rss_peak_bytes()
