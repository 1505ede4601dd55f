"""Peak memory: NVML device memory sampled in the background, and process RSS on the CPU.

NVML counts everything on a GPU (the CUDA context, library workspaces, other processes), so
it complements the allocator's ``max_memory_allocated``; a table says which one it shows.
The same sampler reads SM and memory clocks, power and throttle reasons, which explain a
time that moved: a GPU boosts for the first second after idle and slows when hot or capped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import statistics
import threading
import time
from collections import deque
from typing import Protocol

# A clock that moved more than this share of its median during the timed calls flags the row.
CLOCK_MOVE_FRACTION = 0.03
# Warm-up waits until the SM clock stayed within this share over the last SETTLE_S seconds
# (the same share that flags a row: a settled clock is one that would not be flagged).
SETTLE_FRACTION = CLOCK_MOVE_FRACTION
SETTLE_S = 0.25
# NVML's clock event (throttle) reason bits; stable across driver versions.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class NvmlBackend(Protocol):
    def device_count(self) -> int: ...
    def used_bytes(self, index: int) -> int: ...

    # optional: clocks(index) -> {"sm_mhz", "mem_mhz", "power_w", "throttle"} (a backend
    # without it records memory only)


def visible_nvml_indices(pynvml) -> list[int]:
    """NVML indices of the GPUs this process's CUDA sees, in CUDA's order: all of them, or
    those ``CUDA_VISIBLE_DEVICES`` names (by index or UUID, as CUDA reads it: up to the first
    entry that names no GPU). NVML itself ignores that variable, so a run restricted to one GPU
    of two would otherwise read, and be filed under, both."""
    count = pynvml.nvmlDeviceGetCount()
    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if wanted is None:
        return list(range(count))
    uuids = []
    for j in range(count):
        u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(j))
        uuids.append(u.decode() if isinstance(u, bytes) else u)
    found: list[int] = []
    for entry in (e.strip() for e in wanted.split(",")):
        j = _visible_entry(entry, uuids)
        if j is None or j in found:
            break
        found.append(j)
    return found


def _visible_entry(entry: str, uuids: list[str]) -> int | None:
    """The NVML index one ``CUDA_VISIBLE_DEVICES`` entry names: an index, or a UUID (or its
    unique prefix, with or without ``GPU-``)."""
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if not entry:
        return None
    prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    matches = [j for j, u in enumerate(uuids) if u.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


class PynvmlBackend:
    """The real NVML, through the ``pynvml`` module of nvidia-ml-py, over the GPUs this
    process's CUDA sees: index i is CUDA device i (``nvml_indices[i]`` its NVML index)."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self.nvml_indices = visible_nvml_indices(pynvml)
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(j) for j in self.nvml_indices]

    def device_count(self) -> int:
        return len(self._handles)

    def used_bytes(self, index: int) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[index]).used)

    def clocks(self, index: int) -> dict[str, float]:
        nv, h = self._nvml, self._handles[index]
        reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return {
            "sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "throttle": int(reasons(h)),
        }


def open_nvml() -> tuple[NvmlBackend | None, str]:
    """The NVML backend, or None and the reason it is unavailable."""
    try:
        backend = PynvmlBackend()
    except Exception as exc:  # no driver, no library, no GPU: all mean "no NVML"
        return None, f"NVML unavailable ({type(exc).__name__}: {str(exc).strip() or 'no detail'})"
    if backend.device_count() == 0:
        return None, "NVML sees no GPU"
    return backend, ""


class SomeGpus:
    """An NVML backend restricted to some GPUs (a rank's own, by their CUDA indices): its
    index i is the i-th of them."""

    def __init__(self, backend: NvmlBackend, cuda_indices: list[int]) -> None:
        self.backend, self.cuda_indices = backend, cuda_indices
        self.nvml_indices = [nvml_index_of(backend, i) for i in cuda_indices]

    def device_count(self) -> int:
        return len(self.cuda_indices)

    def used_bytes(self, index: int) -> int:
        return self.backend.used_bytes(self.cuda_indices[index])


def gpus_nvml(cuda_indices: list[int]) -> tuple[SomeGpus | None, str]:
    """NVML for CUDA devices ``cuda_indices`` alone (the backend numbers GPUs as CUDA does)."""
    backend, note = open_nvml()
    if backend is None:
        return None, note
    missing = [i for i in cuda_indices if i >= backend.device_count()]
    if missing:
        return None, f"NVML sees no GPU for CUDA device {missing[0]}"
    return SomeGpus(backend, list(cuda_indices)), ""


def nvml_index_of(backend: NvmlBackend | None, cuda_index: int) -> int | None:
    """The NVML index of CUDA device ``cuda_index`` (None without NVML)."""
    indices = getattr(backend, "nvml_indices", None)
    if indices is None:
        return cuda_index if backend is not None else None
    return indices[cuda_index] if cuda_index < len(indices) else None


class NvmlSampler:
    """Polls every GPU's used memory on a thread; keeps the baseline and the peak per GPU,
    and, inside ``recording()``, every GPU's clocks, power and throttle reasons."""

    def __init__(self, backend: NvmlBackend | None, interval_s: float = 0.005) -> None:
        self.backend = backend
        self.interval_s = interval_s
        n = backend.device_count() if backend else 0
        self.baseline = [0] * n
        self.peak = [0] * n
        self._has_clocks = backend is not None and hasattr(backend, "clocks")
        self._recent: deque[tuple[float, float]] = deque()  # (time, SM MHz of GPU 0)
        self._readings: list[list[dict[str, float]]] = [[] for _ in range(n)]
        self._recording = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        for i in range(len(self.peak)):
            self.peak[i] = max(self.peak[i], self.backend.used_bytes(i))
        if not self._has_clocks:
            return
        now = time.monotonic()
        with self._lock:
            for i in range(len(self.peak)):
                if i > 0 and not self._recording:
                    break
                try:
                    reading = self.backend.clocks(i)
                except Exception:  # a GPU or driver without these counters: memory only
                    self._has_clocks = False
                    return
                if i == 0:
                    self._recent.append((now, reading["sm_mhz"]))
                    while self._recent and self._recent[0][0] < now - SETTLE_S:
                        self._recent.popleft()
                if self._recording:
                    self._readings[i].append(reading)

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

    def clocks_settled(self) -> bool:
        """The SM clock of GPU 0 stayed within SETTLE_FRACTION over the last SETTLE_S (true
        without clock readings: nothing to wait for)."""
        if not self._has_clocks or self._thread is None:
            return True
        with self._lock:
            mhz = [m for _, m in self._recent]
        if len(mhz) < 5:
            return False
        return max(mhz) <= (1 + SETTLE_FRACTION) * min(mhz)

    @contextlib.contextmanager
    def recording(self):
        """Keep clock readings of every GPU while the block runs (the timed calls)."""
        with self._lock:
            self._readings = [[] for _ in self.peak]
            self._recording = True
        try:
            yield self
        finally:
            if self._has_clocks and self._thread is not None:
                self._poll()  # at least one reading, however short the block
            with self._lock:
                self._recording = False

    def clock_summary(self) -> dict[str, object]:
        """Per GPU: min / median / max of SM and memory clocks and power, the throttle reasons
        seen; ``clocks_moved`` when a clock of a GPU this trial used moved beyond
        CLOCK_MOVE_FRACTION of its median."""
        per_gpu, moved = [], False
        used = [i for i in range(len(self.peak)) if self.peak[i] > self.baseline[i]] or list(range(len(self.peak)))
        for i, readings in enumerate(self._readings):
            if not readings:
                continue
            entry: dict[str, object] = {"index": i, "readings": len(readings)}
            for key in ("sm_mhz", "mem_mhz", "power_w"):
                values = [r[key] for r in readings]
                med = statistics.median(values)
                entry[key] = {"min": min(values), "median": med, "max": max(values)}
                if key != "power_w" and i in used and med and (max(values) - min(values)) / med > CLOCK_MOVE_FRACTION:
                    moved = True
            mask = 0
            for r in readings:
                mask |= int(r["throttle"])
            entry["throttle_reasons"] = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
            per_gpu.append(entry)
        return {"clocks": per_gpu, "clocks_moved": moved} if per_gpu else {}

    def per_gpu(self) -> list[dict[str, int]]:
        """Per GPU by its CUDA index: its NVML index, used memory before and at the peak."""
        cuda = getattr(self.backend, "cuda_indices", None) or range(len(self.peak))  # a subset's own numbering
        return [
            {"index": cuda[i], "nvml_index": nvml_index_of(self.backend, i), "nvml_used_before": b, "nvml_used_peak": p}
            for i, (b, p) in enumerate(zip(self.baseline, self.peak))
        ]


def nvml_settings() -> dict[str, object]:
    """What a GPU's settings do to timings: persistence mode and application clocks per GPU
    (empty without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(j) for j in visible_nvml_indices(pynvml)]
    except Exception:  # no NVML: the environment says so elsewhere
        return {}
    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    reads = {
        "persistence_mode": lambda h: pynvml.nvmlDeviceGetPersistenceMode(h),
        "applications_sm_mhz": lambda h: pynvml.nvmlDeviceGetApplicationsClock(h, sm),
        "applications_mem_mhz": lambda h: pynvml.nvmlDeviceGetApplicationsClock(h, mem),
        "max_sm_mhz": lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, sm),
    }
    return {"gpu_settings": [{"index": i, **_readable(reads, h)} for i, h in enumerate(handles)]}


def _readable(reads, handle) -> dict[str, int]:
    """The settings this GPU and driver report; one not supported is left out."""
    out = {}
    for key, read in reads.items():
        with contextlib.suppress(Exception):
            out[key] = int(read(handle))
    return out


def rss_peak_bytes() -> int:
    """High-water resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def current_vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def start_cpu_runtime() -> None:
    """Start torch's CPU thread pool and its BLAS for both reference dtypes. Their threads'
    stacks and malloc arenas are tens of MiB of address space, more or fewer by CPU vendor
    and BLAS (80 MiB at the first matmul on an Intel Xeon with MKL): the runtime's, counted
    before a trial's memory limit, not against it."""
    import torch

    for dtype in (torch.float32, torch.float64):
        x = torch.ones(64, 64, dtype=dtype)
        x @ x


# glibc's malloc raises its mmap threshold to the size of each large block freed (up to 32 MiB);
# blocks of that size then come from a heap it keeps after they are freed, so a trial's address
# space and resident peak depend on the order of its frees: tens of MiB from one process to the
# next at the same length. A fixed threshold (glibc's default start) maps each block of 128 KiB or
# more on its own and unmaps it when freed: what a trial holds is what its tensors hold.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Fix this process's malloc mmap threshold (glibc); False where the C library has no ``mallopt``."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


class CpuMemoryLimit:
    """Caps this process's address space at its current size plus ``limit`` bytes, so a
    CPU trial meets a real allocation failure; restores the old limit on exit. The CPU
    runtime is started first, so the limit is the trial's alone on any machine, and the
    malloc mmap threshold is fixed, so the limit meets what the trial's tensors hold, not what
    the allocator kept of freed ones (``fix_mmap_threshold``; it stays fixed after the trial)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._old: tuple[int, int] | None = None

    def __enter__(self) -> CpuMemoryLimit:
        if self.limit:
            start_cpu_runtime()
            fix_mmap_threshold()
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
