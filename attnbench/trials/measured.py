"""A trial's measured part (``schema.Measured``) from what the measurement core read: the
measured step, the memory peaks, the FLOP accounting. A trial in one process and each rank of
a sequence-parallel trial fill it the same way, so their rows mean the same thing."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from attnbench.measure.accounting import Pairs, accounting, pairs_of
from attnbench.measure.stats import Interval, scaled
from attnbench.results.schema import Measured

if TYPE_CHECKING:
    from attnbench.trials.placed import RankResult

# What a row stores of a Measurement as it is (its clock summary is read apart, and the
# slowest first call and per-call readings are the step's own business).
MEASUREMENT_FIELDS = (
    "status",
    "message",
    "timer",
    "times_ms",
    "compile_ms",
    "compile_peak_bytes",
    "first_call_ms",
    "warm_call_ms",
    "warmup_calls",
    "warmup_s",
    "gpu_times_ms",
    "gpu_timer",
    "cpu_tensor_peak_bytes",
    "threads",
    "cpu_times_ms",
)


# What a trial alone keeps of its one rank's result beside the measurement's fields: its
# inputs, the kernel it ran, its peaks and why NVML is missing where it is.
RANK_FIELDS = (
    "clocks",
    "clocks_moved",
    "inputs_bytes",
    "backend",
    "kv_layout",
    "nvml_note",
    "max_memory_allocated",
    "max_memory_reserved",
    "device_total_bytes",
    "cpu_peak_rss",
    "cpu_peak_rss_delta",
)


def take_rank(m: Measured, rank: RankResult) -> None:
    """A trial's measured part from its one rank's result: the step's samples, what decided
    them, their statistics and the memory it reached."""
    for name in MEASUREMENT_FIELDS + RANK_FIELDS:
        if getattr(rank, name) is not None:
            setattr(m, name, getattr(rank, name))
    m.message = m.message or ""
    m.summarize()


def take_accounting(m: Measured, impl, wl) -> None:
    """FLOPs useful and executed, the kept fraction and the throughput of the median call, from
    pairs the implementation gives at once (closed forms, its own declarations). Pairs counted
    from declared key sets are counted after the measurement (``trials.counting``)."""
    from attnbench.masks.bounds import CountRefused

    if not impl.counted_pairs:
        try:
            pairs = pairs_of(impl, wl.seq_len, wl.heads, wl.causal)
        except CountRefused as exc:  # the measurement stands, its FLOPs unknown and why
            pairs = Pairs.not_known(str(exc))
        take_pairs(m, pairs, wl)


def take_pairs(m: Measured, pairs: Pairs, wl) -> None:
    """The accounting of ``pairs`` on ``wl`` at the row's median time, and its interval: every
    field of it set (a count that replaces an unknown one clears the reason)."""
    for name, value in asdict(accounting(pairs, wl, m.time_ms)).items():
        setattr(m, name, value)
    take_tflops_interval(m)


def take_tflops_interval(m: Measured) -> None:
    """Executed TFLOP/s over the eager time's interval (the bounds swap: slower is fewer)."""
    if m.time_ci_low is None or m.time_ci_high is None or not m.flops_executed or not m.time_ms:
        return
    time = Interval(m.time_ms, m.time_ci_low, m.time_ci_high, m.time_n or 0)
    iv = scaled(time, m.flops_executed / 1e9)  # FLOPs / ms / 1e9 = TFLOP/s
    if iv:
        m.tflops_executed_ci_low, m.tflops_executed_ci_high = iv.low, iv.high


def set_peak(m: Measured, cuda: bool, floor_bytes: int, over: str = "") -> None:
    """The peak a trial is judged by against its memory floor: the allocator's on a GPU, the
    resident set's growth on the CPU (``over``: how several ranks' peaks were combined)."""
    m.floor_bytes = floor_bytes
    m.peak_bytes = m.max_memory_allocated if cuda else m.cpu_peak_rss_delta
    m.peak_counter = ("cuda.max_memory_allocated" if cuda else "cpu.peak_rss_delta") + over
    m.peak_over_floor = m.peak_bytes / floor_bytes if m.peak_bytes else None
