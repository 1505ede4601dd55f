"""The measurement core: one measured step, however many processes run it.

``measure_step`` runs a step (a callable: forward, or forward plus backward) under one policy
and returns one ``Measurement`` holding the raw samples; a row takes them and computes their
statistics (through ``timing.sample_statistics``, the one place they are computed). A trial
in one process, a sequence-parallel rank and a speedup rank all measure through it, so a time,
a peak and a time-limit mean the same thing in every row.

The policy, in order:

1. a compiled kernel's first call pays for compilation: timed and its allocator peak kept apart;
2. the first call, cold (library setup, allocator warm-up): recorded, never judged;
3. where it took longer than the per-call limit, one warm call decides the time limit;
4. warm-up: by time until the GPU clock settles in one process; a count planned from the
   slowest rank's call where ranks must make the same calls (their collectives line up);
5. timed calls planned from a warm call (ranks: each after a barrier, the slowest rank's plan);
6. on one CUDA process, GPU time beside the eager time (``gpu_time``), for calls under a second;
   in one CPU process, each timed call's CPU time beside its wall time, every call at the
   policy's thread count.

This module is the only place that creates CUDA timing events (``Timer``, ``cuda_event``, the
GPU-time samples) and reads the allocator's peaks (``MemoryProbe``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.measure.memory import NvmlSampler, current_rss_bytes, rss_peak_bytes
from attnbench.measure.probe import reset_rss_peak, rss_high_water
from attnbench.measure.timing import (
    TimingPolicy,
    cold_call_limit_s,
    plan_calls,
    timed_samples,
    warm_up,
)

# Calls faster than this get an L2 flush before each call when GPU time is taken.
FLUSH_BELOW_MS = 1.0
# The GPU-time sample covers at least this much work, so event resolution (~0.5 us) is noise.
GPU_SAMPLE_MS = 10.0
# On the CPU a first call this long has warmed what it touches: it counts as the warm-up.
WARM_AFTER_MS = 1000.0
# Calls this long are not timed again for GPU time: the host's microseconds of dispatch are
# far below the eager samples' spread, and each GPU-time sample would cost another call.
GPU_TIME_BELOW_MS = 1000.0

Step = Callable[[], object]
Phase = Callable[..., None]  # phase(name, limit_s=None): tell a supervising parent what runs now


# ---------------------------------------------------------------------------------------
# Timers
# ---------------------------------------------------------------------------------------


def cuda_event() -> torch.cuda.Event:
    """A recorded CUDA timing event (the ring engine marks its compute and wait with these)."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


class Timer:
    """Times one call of ``fn``; synchronizes the device so each sample is one call."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.name = "cuda-event" if self.cuda else "perf_counter"

    def __call__(self, fn: Step) -> float:
        if self.cuda:
            start = cuda_event()
            fn()
            end = cuda_event()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def gpu_samples(
    fn: Step, warm_ms: float, n: int, flush_bytes: int = 0, ranks: Ranks | None = None
) -> tuple[list[float], str]:
    """GPU time per call, ``n`` samples, and how it was taken (``cuda-graph`` or
    ``back-to-back``; ``+l2-flush`` where a flush preceded each call). With ``ranks`` (a
    step whose calls exchange data between processes) every choice is agreed, so the ranks
    replay the same calls together: a graph on every rank or on none, the same flush."""
    agree = ranks.agree_max if ranks else (lambda x: x)
    graph = _capture(fn, replay=ranks is None)
    if agree(float(graph is None)):
        graph = None
    run = graph.replay if graph is not None else fn
    how = "cuda-graph" if graph is not None else "back-to-back"
    reps = max(1, int(GPU_SAMPLE_MS / max(warm_ms, 1e-3)))
    flush = None
    if flush_bytes and warm_ms < FLUSH_BELOW_MS:
        flush = _flush_buffer(flush_bytes, ranks is not None)
        if agree(float(flush is None)):
            flush = None
        else:
            how += "+l2-flush"
    samples = []
    for _ in range(n):
        if ranks:
            ranks.barrier()
        work = _between_events(run, reps, flush)
        overhead = _between_events(None, reps, flush) if flush is not None else 0.0
        samples.append(max(work - overhead, 0.0) / reps)
    del graph, flush
    return samples, how


def _flush_buffer(nbytes: int, quiet: bool) -> torch.Tensor | None:
    """The L2 flush buffer; None where it does not fit and ``quiet`` (ranks agree on it)."""
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        if not quiet:
            raise
        return None


def _between_events(run: Step | None, reps: int, flush: torch.Tensor | None) -> float:
    start = cuda_event()
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        if run is not None:
            run()
    end = cuda_event()
    end.synchronize()
    return float(start.elapsed_time(end))


def _capture(fn: Step, replay: bool = True):
    """A CUDA graph of one call of ``fn``, or None where the implementation cannot be
    captured (host synchronisation, data-dependent shapes, collectives, autograd in some
    versions). ``replay``: replay it once to prove it runs (not for ranks, whose replay
    needs every peer's, which waits until all have agreed on their graphs)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        if replay:
            graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:  # anything capture rejects means "time it eagerly, back to back"
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None


def gpu_time(
    fn: Step, eager: list[float], budget_s: float | None = None, ranks: Ranks | None = None
) -> dict[str, object]:
    """Row fields of GPU time for a step whose eager samples are ``eager``, in at most half
    of ``budget_s`` (at least 3 samples); a failure (capture or flush out of memory, say)
    leaves the eager row intact and says why. ``ranks``: processes timing one step together
    (their slowest median decides the plan, the same on every rank)."""
    from attnbench.measure import oom

    warm_ms = ranks.agree_max(statistics.median(eager)) if ranks else statistics.median(eager)
    n = len(eager)
    if budget_s:
        n = min(n, max(3, int(budget_s * 1e3 / 2 / max(warm_ms, GPU_SAMPLE_MS))))
    try:
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or 0
        samples, how = gpu_samples(fn, warm_ms, n, 2 * l2, ranks)
        return {"gpu_times_ms": samples, "gpu_timer": how}
    except Exception as exc:  # GPU time is extra: its failure must not lose the eager row
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return {"gpu_times_ms": [], "gpu_timer": f"failed: {oom.one_line(exc)}"}


# ---------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------


@dataclass
class Peaks:
    """A step's peak memory, named as a row's fields: the allocator's on a GPU, the resident set's on the CPU."""

    max_memory_allocated: int | None = None
    max_memory_reserved: int | None = None
    device_total_bytes: int | None = None  # the GPU's memory
    cpu_peak_rss_delta: int | None = None  # growth of the resident set's peak since ``start``
    cpu_peak_rss: int | None = None


class MemoryProbe:
    """Peak memory of a measured step: allocator peaks of the CUDA devices it uses (reset at
    ``start``), or the resident set's growth on the CPU. ``start`` notes the baseline and caps
    the allocator at ``limit`` bytes on each device; ``peaks`` reads what the step added."""

    def __init__(self, devices: Sequence[int] = ()) -> None:
        self.devices = list(devices)  # CUDA device indices; none: the CPU
        self.cuda = bool(self.devices)
        self.base = 0
        self.frozen: tuple[Peaks, dict[str, dict[str, int]]] | None = None

    def start(self, limit: int | None) -> None:
        if self.cuda:
            torch.cuda.set_device(self.devices[0])
            torch.cuda.empty_cache()
            for d in self.devices:
                if limit:
                    total = torch.cuda.get_device_properties(d).total_memory
                    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), d)
                torch.cuda.reset_peak_memory_stats(d)
            self.base = torch.cuda.memory_allocated(self.devices[0])
        else:
            torch.ones(256, 256) @ torch.ones(256, 256)  # start the thread pool before any limit
            reset_rss_peak()
            self.base = current_rss_bytes()

    def in_use(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated(self.devices[0]) - self.base
        # the resident set can shrink below its baseline (pages handed back): that is none in use
        return max(0, current_rss_bytes() - self.base)

    def restart_peak(self) -> int | None:
        """The allocator peak so far (compilation, autotuning), then a fresh peak."""
        if not self.cuda:
            return None
        peak = max(torch.cuda.max_memory_allocated(d) for d in self.devices)
        for d in self.devices:
            torch.cuda.reset_peak_memory_stats(d)
        return peak

    def freeze(self) -> None:
        """Report the peaks as they are now; later allocations (CUDA-graph pools, counting
        pairs from a declared mask) are not the step's. The first freeze holds."""
        if self.frozen is None:
            self.frozen = (self.peaks(), self.allocator())

    def peaks(self) -> Peaks:
        """The first device's peaks (the trial's device, a rank's own GPU); on the CPU the
        resident set's high-water mark and its growth since ``start``."""
        if self.frozen is not None:
            return self.frozen[0]
        if self.cuda:
            if not torch.cuda.is_initialized():
                return Peaks()
            d = self.devices[0]
            return Peaks(
                **self.allocator()[str(d)], device_total_bytes=torch.cuda.get_device_properties(d).total_memory
            )
        return Peaks(
            cpu_peak_rss_delta=max(0, rss_high_water() - self.base) if self.base else None,
            cpu_peak_rss=rss_peak_bytes(),
        )

    def allocator(self) -> dict[str, dict[str, int]]:
        """Allocator peaks of every device, by CUDA index (a process spread over several GPUs)."""
        if self.frozen is not None:
            return self.frozen[1]
        if not self.cuda or not torch.cuda.is_initialized():
            return {}
        return {
            str(d): {
                "max_memory_allocated": torch.cuda.max_memory_allocated(d),
                "max_memory_reserved": torch.cuda.max_memory_reserved(d),
            }
            for d in self.devices
        }


def tensor_peak_bytes(step: Step) -> int | None:
    """Bytes of tensors one call of ``step`` held at once, beyond those it started with: each
    operator's outputs counted by their storage from when it returns them until they are
    freed (a dispatch mode sees every operator below autograd, the backward's included). On
    the CPU this is what CUDA's allocator peak is on a GPU: identical runs give identical
    counts, where the resident set moves by tens of MiB between processes. Buffers a kernel
    allocates and frees inside itself are not seen. None where the call fails here: the
    count is extra and must not change a trial's outcome."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class HeldTensors(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.held = self.peak = 0
            self.storages: dict[int, Any] = {}  # id of a live storage -> its finalizer

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self.storages:
                    self._hold(t.untyped_storage())
            return out

        def _hold(self, storage) -> None:
            key, size = id(storage), storage.nbytes()
            self.storages[key] = weakref.finalize(storage, self._free, key, size)
            self.held += size
            self.peak = max(self.peak, self.held)

        def _free(self, key: int, size: int) -> None:
            self.held -= size
            self.storages.pop(key, None)

    counter = HeldTensors()
    try:
        with counter:
            step()
    except Exception:
        return None
    finally:
        for finalizer in counter.storages.values():
            finalizer.detach()  # tensors still alive outlive the count, not its callbacks
    return counter.peak


# ---------------------------------------------------------------------------------------
# The measured step
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranks:
    """How the processes of one step agree: a barrier before each call, the slowest value."""

    barrier: Callable[[], None]
    agree_max: Callable[[float], float]


@dataclass
class Measurement:
    """One measured step: its raw samples and what decided them."""

    timer: str  # how eager samples were taken (cuda-event, perf_counter)
    status: str = "ok"  # ok, or time-limit when a warm call took longer than the limit
    message: str = ""
    times_ms: list[float] = field(default_factory=list)  # eager samples, one call each
    compile_ms: float | None = None  # a compiled kernel's first call
    compile_peak_bytes: int | None = None  # its allocator peak, kept out of the step's
    first_call_ms: float | None = None  # this process's cold first call
    slowest_first_call_ms: float | None = None  # over the ranks (their plan's basis)
    warm_call_ms: float | None = None  # the call the sample plan and the time limit were decided on
    warmup_calls: int | None = None
    warmup_s: float | None = None
    gpu_times_ms: list[float] | None = None  # GPU time per call (one CUDA process)
    cpu_times_ms: list[float] | None = None  # CPU time per timed call (one CPU process), beside its wall time
    gpu_timer: str | None = None
    clocks: dict[str, Any] = field(default_factory=dict)  # the sampler's clock summary of the timed calls
    cpu_tensor_peak_bytes: int | None = None  # one CPU process: tensor bytes a call held at once (tensor_peak_bytes)
    threads: int | None = None  # CPU: torch's intra-op threads the calls ran with
    per_call: list[dict[str, Any]] = field(default_factory=list)  # ``after_call``'s reading of each timed call


def measure_step(
    step: Step,
    policy: TimingPolicy,
    timer: Timer,
    limit_s: float,
    *,
    probe: MemoryProbe | None = None,
    sampler: NvmlSampler | None = None,
    ranks: Ranks | None = None,
    compiles: bool = False,
    gpu_timing: bool = False,
    after_call: Callable[[], dict[str, Any]] | None = None,
    phase: Phase = lambda name, limit_s=None: None,
) -> Measurement:
    """Measure ``step`` (see the module's docstring for the order). ``limit_s`` is the per-call
    limit, ``policy.budget_s`` the timing budget; ``gpu_timing`` adds GPU time (one CUDA
    process); ``after_call`` reads something after each timed call (a ring's compute and
    wait, ranks only). On the CPU every call runs with ``policy.threads`` threads (recorded);
    out-of-memory and other failures raise, as the step raised them."""
    with cpu_threads(None if timer.cuda else policy.threads) as threads:
        m = Measurement(timer=timer.name, threads=None if timer.cuda else threads)
        return _measure(m, step, policy, timer, limit_s, probe, sampler, ranks, compiles, gpu_timing, after_call, phase)


@contextlib.contextmanager
def cpu_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` (None: left as they are), restored after;
    yields the count the calls run with."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _measure(
    m: Measurement,
    step: Step,
    policy: TimingPolicy,
    timer: Timer,
    limit_s: float,
    probe: MemoryProbe | None,
    sampler: NvmlSampler | None,
    ranks: Ranks | None,
    compiles: bool,
    gpu_timing: bool,
    after_call: Callable[[], dict[str, Any]] | None,
    phase: Phase,
) -> Measurement:
    sampler = sampler or NvmlSampler(None)
    sync = ranks.barrier if ranks else lambda: None
    agree = ranks.agree_max if ranks else lambda x: x

    def call() -> float:
        sync()
        return timer(step)

    if compiles:
        phase("compile")
        m.compile_ms = call()
        if probe is not None:
            m.compile_peak_bytes = probe.restart_peak()
    phase("first-call", cold_call_limit_s(limit_s, timer.cuda))
    m.first_call_ms = call()
    m.slowest_first_call_ms = basis = agree(m.first_call_ms)
    if basis > limit_s * 1e3 and not timer.cuda:
        m.status, m.message = "time-limit", f"a call took {basis / 1e3:.1f} s > {limit_s:g} s"
        return m
    if basis > limit_s * 1e3:
        phase("warm-call", limit_s)
        m.warm_call_ms = basis = agree(call())
        if basis > limit_s * 1e3:
            m.status, m.message = "time-limit", f"a warm call took {basis / 1e3:.1f} s > {limit_s:g} s"
            return m
    if ranks is None:
        cap_s = max(policy.budget_s / 2, policy.warmup_seconds(timer.cuda))
        phase("warm-up", cap_s + limit_s)
        warm_calls = (m.warm_call_ms,) if m.warm_call_ms is not None else ()
        if not timer.cuda and m.first_call_ms >= WARM_AFTER_MS:
            warm_calls = (m.first_call_ms,)  # one more call of seconds would warm nothing
        warm = warm_up(step, timer, policy, timer.cuda, sampler.clocks_settled, cap_s, warm_calls)
        # a warm-up of no calls has no time of its own: the warm call taken above, else the first
        basis = warm.last_ms if warm.calls else basis
        m.warm_call_ms, m.warmup_calls, m.warmup_s = basis, warm.calls, round(warm.seconds, 3)
        phase("timing", policy.budget_s + limit_s)
        with sampler.recording():
            m.times_ms = timed_samples(step, timer if timer.cuda else _with_cpu_time(timer, m), basis, policy)
            if gpu_timing and timer.cuda:
                _take_gpu_time(m, step, policy, limit_s, probe, phase)
        if probe is not None and not probe.cuda:
            probe.freeze()  # the resident set's peak is the measured calls', not the count's
            phase("tensor-peak")  # one more call, untimed: the CPU's exact memory count
            m.cpu_tensor_peak_bytes = tensor_peak_bytes(step)
    else:
        warmup, calls = plan_calls(basis, policy)
        phase("timing", policy.budget_s + limit_s)
        for _ in range(warmup):
            sync()
            step()
        m.warmup_calls = warmup
        with sampler.recording():
            for _ in range(calls):
                m.times_ms.append(call())
                if after_call is not None:
                    m.per_call.append(after_call())
            if gpu_timing and timer.cuda:
                _take_gpu_time(m, step, policy, limit_s, probe, phase, ranks)
    m.clocks = sampler.clock_summary()
    return m


def _with_cpu_time(timer: Timer, m: Measurement) -> Callable[[Step], float]:
    """``timer`` that also appends each call's CPU time (the process's, every thread) to
    ``m.cpu_times_ms``: on a CPU shared with other work a call's wall time grows with the
    load, its CPU time barely moves."""
    m.cpu_times_ms = []

    def timed(fn: Step) -> float:
        t0 = time.process_time()
        ms = timer(fn)
        m.cpu_times_ms.append((time.process_time() - t0) * 1e3)
        return ms

    return timed


def _take_gpu_time(
    m: Measurement, step: Step, policy: TimingPolicy, limit_s: float, probe, phase: Phase, ranks: Ranks | None = None
) -> None:
    median = statistics.median(m.times_ms) if m.times_ms else 0.0
    if (ranks.agree_max(median) if ranks else median) >= GPU_TIME_BELOW_MS:
        m.gpu_timer = f"not taken: calls of {GPU_TIME_BELOW_MS / 1e3:g} s or more are their own GPU time"
        return
    if probe is not None:
        probe.freeze()  # CUDA-graph pools and the flush buffer stay out of the measured peak
    phase("gpu-timing", policy.budget_s + limit_s)
    gpu = gpu_time(step, m.times_ms, policy.budget_s, ranks)
    m.gpu_times_ms, m.gpu_timer = gpu["gpu_times_ms"], gpu["gpu_timer"]
