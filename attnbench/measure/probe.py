"""The resident set's high-water mark on the CPU: reset it, read it (Linux ``/proc``). The
allocator's peaks on CUDA are read by ``measure.core.MemoryProbe``, with these on the CPU."""

from __future__ import annotations

from pathlib import Path

from attnbench.measure.memory import rss_peak_bytes


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
