"""Units: parsing what the command line gives (sizes, lengths, lists), and every formatting
of a number for people (times, bytes, tokens, ratios, sparsity), so each reads the same in
the report, the check and the console."""

from __future__ import annotations

import math
import re

from attnbench.errors import AttnbenchError

# A size names its unit: decimal (KB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB), or B for
# bytes. A bare number or a bare K/M/G/T is refused: "80" read as 80 bytes and "256M" read
# as 256,000,000 bytes are both what a user did not mean.
_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
SIZE_FORMS = "e.g. 2GiB, 512MiB, 80GB or 1048576B (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
_TOKEN_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}
# How a length (or another count) may be written: digits, or K, M, G in binary multiples.
TOKEN_FORMS = "a whole number, as digits or with K, M or G (binary: 16K = 16,384)"
# The longest sequence any row or option may name: q, k, v and the output of one head of
# dimension one, a byte each, at 2^40 tokens hold 4 TiB, more than a node's GPUs hold. A
# longer length is a typing error on the command line and a corrupt row in a file.
MAX_TOKENS = 2**40
# How much of a bad value an error message echoes: enough to recognise it, never a whole file.
ECHO_CHARS = 60


def parse_bytes(text: str | int) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, '4096B' -> 4096; a size must name its unit
    and come to at least one byte."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)  # a TOML integer: a number without a unit
    match = re.fullmatch(r"\s*(-?)\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text) if isinstance(text, str) else None
    if not match:
        raise AttnbenchError(f"cannot read memory size {brief(text)}: write {SIZE_FORMS}")
    if match.group(1) and float(match.group(2)) > 0:
        raise AttnbenchError(f"memory size {brief(text)} is negative: a size must be positive, {SIZE_FORMS}")
    unit = match.group(3).lower()
    if unit not in _BYTE_UNITS:
        what = "has no unit" if not unit else f"has an unknown or ambiguous unit {match.group(3)!r}"
        raise AttnbenchError(f"memory size {brief(text)} {what}: write {SIZE_FORMS}")
    size = int(float(match.group(2)) * _BYTE_UNITS[unit])
    if size < 1:
        raise AttnbenchError(f"memory size {brief(text)} is less than one byte: write {SIZE_FORMS}")
    return size


def parse_tokens(text: str | int) -> int:
    """'64K' -> 65536, '1M' -> 1048576 (binary multiples, as sequence lengths are); at most
    MAX_TOKENS."""
    n = _tokens(text)
    if n is None:
        raise AttnbenchError(f"cannot read sequence length {brief(text)}: write {TOKEN_FORMS}, e.g. 4096, 16K or 1M")
    if n > MAX_TOKENS:
        raise AttnbenchError(
            f"sequence length {brief(text)} is beyond {MAX_TOKENS:,} tokens (2^40), more than any device holds: "
            "write e.g. 4096, 64K or 1M"
        )
    return n


def _tokens(text: object) -> int | None:
    """The length ``text`` writes, or None where it writes none."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = re.fullmatch(r"\s*([0-9]+)\s*([kKmMgG]?)\s*", text) if isinstance(text, str) else None
    return int(match.group(1)) * _TOKEN_UNITS[match.group(2).lower()] if match else None


def brief(value: object) -> str:
    """``repr(value)``, cut to its first ECHO_CHARS characters: what an error echoes of a bad value."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}... ({len(text):,} characters)"


def parse_int_list(text: str | list[int], what: str) -> list[int]:
    """'2048,4096' -> [2048, 4096]."""
    if isinstance(text, (list, tuple)):
        return [int(x) for x in text]
    parts = [part for part in str(text).split(",") if part.strip()]
    if any(_tokens(part) is None for part in parts):
        raise AttnbenchError(
            f"cannot read {what} {brief(text)}: write comma-separated values, each {TOKEN_FORMS}, e.g. 4096,16K,1M"
        )
    return [parse_tokens(part) for part in parts]


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


# Memory is shown in binary units, as limits are written and devices sized: one scale per size.
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def _binary_unit(n: float) -> tuple[str, int]:
    return next(((unit, size) for unit, size in _BINARY if abs(n) >= size), ("B", 1))


def format_bytes(n: float | None) -> str:
    """Memory to three significant digits in the unit its size calls for: 42.4 B, 16.4 MiB,
    1.07 GiB (never 0.00 GB, never a fraction of a larger unit)."""
    if n is None or n != n:
        return "-"
    if n == 0:
        return "0 B"
    unit, size = _binary_unit(n)
    x = n / size
    return f"{x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f} {unit}"


def format_gib(n: float) -> str:
    """A limit as a profile writes it: 4294967296 -> '4 GiB', 104857600 -> '100 MiB', 1024 -> '1 KiB'."""
    unit, size = _binary_unit(n)
    return f"{n / size:.4g} {unit}"


def short_tokens(n: int, exact: bool = False, decimals: int = 1) -> str:
    """65536 -> '64K', 1572864 -> '1.5M', 2**31 -> '2G' (binary multiples, ``decimals`` decimals
    where the multiple is not whole). ``exact``: only where the short form is the exact length (to
    1/8 K, M or G, '2.875M'), else the digits."""
    for suffix, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size:
            short = n / size
            if exact:
                if n % (size // 8) == 0:
                    return f"{short:g}{suffix}"
                continue
            return (f"{short:.0f}" if short == int(short) else f"{short:.{decimals}f}") + suffix
    return str(n)


def format_tokens(n: int, decimals: int = 1) -> str:
    """65536 -> '65,536 (64K)', 33554432 -> '33,554,432 (32M)'."""
    return f"{n:,} ({short_tokens(n, decimals=decimals)})" if n >= 2**10 else f"{n:,}"


# Most decimals a short length gets to tell it from another: 1.875M from 1.898M takes two.
MAX_SHORT_DECIMALS = 3


def _distinct_decimals(a: int, b: int) -> int | None:
    """The fewest decimals (from one) at which the short forms of lengths ``a`` and ``b`` read
    as different numbers where the lengths differ (1.875M and 1.898M: two, '1.88M' and
    '1.90M', never '1.9M' twice); None where three do not tell them apart."""
    for decimals in range(1, MAX_SHORT_DECIMALS + 1):
        if a == b or _read_short(short_tokens(a, decimals=decimals)) != _read_short(short_tokens(b, decimals=decimals)):
            return decimals
    return None


def token_pair(a: int, b: int, fmt=format_tokens) -> tuple[str, str]:
    """Two lengths by ``fmt`` (short_tokens or format_tokens) with their ``_distinct_decimals``:
    a search's answer and its first failure. Lengths closer than three decimals tell apart are
    written in digits alone."""
    decimals = _distinct_decimals(a, b)
    if decimals is None:
        return f"{a:,}", f"{b:,}"
    return fmt(a, decimals=decimals), fmt(b, decimals=decimals)


def _read_short(text: str) -> tuple[float, str]:
    """A short length as its reader takes it: '2.0M' and '2M' are one number, 2 M."""
    number, suffix = (text[:-1], text[-1]) if text[-1] in "KMG" else (text, "")
    return float(number), suffix


def format_ms(t: float | None, adaptive: bool = False, space: bool = True) -> str:
    """Milliseconds: two decimals ('1,234.57 ms'), or ``adaptive``, more decimals for
    shorter times ('1,234.5', '12.34', '1.234'), for a column that mixes kernels of
    microseconds with steps of seconds. '-' for no time."""
    if t is None:
        return "-"
    unit = " ms" if space else "ms"
    if not adaptive:
        return f"{t:,.2f}{unit}"
    return (f"{t:,.1f}" if t >= 100 else f"{t:.2f}" if t >= 10 else f"{t:.3f}") + unit


def format_bytes_per_token(n: float) -> str:
    return f"{format_bytes(n)}/token"


def format_tokens_per_s(x: float) -> str:
    return f"{x:,.0f} tok/s"


def flop_unit(tflops: float) -> tuple[str, float]:
    """The unit a rate of ``tflops`` (or a plot whose highest rate it is) reads in, and the
    factor from TFLOP/s to it: GFLOP/s under one TFLOP/s (a CPU's rates read as 0.1 TFLOP/s
    otherwise), else TFLOP/s."""
    return ("GFLOP/s", 1e3) if tflops < 1 else ("TFLOP/s", 1.0)


def flop_rate(tflops: float) -> str:
    """'85.3 GFLOP/s' under one TFLOP/s, else '312.4 TFLOP/s' (``flop_unit``)."""
    unit, factor = flop_unit(tflops)
    return f"{tflops * factor:.1f} {unit}"


def rate_per_device(tflops: float, devices: int = 1) -> str:
    """A rate as one device's, so it reads against one GPU's peak: a call spread over several
    devices gives its total divided by them, and names the total as a total."""
    if devices <= 1:
        return flop_rate(tflops)
    return f"{flop_rate(tflops / devices)} per GPU ({flop_rate(tflops)} in all on {devices})"


def format_ratio(x: float | None, decimals: int = 2) -> str:
    """A ratio of two times, memories or lengths: '1.85x'; '-' for none."""
    return "-" if x is None else f"{x:.{decimals}f}x"


def format_sparsity(kept: float | None, causal: bool = False) -> str:
    """The share of query-key pairs an attention mask skips, from the share it keeps:
    'Dense', or '99.3% sparse' with enough decimals that the kept share shows two
    significant digits (99.93%, not 100.0%). Causal: the mask's own half is not counted."""
    if kept is None:
        return "-"
    full = 0.5 if causal else 1.0  # a causal mask keeps about half of all pairs by itself
    if kept >= full * 0.999:
        return "Dense"
    kept_pct = kept / full * 100
    decimals = max(1, 1 - math.floor(math.log10(kept_pct))) if kept_pct > 0 else 1
    return f"{100 - kept_pct:.{decimals}f}% sparse"


def clip_text(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut after a sentence where one ends in the
    second half, else at a word, never inside one ("CUDA out of memory. Tried to allocate
    2.00 GiB. ..." keeps its sentences whole)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    sentence = head.rfind(". ")
    if sentence >= limit // 2:
        return head[: sentence + 1] + " …"
    word = head.rfind(" ")
    return (head[:word] if word > 0 else head).rstrip(" ,;:") + "…"
