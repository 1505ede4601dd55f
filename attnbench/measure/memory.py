"""Peak memory: NVML device memory sampled in the background, and process RSS on the CPU.

NVML counts everything on a GPU (the CUDA context, library workspaces, other processes), so
it complements the allocator's ``max_memory_allocated``; a table says which one it shows.
"""

from __future__ import annotations

import resource
import threading
from typing import Protocol


class NvmlBackend(Protocol):
    def device_count(self) -> int: ...
    def used_bytes(self, index: int) -> int: ...


class PynvmlBackend:
    """The real NVML, through the ``pynvml`` module of nvidia-ml-py."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def device_count(self) -> int:
        return len(self._handles)

    def used_bytes(self, index: int) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[index]).used)


def open_nvml() -> tuple[NvmlBackend | None, str]:
    """The NVML backend, or None and the reason it is unavailable."""
    try:
        backend = PynvmlBackend()
    except Exception as exc:  # no driver, no library, no GPU: all mean "no NVML"
        return None, f"NVML unavailable ({type(exc).__name__}: {str(exc).strip() or 'no detail'})"
    if backend.device_count() == 0:
        return None, "NVML sees no GPU"
    return backend, ""


class NvmlSampler:
    """Polls every GPU's used memory on a thread; keeps the baseline and the peak per GPU."""

    def __init__(self, backend: NvmlBackend | None, interval_s: float = 0.005) -> None:
        self.backend = backend
        self.interval_s = interval_s
        n = backend.device_count() if backend else 0
        self.baseline = [0] * n
        self.peak = [0] * n
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        for i in range(len(self.peak)):
            self.peak[i] = max(self.peak[i], self.backend.used_bytes(i))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def __enter__(self) -> NvmlSampler:
        if self.backend is not None:
            self.baseline = [self.backend.used_bytes(i) for i in range(len(self.peak))]
            self.peak = list(self.baseline)
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._poll()  # a last reading, so a peak right before exit is not missed

    def per_gpu(self) -> list[dict[str, int]]:
        return [
            {"index": i, "nvml_used_before": b, "nvml_used_peak": p}
            for i, (b, p) in enumerate(zip(self.baseline, self.peak))
        ]


def rss_peak_bytes() -> int:
    """High-water resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def current_vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


class CpuMemoryLimit:
    """Caps this process's address space at its current size plus ``limit`` bytes, so a
    CPU trial meets a real allocation failure; restores the old limit on exit."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._old: tuple[int, int] | None = None

    def __enter__(self) -> CpuMemoryLimit:
        if self.limit:
            self._old = resource.getrlimit(resource.RLIMIT_AS)
            soft = current_vm_bytes() + self.limit
            hard = self._old[1]
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            resource.setrlimit(resource.RLIMIT_AS, self._old)
