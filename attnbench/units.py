"""Parsing and formatting of sizes, lengths and lists given on the command line."""

from __future__ import annotations

import re

from attnbench.errors import AttnbenchError

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_TOKEN_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def parse_bytes(text: str | int) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, plain integers are bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _BYTE_UNITS:
        raise AttnbenchError(f"cannot read memory size {text!r}: write e.g. 2GiB, 512MiB or 8GB")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


def parse_tokens(text: str | int) -> int:
    """'64K' -> 65536, '1M' -> 1048576 (binary multiples, as sequence lengths are)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]+)\s*([kKmMgG]?)\s*", str(text))
    if not match:
        raise AttnbenchError(f"cannot read sequence length {text!r}: write e.g. 4096, 64K or 1M")
    return int(match.group(1)) * _TOKEN_UNITS[match.group(2).lower()]


def parse_int_list(text: str | list[int], what: str) -> list[int]:
    """'2048,4096' -> [2048, 4096]."""
    if isinstance(text, (list, tuple)):
        return [int(x) for x in text]
    try:
        return [parse_tokens(part) for part in str(text).split(",") if part.strip()]
    except AttnbenchError:
        raise AttnbenchError(f"cannot read {what} {text!r}: write comma-separated integers, e.g. 2048,4096") from None


def parse_gpus(value) -> tuple[int, ...]:
    """``2`` -> (1, 2): P ranks and the one-GPU baseline in the same run; ``1,2,4`` as given."""
    if isinstance(value, bool):
        raise ValueError("a number of GPUs or a list")
    counts = [value] if isinstance(value, int) else parse_int_list(value, "gpus")
    if not counts or any(c < 1 for c in counts):
        raise ValueError("positive numbers of GPUs, e.g. 2 or 1,2,4")
    if len(counts) == 1 and counts[0] > 1:
        counts = [1, counts[0]]
    return tuple(sorted(set(counts)))


def format_bytes(n: float | None, unit: str = "auto") -> str:
    """Decimal units, as the seed reports' 'GB' and 'MB' columns."""
    if n is None or n != n:
        return "-"
    if unit == "auto":
        unit = "GB" if abs(n) >= 1e9 else "MB"
    scale = {"GB": 1e9, "MB": 1e6, "KB": 1e3}[unit]
    return f"{n / scale:,.2f} {unit}"


def format_tokens(n: int) -> str:
    """65536 -> '65,536 (64K)', 33554432 -> '33,554,432 (32M)'."""
    for suffix, size in (("M", 2**20), ("K", 2**10)):
        if n >= size:
            short = n / size
            text = f"{short:.0f}" if short == int(short) else f"{short:.1f}"
            return f"{n:,} ({text}{suffix})"
    return f"{n:,}"
