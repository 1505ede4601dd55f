"""What no measurement can give: a row read from a file is refused when it nests deeper than
a row does, or holds a number that is not finite, a time, size or count below zero, a
sequence length beyond any device (``units.MAX_TOKENS``), a memory peak beyond the device
that held it, or, for a trial that ran, inputs beyond that device. The reader
(``results.read``) applies this to every row after the schema has accepted it, so report,
check, predict and resume judge by the same rule; a writer never produces such a row."""

from __future__ import annotations

import math
from typing import Any

from attnbench.results.schema import SchemaError
from attnbench.units import MAX_TOKENS

# A row nests a few levels (row > ranks > entry > gpus > entry); a line nested deeper is not one.
MAX_DEPTH = 16
# Quantities that are never negative, wherever they appear in a row (its ranks and GPUs too).
NOT_NEGATIVE = frozenset(
    {
        "batch",
        "seq_len",
        "heads",
        "head_dim",
        "world_size",
        "time_ms",
        "time_iqr_ms",
        "time_min_ms",
        "time_max_ms",
        "time_ci_low",
        "time_ci_high",
        "time_n",
        "first_call_ms",
        "warm_call_ms",
        "gpu_time_ms",
        "gpu_time_ci_low",
        "gpu_time_ci_high",
        "gpu_time_n",
        "compile_ms",
        "duration_s",
        "warmup_s",
        "tokens_per_s",
        "inputs_bytes",
        "floor_bytes",
        "peak_bytes",
        "max_memory_allocated",
        "max_memory_reserved",
        "nvml_used_before",
        "nvml_used_peak",
        "cpu_peak_rss",
        "cpu_peak_rss_delta",
        "cpu_tensor_peak_bytes",
        "compile_peak_bytes",
        "device_total_bytes",
        "memory_total_bytes",
        "memory_limit",
        "sent_bytes",
        "flops_useful",
        "flops_executed",
        "tflops_useful",
        "tflops_executed",
        "tflops_executed_ci_low",
        "tflops_executed_ci_high",
        "rel_err",
        "peak_over_floor",
        "kept_fraction",
    }
)
# Lists of timed samples: each one a duration.
SAMPLE_LISTS = frozenset({"times_ms", "gpu_times_ms", "cpu_times_ms"})
# Sequence lengths (a trial's, a search's answer and bounds): never beyond MAX_TOKENS.
LENGTHS = frozenset({"seq_len", "first_failure", "max_seq_len", "start", "resolution", "margin", "predicted_max_seq"})
# Measured memory: never more than the device holds (the largest total the row records).
PEAKS = (
    "peak_bytes",
    "max_memory_allocated",
    "max_memory_reserved",
    "compile_peak_bytes",
    "nvml_used_peak",
    "cpu_tensor_peak_bytes",
)
# Where a row records no device total: no single device holds a pebibyte.
MAX_DEVICE_BYTES = 2**50


def nesting_depth(value: Any) -> int:
    """How deep JSON ``value`` nests (a scalar is 0), without recursion."""
    depth, level = 0, [value] if type(value) in (dict, list) else []
    while level:  # one level at a time: the containers inside this level's
        depth += 1
        level = [x for v in level for x in (v.values() if type(v) is dict else v) if type(x) in (dict, list)]
    return depth


def check_possible(d: dict[str, Any], rest: dict[str, Any] | None = None) -> None:
    """A SchemaError naming the first field of a valid row ``d`` that no measurement can give:
    a number that is not finite (NaN, infinity), a time, size or count below zero, a memory
    peak beyond the device. ``rest``: the part of ``d`` whose numbers are still to check (an
    environment read before passed already)."""
    rest = d if rest is None else rest
    if _any_impossible_number(rest):
        _name_impossible_number(rest)
    _check_peaks(d)


# keys whose numbers have a rule beyond being finite
_RULED = NOT_NEGATIVE | SAMPLE_LISTS | LENGTHS


def _any_impossible_number(d: dict[str, Any]) -> bool:
    """Whether any number in ``d`` breaks a rule of ``_name_impossible_number``: the same rules,
    walked without naming where (every row a reader reads is walked; few have a problem)."""
    stack: list[tuple[Any, Any]] = [(k, v) for k, v in d.items() if type(v) is not str]
    while stack:
        key, value = stack.pop()
        kind = type(value)
        if kind is dict:
            stack.extend((k, v) for k, v in value.items() if type(v) is not str)
        elif kind is list:
            if _numbers_break(key, value):
                return True
            for v in value:  # a list's items are its key's
                t = type(v)
                if t is dict or t is list:
                    stack.append((key, v))
        elif kind is float or kind is int:
            if not math.isfinite(value) or (key in _RULED and _breaks(key, value)):
                return True
    return False


def _numbers_break(key: Any, values: list[Any]) -> bool:
    """Whether a number of ``values`` (a list under ``key``; items that are not numbers are
    walked apart) breaks a rule. A list of numbers alone, as a row's samples are, is judged by
    its sum, least and greatest, one call each: a finite sum means every number is finite; a
    sum that is not (a NaN, an infinity, or finite numbers overflowing) is judged number by number."""
    ruled = key in _RULED
    try:
        total = sum(values)
    except TypeError:  # not numbers alone
        pass
    else:
        if math.isfinite(total):
            return bool(values) and ruled and (_breaks(key, min(values)) or _breaks(key, max(values)))
    for v in values:
        t = type(v)
        if (t is float or t is int) and (not math.isfinite(v) or (ruled and _breaks(key, v))):
            return True
    return False


def _breaks(key: Any, value: float) -> bool:
    return (value < 0 and (key in NOT_NEGATIVE or key in SAMPLE_LISTS)) or (key in LENGTHS and value > MAX_TOKENS)


def _name_impossible_number(d: dict[str, Any]) -> None:
    """The SchemaError naming the first impossible number of ``d`` (none where there is none)."""
    stack: list[tuple[Any, str, str | None]] = [(v, repr(k), k) for k, v in d.items()]
    while stack:
        value, where, key = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{where}[{k!r}]", k) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", key) for i, v in enumerate(value))  # a list's items are its key's
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise SchemaError(f"field {where} is {value}: not a measurement")
            if value < 0 and (key in NOT_NEGATIVE or key in SAMPLE_LISTS):
                raise SchemaError(f"field {where} is {value}: it is never negative")
            if key in LENGTHS and value > MAX_TOKENS:
                raise SchemaError(f"field {where} is {value:.3g} tokens, beyond any device's {MAX_TOKENS:.3g}")


def _check_peaks(d: dict[str, Any]) -> None:
    totals = [d.get("device_total_bytes")] + [
        g.get("memory_total_bytes") for g in (d.get("env") or {}).get("gpus") or []
    ]
    totals = [t for t in totals if isinstance(t, int) and t > 0]
    limit = max(totals, default=MAX_DEVICE_BYTES)
    floor = d.get("floor_bytes")
    if d.get("status") == "ok" and isinstance(floor, (int, float)) and floor > limit:
        raise SchemaError(
            f"field 'floor_bytes' is {floor:.3g} bytes of q, k, v and the output, beyond the device's {limit:.3g}, "
            "in a trial that ran: not a measurement"
        )
    entries = [("", d)] + [(f"'gpus'[{i}]", g) for i, g in enumerate(d.get("gpus") or []) if isinstance(g, dict)]
    for where, entry in entries:
        for key in PEAKS:
            peak = entry.get(key)
            if isinstance(peak, (int, float)) and peak > limit:
                field_name = f"{where}[{key!r}]" if where else repr(key)
                raise SchemaError(
                    f"field {field_name} is {peak:.3g} bytes, beyond the device's {limit:.3g}: not a measurement"
                )
